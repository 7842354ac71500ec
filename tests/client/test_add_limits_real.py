"""Add-path errors against real etcd + real bookie-server processes.

* An oversized entry (or an add_entries call holding one) is refused with
  TooLarge before it gets an id; the handle stays usable and the ensemble is
  unchanged (3 bookies: the shared cluster; 4 bookies: this module's own).
* add_entries cuts a batch larger than the bookies' max_batch_bytes into
  several requests.
* A bookie whose real limit is below the one it advertised when the ledger
  was created: the add fails with TooLarge, no healthy bookie is replaced.
* Overload: several writers flood bookies with small admission bounds; the
  bookies answer TooManyRequests, the clients back off and retry, every
  acknowledged entry reads back, no ensemble change, and the write cache /
  RSS stay under the bound.
No timing thresholds: waits are on futures and registrations."""
from __future__ import annotations

import os
import re
import signal
import threading
import urllib.request

import pytest

from pybk_spark import errors
from pybk_spark import BookKeeper
from pybk_spark.ledger.placement import writable_bookies
from pybk_spark.protocol import ledger_metadata as lm
from pybk_spark.testing.fixtures import bookie_server_available

KiB, MiB = 1 << 10, 1 << 20
SMALL = {"max_entry_bytes": 256 * KiB, "max_batch_bytes": 1 * MiB,
         "max_adds_in_progress": 4, "max_add_memory_bytes": 2 * MiB,
         "write_cache_max_bytes": 512 * KiB, "flush_interval_s": 1.0}


def _bk(uri, **conf):
    base = {"explicit_lac_interval_ms": 0}
    base.update(conf)
    return BookKeeper(uri, conf=base)


@pytest.fixture(scope="module")
def small_cluster(tmp_path_factory):
    """4 bookies with small size and admission limits (``SMALL``)."""
    if not bookie_server_available():
        pytest.skip("bookie_server is not available")
    from pybk_spark.cluster.local import LocalCluster
    local = LocalCluster(tmp_path_factory.mktemp("small"), num_bookies=4,
                         bookie_conf=dict(SMALL))
    try:
        local.start()
        yield local
    finally:
        local.stop()


def _metric(store, bookie_id: str, name: str) -> float:
    port = writable_bookies(store)[bookie_id]["metrics_port"]
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=30).read().decode()
    total = 0.0
    for m in re.finditer(rf"^{name}(?:{{[^}}]*}})? (\S+)$", text, re.M):
        total += float(m.group(1))
    return total


def _oversized_add_leaves_handle_usable(bk, lh, big: int):
    ensemble = lh.metadata.current_ensemble
    assert lh.add_entry(b"x") == 0
    with pytest.raises(errors.TooLarge) as info:
        lh.add_entry(os.urandom(big))
    assert "max_entry_size_bytes" in str(info.value)
    with pytest.raises(errors.TooLarge):
        lh.add_entry_async(b"z" * big).result()
    with pytest.raises(errors.TooLarge):                  # a batch holding one: nothing sent
        lh.add_entries([b"a", b"z" * big, b"b"])
    assert lh.add_entry(b"y") == 1                        # no id was consumed
    assert lh.add_entries([b"c", b"d"]) == [2, 3]
    lh.close()
    md = bk.get_ledger_metadata(lh.ledger_id)
    assert md.state == lm.CLOSED and md.last_entry_id == 3
    assert [first for first, _ in md.ensembles] == [0] and md.current_ensemble == ensemble
    got = bk.open_ledger(lh.ledger_id).read(0, 3)
    assert [e.payload for e in got] == [b"x", b"y", b"c", b"d"]


def test_oversized_entry_3_bookies(cluster):
    """64 MiB into a (3, 3, 2) ledger: refused, the handle stays usable."""
    bk = _bk(cluster.metadata_uri)
    try:
        lh = bk.create_ledger(ensemble=3, write_quorum=3, ack_quorum=2)
        _oversized_add_leaves_handle_usable(bk, lh, 64 << 20)
    finally:
        bk.close()


def test_oversized_entry_4_bookies_limit_from_registration(small_cluster):
    """The client's own limit (5 MiB) is bounded by the bookies' 256 KiB."""
    bk = _bk(small_cluster.metadata_uri)
    try:
        lh = bk.create_ledger(ensemble=3, write_quorum=3, ack_quorum=2)
        assert lh.limits.max_entry_bytes <= 256 * KiB
        _oversized_add_leaves_handle_usable(bk, lh, 256 * KiB + 1)
    finally:
        bk.close()


def test_batch_over_the_bookie_request_limit_is_split(small_cluster):
    bk = _bk(small_cluster.metadata_uri, add_batch_bytes=16 * MiB, add_batch_entries=10000)
    try:
        lh = bk.create_ledger(ensemble=3, write_quorum=3, ack_quorum=3)
        ensemble = lh.metadata.current_ensemble
        before = {b: _metric(bk.metadata_store, b, "bookie_add_requests_total")
                  for b in ensemble}
        payloads = [bytes([i]) * (200 * KiB) for i in range(20)]      # 4 MB > 1 MiB batches
        assert lh.add_entries(payloads) == list(range(20))
        for b in ensemble:   # at least 4 MB / 1 MiB requests reached each bookie
            assert _metric(bk.metadata_store, b, "bookie_add_requests_total") - before[b] >= 4
        lh.close()
        md = bk.get_ledger_metadata(lh.ledger_id)
        assert md.last_entry_id == 19 and md.current_ensemble == ensemble
        got = bk.open_ledger(lh.ledger_id).read(0, 19)
        assert [e.payload for e in got] == payloads
    finally:
        bk.close()


def _restart_with(cluster, bookie_id: str, **conf):
    cluster.bookie_conf = dict(SMALL, **conf)
    cluster._write_conf()
    cluster.kill_bookie(bookie_id, signal.SIGTERM)
    cluster.start_bookie(bookie_id)


def test_bookie_below_its_advertised_limit_fails_the_add_with_too_large(small_cluster):
    """The ledger is created while every bookie advertises 256 KiB; one of its
    bookies then restarts with 64 KiB (misconfigured).  A 100 KiB add fails
    with TooLarge - never LedgerFenced / NotEnoughBookies - and no bookie is
    replaced.  The handle is then unusable (the id is assigned and cannot be
    stored on a quorum); once the bookie is fixed, close() recovers."""
    bk = _bk(small_cluster.metadata_uri)
    victim = None
    try:
        lh = bk.create_ledger(ensemble=3, write_quorum=3, ack_quorum=3)
        ensemble = lh.metadata.current_ensemble
        victim = ensemble[1]
        _restart_with(small_cluster, victim, max_entry_bytes=64 * KiB)
        assert lh.limits.max_entry_bytes >= 100 * KiB       # learned before the restart
        assert lh.add_entry(b"small") == 0
        with pytest.raises(errors.TooLarge) as info:
            lh.add_entry(b"v" * (100 * KiB))
        assert victim in str(info.value) and not info.value.outcome_known
        with pytest.raises(errors.TooLarge):                # the handle stays failed
            lh.add_entry(b"after")
        assert bk.get_ledger_metadata(lh.ledger_id).current_ensemble == ensemble
        _restart_with(small_cluster, victim)                 # the operator fixes it
        victim = None
        lh.close()                                           # closes by fencing recovery
        md = bk.get_ledger_metadata(lh.ledger_id)
        assert md.state == lm.CLOSED and md.current_ensemble == ensemble
        assert md.last_entry_id in (0, 1)
        got = bk.open_ledger(lh.ledger_id).read(0, md.last_entry_id)
        assert got[0].payload == b"small"
    finally:
        if victim is not None:
            _restart_with(small_cluster, victim)
        small_cluster.bookie_conf = dict(SMALL)
        small_cluster._write_conf()
        bk.close()


def _status_kib(pid: int, field: str) -> int:
    with open(f"/proc/{pid}/status") as fh:
        return int(re.search(rf"^{field}:\s+(\d+) kB", fh.read(), re.M).group(1))


def test_overload_flood_backs_off_and_stays_bounded(small_cluster):
    writers, entries, size = 6, 40, 200 * KiB
    store_bk = _bk(small_cluster.metadata_uri)
    store = store_bk.metadata_store
    ids = small_cluster.bookie_ids
    refused0 = sum(_metric(store, b, "bookie_adds_refused_overload_total") for b in ids)
    pids = {b: small_cluster.bookie_pid(b) for b in ids}
    anon0 = {b: _status_kib(pids[b], "RssAnon") for b in ids}
    anon_peak = dict(anon0)
    cache_peak = [0.0]
    stop = threading.Event()

    def sample():
        while not stop.is_set():
            for b in ids:
                cache_peak[0] = max(cache_peak[0], _metric(store, b, "bookie_write_cache_bytes"))
                anon_peak[b] = max(anon_peak[b], _status_kib(pids[b], "RssAnon"))
            stop.wait(0.01)

    results: dict[int, tuple] = {}

    def writer(i: int):
        bk = _bk(small_cluster.metadata_uri, add_batch_bytes=size, max_inflight_adds=64,
                 add_overload_backoff_ms=5, add_overload_backoff_max_ms=200)
        try:
            lh = bk.create_ledger(ensemble=3, write_quorum=3, ack_quorum=3)
            ensemble = lh.metadata.current_ensemble
            payloads = [b"%d:%d:" % (i, n) + bytes([n]) * size for n in range(entries)]
            futs = lh.add_entries_async(payloads)
            got = [e for f in futs for e in f.result()]
            lh.close()
            results[i] = (lh.ledger_id, ensemble, got, payloads)
        finally:
            bk.close()

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    threads = [threading.Thread(target=writer, args=(i,)) for i in range(writers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(600)
    stop.set()
    sampler.join(30)
    hwm_growth = {b: _status_kib(pids[b], "VmHWM") for b in ids}
    try:
        assert len(results) == writers
        refused = sum(_metric(store, b, "bookie_adds_refused_overload_total") for b in ids)
        growth = {b: anon_peak[b] - anon0[b] for b in ids}
        print(f"overload: refused={refused - refused0:.0f} write_cache_peak={cache_peak[0]:.0f} "
              f"anon_rss_peak_growth_kib={growth} vm_hwm_kib={hwm_growth}")
        assert refused > refused0, "the flood never hit the admission bound"
        for ledger_id, ensemble, got, payloads in results.values():
            assert got == list(range(entries))
            md = store_bk.get_ledger_metadata(ledger_id)
            assert md.current_ensemble == ensemble and [f for f, _ in md.ensembles] == [0]
            assert md.last_entry_id == entries - 1
            read = store_bk.open_ledger(ledger_id, recovery=False).read(0, entries - 1)
            assert [e.payload for e in read] == payloads
        bound = SMALL["max_add_memory_bytes"]
        assert cache_peak[0] <= bound
        # offered: up to 64 requests x 200 KiB per writer in flight (12.5 MiB
        # each, 75 MiB in all); admitted: 2 MiB.  The frames read and refused
        # and the allocator's slack come on top (sampled, so a lower bound).
        assert max(growth.values()) * KiB <= bound + 32 * MiB
    finally:
        store_bk.close()


def _kill_then(cluster, bookie_id):
    cluster.kill_bookie(bookie_id)          # SIGKILL: its registration lingers a TTL


def test_no_replacement_bookie_is_not_enough_bookies_with_unknown_outcome(small_cluster):
    """E = every bookie: a failed bookie has no replacement.  The add fails with
    NotEnoughBookies (code -6), not LedgerFenced, and its outcome is unknown
    (the entry went to the other bookies); once the bookie is back, close()
    settles the tail by fencing recovery."""
    bk = _bk(small_cluster.metadata_uri)
    victim = None
    try:
        lh = bk.create_ledger(ensemble=4, write_quorum=3, ack_quorum=2)
        ensemble = lh.metadata.current_ensemble
        assert lh.add_entries([b"a", b"b", b"c", b"d"]) == [0, 1, 2, 3]
        victim = ensemble[0]
        _kill_then(small_cluster, victim)
        with pytest.raises(errors.NotEnoughBookies) as info:
            for i in range(8):              # every write set holds the dead slot soon
                lh.add_entry(b"e%d" % i)
        assert info.value.code == -6 and not info.value.outcome_known
        assert not isinstance(info.value, errors.LedgerFenced)
        assert isinstance(lh.error, errors.NotEnoughBookies)
        assert bk.get_ledger_metadata(lh.ledger_id).current_ensemble == ensemble
        small_cluster.start_bookie(victim)  # recovery re-writes to whole write sets
        victim = None
        lh.close()                          # fencing recovery (unknown tail)
        md = bk.get_ledger_metadata(lh.ledger_id)
        assert md.state == lm.CLOSED and md.last_entry_id >= 3
        assert [e.payload for e in bk.open_ledger(lh.ledger_id).read(0, 3)] == \
            [b"a", b"b", b"c", b"d"]
    finally:
        if victim is not None:
            small_cluster.start_bookie(victim)
        bk.close()


def test_log_writer_keeps_leadership_after_not_enough_bookies(small_cluster):
    bk = _bk(small_cluster.metadata_uri)
    victim = None
    try:
        w = bk.open_log_writer("addpath-neb", ensemble=4, write_quorum=3, ack_quorum=2)
        first = w.current_ledger_id
        acked = [w.append(b"p%d" % i) for i in range(3)]
        victim = bk.get_ledger_metadata(first).current_ensemble[0]
        _kill_then(small_cluster, victim)
        with pytest.raises(errors.NotEnoughBookies):
            for i in range(8):
                w.append(b"q%d" % i)
        assert w.is_leader()                # not mistaken for lost leadership
        small_cluster.start_bookie(victim)
        victim = None
        pos = w.append(b"after")            # rolls to a new ledger
        assert w.current_ledger_id != first and pos.ledger_id == w.current_ledger_id
        acked.append(pos)
        w.append(b"carries the LAC")        # a tail ledger is readable up to its LAC
        reader = bk.open_log_reader("addpath-neb")
        got = {(r.position.ledger_id, r.position.entry_id): r.payload
               for r in reader.read_available()}
        reader.close()
        for p in acked:
            assert (p.ledger_id, p.entry_id) in got
        assert got[(pos.ledger_id, pos.entry_id)] == b"after"
    finally:
        if victim is not None:
            small_cluster.start_bookie(victim)
        bk.close()
