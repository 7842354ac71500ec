"""Adds over the per-bookie add connection, against real bookie processes.

Every test runs over both add transports: the add lane (plain TCP,
transport/lane_client.py) and the gRPC AddStream; they must behave alike.

A stream that breaks or stalls must fail its unanswered adds with an
unknown-outcome error (never hang, never report success), and the next add
must go through a fresh stream.  No timing thresholds: the timeouts only
bound how long a stopped bookie is waited for.
"""
from __future__ import annotations

import signal
import threading
import time

import pytest

from pybk_spark import errors
from pybk_spark.ledger.client import BookKeeper
from pybk_spark.protocol import ledger_metadata as lm
from pybk_spark.transport.lane_client import LaneConnection
from pybk_spark.transport.grpc_bookie import registration_of
from pybk_spark.wire.entries import batch_to_bytes, make_batch


def _one_entry(ledger_id: int, entry_id: int) -> bytes:
    return batch_to_bytes(make_batch(ledger_id, [entry_id], [entry_id - 1], [3 * (entry_id + 1)],
                                     [b"e%d" % entry_id], [b""]))


@pytest.fixture(params=["lane", "grpc"])
def add_transport(request):
    return request.param


def _lid(add_transport: str, n: int) -> int:
    """Ledger ids of their own per transport (the cluster is shared)."""
    return (990000 if add_transport == "lane" else 991000) + n


@pytest.fixture
def bk(cluster, add_transport):
    client = BookKeeper(cluster.metadata_uri,
                        conf={"explicit_lac_interval_ms": 0, "add_timeout_s": 1.0,
                              "add_transport": add_transport})
    try:
        yield client
    finally:
        client.close()


def test_answers_are_matched_to_their_requests(bk, cluster, add_transport):
    """200 adds in flight on one connection: each answer settles the add it
    answers.  The adds get a timeout of their own, not the fixture's 1 s
    (which bounds waits on a stopped bookie): the last of 200 adds queued at
    once, each fsynced, can wait longer than that on a loaded machine, and
    this test checks matching, not timing."""
    bookie = cluster.bookie_ids[0]
    t = bk.transports.get(bookie)
    lid = _lid(add_transport, 1)
    key = lm.master_key(b"")
    futs = [t.add(lid, key, _one_entry(lid, e), timeout=60.0) for e in range(200)]
    assert [f.result(timeout=90) for f in futs] == [(e, e) for e in range(200)]
    # the transport asked for is the one in use (the bookies register a lane)
    assert isinstance(t.add_connection, LaneConnection) == (add_transport == "lane")


def test_stopped_bookie_times_out_then_a_new_stream_works(bk, cluster, add_transport):
    bookie = cluster.bookie_ids[1]
    t = bk.transports.get(bookie)
    lid = _lid(add_transport, 2)
    key = lm.master_key(b"")
    assert t.add(lid, key, _one_entry(lid, 0)).result(timeout=30) == (0, 0)
    cluster.stop_bookie(bookie)
    try:
        fut = t.add(lid, key, _one_entry(lid, 1), timeout=1.0)
        with pytest.raises(errors.Timeout) as info:
            fut.result(timeout=60)
        assert not info.value.outcome_known
    finally:
        cluster.resume_bookie(bookie)
    # same client object: the broken stream is replaced by a new one
    assert t.add(lid, key, _one_entry(lid, 2)).result(timeout=30) == (2, 2)


def test_killed_bookie_fails_pending_adds_with_unknown_outcome(bk, cluster, add_transport):
    bookie = cluster.bookie_ids[2]
    t = bk.transports.get(bookie)
    lid = _lid(add_transport, 3)
    key = lm.master_key(b"")
    assert t.add(lid, key, _one_entry(lid, 0)).result(timeout=30) == (0, 0)
    cluster.kill_bookie(bookie, signal.SIGKILL)
    fut = t.add(lid, key, _one_entry(lid, 1))
    with pytest.raises(errors.BKError) as info:
        fut.result(timeout=60)
    assert not info.value.outcome_known
    bk.transports.invalidate(bookie)        # what the writer does on BookieUnavailable
    cluster.heal()
    cluster.wait_registered(bookie)
    t2 = bk.transports.get(bookie)          # re-resolved: the restarted bookie's address
    assert t2.add(lid, key, _one_entry(lid, 5)).result(timeout=30) == (5, 5)


def test_idle_stream_is_closed_and_reopened(cluster, add_transport):
    client = BookKeeper(cluster.metadata_uri, conf={"explicit_lac_interval_ms": 0,
                                                    "add_stream_idle_close_s": 0.2,
                                                    "add_transport": add_transport})
    try:
        t = client.transports.get(cluster.bookie_ids[0])
        lid = _lid(add_transport, 4)
        key = lm.master_key(b"")
        assert t.add(lid, key, _one_entry(lid, 0)).result(timeout=30) == (0, 0)
        first = t.add_connection
        wait_until(lambda: first.broken is not None, "idle stream closed")
        assert t.add(lid, key, _one_entry(lid, 1)).result(timeout=30) == (1, 1)
        assert t.add_connection is not first
    finally:
        client.close()


def wait_until(predicate, what, timeout=30.0):
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for: {what}")
        time.sleep(0.02)


def test_broken_streams_leave_no_threads_behind(cluster, add_transport):
    import threading
    client = BookKeeper(cluster.metadata_uri, conf={"explicit_lac_interval_ms": 0,
                                                    "add_transport": add_transport})
    try:
        t = client.transports.get(cluster.bookie_ids[0])
        lid = _lid(add_transport, 5)
        key = lm.master_key(b"")
        t.add(lid, key, _one_entry(lid, 0)).result(timeout=30)
        before = threading.active_count()
        for e in range(1, 11):                      # ten streams broken under the client
            first = t.add_connection
            first._cancel()                         # as a dead connection would
            wait_until(lambda: first.broken is not None, "stream seen broken")
            t.add(lid, key, _one_entry(lid, e)).result(timeout=30)
        wait_until(lambda: threading.active_count() <= before + 2, "stream threads gone")
    finally:
        client.close()


def test_close_waits_for_every_copy_not_just_the_ack_quorum(bk):
    """Entries release at Qa; a healthy ledger's close also waits for the
    Qw - Qa straggler copies, so every bookie of the ensemble holds them all."""
    for _ in range(3):
        lh = bk.create_ledger(3, 3, 2)
        lh.add_entries(b"copy-%d" % i for i in range(3000))
        lh.close()
        for bookie in lh.metadata.current_ensemble:
            got = bk.transports.get(bookie).read(lh.ledger_id, 0, 2999).result(timeout=30)
            assert got.batch.num_rows == 3000, bookie


def test_a_restarted_bookie_is_reached_again_without_invalidating(bk, cluster, add_transport):
    """A restarted bookie keeps its gRPC port but gets a new add lane port
    (add_lane_port = 0): the lane's connector looks the new one up when the
    old one refuses, so the same client object reaches it again."""
    bookie = cluster.bookie_ids[0]
    t = bk.transports.get(bookie)
    lid = _lid(add_transport, 6)
    key = lm.master_key(b"")
    assert t.add(lid, key, _one_entry(lid, 0)).result(timeout=30) == (0, 0)
    before = (registration_of(bk.metadata_store, bookie) or {}).get("add_lane_address")
    cluster.kill_bookie(bookie, signal.SIGKILL)
    cluster.heal()
    cluster.wait_registered(bookie)
    after = (registration_of(bk.metadata_store, bookie) or {}).get("add_lane_address")
    if add_transport == "lane":
        assert before and after and before != after
    deadline = time.monotonic() + 30
    while True:                  # the first add may meet the dead connection
        try:
            assert t.add(lid, key, _one_entry(lid, 1)).result(timeout=30) == (1, 1)
            break
        except errors.BookieUnavailable:
            assert time.monotonic() < deadline
    assert bk.transports.get(bookie) is t


def test_sync_adds_from_many_threads_complete_in_entry_order(bk, add_transport):
    """Sync callers on several threads share connections and a ledger: every
    add completes, each caller's ids ascend, the shared ledger's ids are
    dense."""
    shared = bk.create_ledger(3, 3, 2)
    own = [bk.create_ledger(3, 3, 2) for _ in range(2)]
    got: dict[str, list[int]] = {}
    failed: list[BaseException] = []

    def run(name: str, lh, n: int) -> None:
        try:
            got[name] = [lh.add_entry(b"%s-%d" % (name.encode(), i)) for i in range(n)]
        except BaseException as exc:  # noqa: BLE001 - reported below
            failed.append(exc)
    threads = [threading.Thread(target=run, args=(f"shared-{i}", shared, 100)) for i in range(3)]
    threads += [threading.Thread(target=run, args=(f"own-{i}", lh, 100)) for i, lh in enumerate(own)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not failed and not any(t.is_alive() for t in threads)
    assert all(ids == sorted(ids) for ids in got.values())
    assert sorted(i for k, ids in got.items() if k.startswith("shared") for i in ids) == \
        list(range(300))
    assert got["own-0"] == got["own-1"] == list(range(100))
    for lh in (shared, *own):
        lh.close()
    assert bk.open_ledger(shared.ledger_id).metadata.last_entry_id == 299


def test_a_sync_add_waiting_on_a_stopped_bookie_completes_after_an_ensemble_change(
        bk, cluster, add_transport):
    """One bookie of the ensemble stops while a sync add waits on it: the
    watchdog cuts that connection, the ensemble change resends to the spare
    bookie, and the add completes all the same."""
    lh = bk.create_ledger(2, 2, 2)
    assert lh.add_entry(b"before") == 0
    victim = lh.metadata.current_ensemble[0]
    cluster.stop_bookie(victim)
    try:
        assert lh.add_entry(b"during") == 1
    finally:
        cluster.resume_bookie(victim)
    assert victim not in lh.metadata.current_ensemble
    assert lh.add_entry(b"after") == 2
    lh.close()
    rh = bk.open_ledger(lh.ledger_id)
    assert [e.payload for e in rh.read(0, 2)] == [b"before", b"during", b"after"]
