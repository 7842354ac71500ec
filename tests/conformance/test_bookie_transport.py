"""ONE conformance suite for the bookie transport port (transport/base.py),
run against the in-memory bookie (transport/memory.py) and a real
``bookie-server`` process over gRPC and over the lane.  If the in-memory
bookie passes here, tests and simulations built on it mean something for the
real bookie.

Each test uses ledger ids of its own: the real bookies are the shared
session cluster.
"""
from __future__ import annotations

import itertools

import pytest

from pybk_spark import errors
from pybk_spark.protocol import ledger_metadata as lm
from pybk_spark.transport.memory import MemoryTransportPool
from pybk_spark.wire.entries import batch_to_bytes, make_batch

HANG_GUARD = 30.0      # a deadline against hangs, never a performance threshold
KEY = lm.master_key(b"conformance")
OTHER_KEY = lm.master_key(b"someone else")
_LEDGER_IDS = itertools.count(4_200_000)


@pytest.fixture(params=["memory", "grpc", "lane"])
def transport(request):
    if request.param == "memory":
        pool = MemoryTransportPool()
        pool.add_bookie("bookie-0")
        yield pool.get("bookie-0")
        return
    from pybk_spark.ledger.client import BookKeeper
    cluster = request.getfixturevalue("cluster")
    bk = BookKeeper(cluster.metadata_uri,
                    conf={"explicit_lac_interval_ms": 0, "add_transport": request.param,
                          "read_transport": request.param})
    try:
        yield bk.transports.get(cluster.bookie_ids[0])
    finally:
        bk.close()


@pytest.fixture
def lid():
    return next(_LEDGER_IDS)


def entries(ledger_id: int, first: int, last: int, lac_lag: int = 1) -> bytes:
    """Entries first..last of a ledger as one add request; each carries the
    LAC ``lac_lag`` behind its own id, as a writer piggybacks it."""
    ids = list(range(first, last + 1))
    return batch_to_bytes(make_batch(ledger_id, ids, [e - lac_lag for e in ids],
                                     [10 * (e + 1) for e in ids], [b"p%d" % e for e in ids],
                                     [b""] * len(ids)))


def add(t, ledger_id, first, last, key=KEY, recovery=False):
    return t.add(ledger_id, key, entries(ledger_id, first, last), recovery=recovery).result(HANG_GUARD)


def ids(result) -> list[int]:
    return result.batch.column("entry_id").to_pylist()


def raises(exc_type, fut):
    with pytest.raises(exc_type) as info:
        fut.result(HANG_GUARD)
    return info.value


# -- add / read -------------------------------------------------------------------------------
def test_add_answers_first_and_last_id(transport, lid):
    assert add(transport, lid, 0, 0) == (0, 0)
    assert add(transport, lid, 1, 9) == (1, 9)          # a batch: one request, many entries


def test_read_returns_the_entries_as_added(transport, lid):
    add(transport, lid, 0, 4)
    r = transport.read(lid, 0, 4).result(HANG_GUARD)
    assert ids(r) == [0, 1, 2, 3, 4] and r.end == "COMPLETE"
    assert r.batch.column("payload").to_pylist() == [b"p%d" % e for e in range(5)]
    assert r.batch.column("lac").to_pylist() == [-1, 0, 1, 2, 3]


def test_read_range_stops_at_the_first_missing_entry(transport, lid):
    add(transport, lid, 0, 2)
    add(transport, lid, 4, 4)
    r = transport.read(lid, 0, 9).result(HANG_GUARD)
    assert ids(r) == [0, 1, 2] and r.end == "MISSING"


def test_read_range_stops_at_max_entries(transport, lid):
    add(transport, lid, 0, 9)
    r = transport.read(lid, 2, 9, max_entries=3).result(HANG_GUARD)
    assert ids(r) == [2, 3, 4] and r.end == "LIMIT"


def test_sparse_read_skips_gaps(transport, lid):
    add(transport, lid, 0, 1)
    add(transport, lid, 5, 6)
    r = transport.read(lid, 0, 9, sparse=True).result(HANG_GUARD)
    assert ids(r) == [0, 1, 5, 6] and r.end == "COMPLETE"


def test_duplicate_add_keeps_the_first_copy(transport, lid):
    add(transport, lid, 0, 0)
    data = batch_to_bytes(make_batch(lid, [0], [-1], [10], [b"second"], [b""]))
    transport.add(lid, KEY, data).result(HANG_GUARD)
    r = transport.read(lid, 0, 0).result(HANG_GUARD)
    assert r.batch.column("payload").to_pylist() == [b"p0"]


def test_a_bad_range_is_a_bad_request(transport, lid):
    add(transport, lid, 0, 1)
    raises(errors.BadRequest, transport.read(lid, 1, 0))


# -- missing entries (what recovery reads rely on) --------------------------------------------
def test_unknown_entry_of_a_known_ledger_is_no_such_entry(transport, lid):
    add(transport, lid, 0, 1)
    exc = raises(errors.NoSuchEntry, transport.read(lid, 2, 2))
    assert exc.outcome_known


def test_unknown_ledger_is_no_such_ledger_or_entry(transport, lid):
    raises((errors.NoSuchLedger, errors.NoSuchEntry), transport.read(lid, 0, 0))
    raises(errors.NoSuchLedger, transport.read_lac(lid))


# -- LAC -------------------------------------------------------------------------------------
def test_lac_is_piggybacked_on_entries(transport, lid):
    add(transport, lid, 0, 3)
    lac = transport.read_lac(lid).result(HANG_GUARD)
    assert (lac.lac, lac.last_entry_id, lac.fenced) == (2, 3, False)
    assert transport.read(lid, 0, 0).result(HANG_GUARD).lac == 2


def test_explicit_lac_raises_the_answer(transport, lid):
    add(transport, lid, 0, 3)
    transport.write_lac(lid, KEY, 3).result(HANG_GUARD)
    assert transport.read_lac(lid).result(HANG_GUARD).lac == 3
    transport.write_lac(lid, KEY, 1).result(HANG_GUARD)        # never goes back
    assert transport.read_lac(lid).result(HANG_GUARD).lac == 3


# -- fencing ---------------------------------------------------------------------------------
def test_fenced_read_lac_rejects_later_adds(transport, lid):
    add(transport, lid, 0, 1)
    lac = transport.read_lac(lid, fence=True, master_key=KEY).result(HANG_GUARD)
    assert lac.fenced and lac.last_entry_id == 1
    raises(errors.LedgerFenced, transport.add(lid, KEY, entries(lid, 2, 2)))
    assert transport.read_lac(lid).result(HANG_GUARD).fenced       # sticky


def test_recovery_adds_pass_a_fence(transport, lid):
    add(transport, lid, 0, 1)
    transport.read_lac(lid, fence=True, master_key=KEY).result(HANG_GUARD)
    assert add(transport, lid, 2, 2, recovery=True) == (2, 2)
    assert ids(transport.read(lid, 0, 2).result(HANG_GUARD)) == [0, 1, 2]


def test_read_with_the_fence_flag_fences(transport, lid):
    add(transport, lid, 0, 1)
    r = transport.read(lid, 0, 1, fence=True, master_key=KEY).result(HANG_GUARD)
    assert ids(r) == [0, 1] and r.fenced
    raises(errors.LedgerFenced, transport.add(lid, KEY, entries(lid, 2, 2)))


# -- master key -----------------------------------------------------------------------------
def test_the_first_key_is_the_ledger_key(transport, lid):
    add(transport, lid, 0, 0)
    raises(errors.Unauthorized, transport.add(lid, OTHER_KEY, entries(lid, 1, 1)))
    raises(errors.Unauthorized, transport.write_lac(lid, OTHER_KEY, 0))
    raises(errors.Unauthorized, transport.read_lac(lid, fence=True, master_key=OTHER_KEY))
    assert not transport.read_lac(lid).result(HANG_GUARD).fenced


# -- malformed requests ---------------------------------------------------------------------
def test_garbage_entries_are_a_bad_request(transport, lid):
    raises(errors.BadRequest, transport.add(lid, KEY, b"not an arrow batch"))


def test_an_empty_batch_is_a_bad_request(transport, lid):
    empty = batch_to_bytes(make_batch(lid, [], [], [], [], []))
    raises(errors.BadRequest, transport.add(lid, KEY, empty))


def test_rows_of_another_ledger_are_a_bad_request(transport, lid):
    raises(errors.BadRequest, transport.add(lid, KEY, entries(lid + 1, 0, 0)))


def test_entry_ids_must_ascend(transport, lid):
    data = batch_to_bytes(make_batch(lid, [1, 0], [-1, -1], [1, 2], [b"a", b"b"], [b"", b""]))
    raises(errors.BadRequest, transport.add(lid, KEY, data))


def test_an_entry_over_max_entry_bytes_is_too_large(transport, lid):
    big = b"x" * (5 * 1024 * 1024 + 1)          # the bookie's default max_entry_bytes + 1
    data = batch_to_bytes(make_batch(lid, [0], [-1], [len(big)], [big], [b""]))
    exc = raises(errors.TooLarge, transport.add(lid, KEY, data))
    assert exc.outcome_known
    raises((errors.NoSuchLedger, errors.NoSuchEntry), transport.read(lid, 0, 0))


# -- reads bounded in bytes, striped reads, long-poll -----------------------------------------
def test_read_range_stops_at_max_bytes_after_one_entry_at_least(transport, lid):
    add(transport, lid, 0, 9)
    r = transport.read(lid, 0, 9, max_bytes=1).result(HANG_GUARD)
    assert ids(r) == [0] and r.end == "LIMIT"


def test_striped_sparse_read_answers_its_stripe(transport, lid):
    add(transport, lid, 0, 9)
    r = transport.read(lid, 0, 9, sparse=True, stripe=(3, 1)).result(HANG_GUARD)
    assert ids(r) == [1, 4, 7] and r.end == "COMPLETE"


def test_long_poll_answers_the_current_lac(transport, lid):
    add(transport, lid, 0, 3)
    assert transport.read_lac(lid, wait_for_lac_above=1, wait_ms=10_000).result(HANG_GUARD).lac == 2
    # not above: the answer after the wait is the current LAC (no timing asserted)
    assert transport.read_lac(lid, wait_for_lac_above=5, wait_ms=100).result(HANG_GUARD).lac == 2


# -- ledgers a bookie has not seen ------------------------------------------------------------
def test_fencing_an_unknown_ledger_records_the_fence(transport, lid):
    lac = transport.read_lac(lid, fence=True, master_key=KEY).result(HANG_GUARD)
    assert lac.fenced and (lac.lac, lac.last_entry_id) == (-1, -1)
    raises(errors.LedgerFenced, transport.add(lid, KEY, entries(lid, 0, 0)))


def test_explicit_lac_of_an_unknown_ledger(transport, lid):
    transport.write_lac(lid, KEY, 4).result(HANG_GUARD)
    assert transport.read_lac(lid).result(HANG_GUARD).lac == 4
