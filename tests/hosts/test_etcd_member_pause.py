"""A hung etcd member (SIGSTOP: its connections stay open, nothing answers)
must not unregister a healthy bookie.

Three etcd members on hosts etcd-1..3, three bookies on bookie-1..3.  Each
member in turn (the leader at that moment first, so the leader is always
among them) is paused for ``PAUSE_S`` seconds and resumed.  Meanwhile a
watcher in the test process, connected to all three members, reads
``bookies/`` (one linearizable range read) over and over: every answer must
list every bookie.  At the end each registration key must still be the one
created at the start (same ``create_revision``: never deleted and recreated
in between, even between two reads), and no bookie logged a lost lease.
"""
from __future__ import annotations

import base64
import json
import os
import signal
import threading
import time
import urllib.request

import pytest

from pybk_spark import errors
from pybk_spark.metadata import keys
from pybk_spark.metadata.etcd_store import EtcdMetadataStore

from tests.hosts.conftest import need_hosts

pytestmark = pytest.mark.slow

PAUSE_S = 10.0
_NO_PROXY = urllib.request.build_opener(urllib.request.ProxyHandler({}))


@pytest.fixture(scope="module")
def pause_cluster(tmp_path_factory):
    need_hosts(etcd=True, bookies=True)
    from pybk_spark.cluster.host_cluster import HostCluster
    c = HostCluster(tmp_path_factory.mktemp("pause"),
                    bookie_conf={"journal_prealloc_bytes": 4 << 20})
    try:
        c.start()
        yield c
    finally:
        for m in (c.etcd.members if c.etcd is not None else []):
            if m.running():
                os.kill(m.pid, signal.SIGCONT)
        c.close()


class Watcher:
    """Reads ``bookies/`` in a loop; records ``(t, ids)`` per answer."""

    def __init__(self, cluster):
        # a short RPC timeout: a read stuck on the paused member moves on soon,
        # so the watch keeps sampling through the pause
        self.store = EtcdMetadataStore(",".join(cluster.etcd.endpoints), cluster.scope,
                                       timeout=1.0, read_retry=5.0)
        self.samples: list[tuple[float, frozenset]] = []
        self.failed_reads = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                listing = self.store.list_prefix(keys.BOOKIES_PREFIX + "writable/")
            except errors.MetadataUnavailable:
                self.failed_reads += 1
                continue
            ids = frozenset(k.rsplit("/", 1)[-1] for k, _ in listing)
            self.samples.append((time.monotonic(), ids))
            self._stop.wait(0.05)

    def __enter__(self) -> "Watcher":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(30)
        self.store.close()


def _gaps(samples, bookies: frozenset, t0: float) -> list[tuple[str, float, float]]:
    """Each run of answers in which a bookie was missing: (id, first, last)."""
    out, open_at = [], {}
    for t, ids in samples:
        for b in bookies:
            if b not in ids:
                open_at.setdefault(b, [t, t])[1] = t
            elif b in open_at:
                first, last = open_at.pop(b)
                out.append((b, round(first - t0, 2), round(last - t0, 2)))
    out += [(b, round(f - t0, 2), round(last - t0, 2)) for b, (f, last) in open_at.items()]
    return sorted(out, key=lambda g: g[1])


def _create_revisions(cluster) -> dict[str, int]:
    """Each bookie's registration key's create_revision, read through a live
    member's HTTP gateway (the store's port does not expose it)."""
    out = {}
    member = next(m for m in cluster.etcd.members if m.healthy())
    for bid in cluster.bookie_ids:
        key = f"/{cluster.scope}/{keys.bookie_key('writable', bid)}".encode()
        req = urllib.request.Request(
            member.client_url + "/v3/kv/range",
            data=json.dumps({"key": base64.b64encode(key).decode()}).encode(),
            headers={"Content-Type": "application/json"})
        with _NO_PROXY.open(req, timeout=5.0) as resp:
            kvs = json.loads(resp.read().decode()).get("kvs", [])
        out[bid] = int(kvs[0]["create_revision"]) if kvs else 0
    return out


def _lost_lease_lines(cluster) -> list[str]:
    out = []
    for b in cluster.bookies.values():
        text = b.log_path.read_text(errors="replace") if b.log_path.exists() else ""
        out += [f"{b.bookie_id}: {line}" for line in text.splitlines()
                if "event=reregistered" in line or "event=registration_taken" in line]
    return out


def test_each_etcd_member_paused_in_turn_never_unregisters_a_bookie(pause_cluster):
    cluster = pause_cluster
    bookies = frozenset(cluster.bookie_ids)
    leader = cluster.etcd.leader()
    order = [leader] + [m for m in cluster.etcd.members if m is not leader]
    before = _create_revisions(cluster)
    assert all(before.values()), before
    pauses = []
    with Watcher(cluster) as watch:
        for member in order:
            cluster.etcd.wait_healthy(timeout=60)
            start = time.monotonic()
            os.kill(member.pid, signal.SIGSTOP)
            try:
                time.sleep(PAUSE_S)              # the fault itself: a member hung this long
            finally:
                os.kill(member.pid, signal.SIGCONT)
            pauses.append((member.endpoint, start, time.monotonic()))
        cluster.etcd.wait_healthy(timeout=60)
    gaps = _gaps(watch.samples, bookies, pauses[0][1])
    assert not gaps, f"bookies absent (id, from s, to s since the first pause): {gaps}"
    for endpoint, start, end in pauses:
        seen = [t for t, _ in watch.samples if start <= t <= end]
        assert seen, f"no answer from etcd while {endpoint} was paused: nothing was watched"
    assert _create_revisions(cluster) == before
    assert not _lost_lease_lines(cluster)
