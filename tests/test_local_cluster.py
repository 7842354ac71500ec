"""The LocalCluster launcher: real etcd + real bookie-server processes, fault
injection (kill, SIGSTOP, etcd restart) and the fixtures' heal() between tests."""
from __future__ import annotations

import json
import time

import pytest

from pybk_spark.metadata import open_store
from pybk_spark.cluster import procs
from pybk_spark.cluster.local import LocalCluster
from pybk_spark.testing.fixtures import bookie_server_available

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(not bookie_server_available(),
                                 reason="bookie_server is not available yet")]

HANG_GUARD = 60.0


def poll_until(predicate, what):
    deadline = time.monotonic() + HANG_GUARD
    while not predicate():
        if time.monotonic() > deadline:
            pytest.fail(f"gave up waiting for {what}")
        time.sleep(0.05)


def registration(store, bookie_id):
    got = store.get(f"bookies/writable/{bookie_id}") or store.get(f"bookies/readonly/{bookie_id}")
    return None if got is None else json.loads(got.value)


def proc_state(pid):
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rsplit(")", 1)[1].split()[0]


def test_cluster_registers_every_bookie(cluster):
    store = open_store(cluster.metadata_uri)
    try:
        # other tests may have added bookies to the shared cluster
        assert cluster.bookie_ids[:3] == ["bookie-0", "bookie-1", "bookie-2"]
        for bid in cluster.bookie_ids:
            reg = registration(store, bid)
            assert reg["bookie_id"] == bid
            assert reg["address"] == cluster.bookie_address(bid)
            assert reg["rack"] == "/default-rack" and reg["state"] == "writable"
    finally:
        store.close()


def test_kill_and_restart_bookie_keeps_its_address(cluster):
    store = open_store(cluster.metadata_uri)
    try:
        address = cluster.bookie_address("bookie-1")
        pid = cluster.bookie_pid("bookie-1")
        cluster.kill_bookie("bookie-1")
        assert not procs.pid_alive(pid) and cluster.bookie_pid("bookie-1") is None
        poll_until(lambda: registration(store, "bookie-1") is None, "lease expiry of a dead bookie")
        cluster.start_bookie("bookie-1")
        assert registration(store, "bookie-1")["address"] == address
        assert cluster.bookie_pid("bookie-1") not in (None, pid)
    finally:
        store.close()


def test_sigstop_and_resume(cluster):
    pid = cluster.bookie_pid("bookie-2")
    cluster.stop_bookie("bookie-2")
    poll_until(lambda: proc_state(pid) == "T", "SIGSTOP to take effect")
    cluster.resume_bookie("bookie-2")
    poll_until(lambda: proc_state(pid) != "T", "SIGCONT to take effect")


def test_heal_restarts_what_a_test_broke(cluster):
    cluster.kill_bookie("bookie-0")
    cluster.stop_bookie("bookie-2")
    healed = cluster.heal()
    assert set(healed) == {"bookie-0", "bookie-2"}
    assert all(cluster.bookie_pid(b) for b in cluster.bookie_ids)
    assert cluster.heal() == []


def test_private_cluster_add_bookie_restart_etcd_and_restart_on_same_dir(tmp_path):
    data = tmp_path / "c"
    with LocalCluster(data, num_bookies=1) as c:
        uri = c.metadata_uri
        assert c.add_bookie() == "bookie-1"
        store = open_store(uri)
        try:
            store.put_if_absent("ledgers/00000000000000000007", b"md")
            c.restart_etcd()
            # the bookies' leases and our data survive; registrations still present
            poll_until(lambda: _quiet(lambda: registration(store, "bookie-1")) is not None,
                       "registration after etcd restart")
            assert store.get("ledgers/00000000000000000007").value == b"md"
        finally:
            store.close()
        pids = c.pids()
        assert len(pids) == 3
    poll_until(lambda: not any(procs.pid_alive(p) for p in pids), "cluster processes to exit")

    with LocalCluster(data, num_bookies=1) as again:      # remembered: 2 bookies, same URI
        assert again.metadata_uri == uri
        assert again.bookie_ids == ["bookie-0", "bookie-1"]
        store = open_store(uri)
        try:
            assert store.get("ledgers/00000000000000000007").value == b"md"
        finally:
            store.close()


def _quiet(fn):
    from pybk_spark import errors
    try:
        return fn()
    except errors.MetadataUnavailable:
        return None
