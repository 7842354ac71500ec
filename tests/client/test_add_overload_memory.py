"""The client's handling of overload and of a bookie's TooLarge, against
in-memory bookies, with the clock and ``call_later`` injected (deterministic:
the test runs each scheduled retry itself)."""
from __future__ import annotations

import json
import random

import pytest

from pybk_spark import errors
from pybk_spark.ledger.client import BookKeeper
from pybk_spark.metadata.memory_store import MemoryMetadataStore
from pybk_spark.transport.memory import MemoryBookie, MemoryTransportPool


class RefusingBookie(MemoryBookie):
    """Answers the next ``refuse`` adds with ``error`` (then stores normally)."""

    def __init__(self, bookie_id, error=errors.TooManyRequests, refuse=0):
        super().__init__(bookie_id)
        self.error, self.refuse, self.refused = error, refuse, 0

    def add(self, lid, key, data, recovery):
        if self.refuse:
            self.refuse -= 1
            self.refused += 1
            raise self.error("refused by test", bookie=self.bookie_id)
        return super().add(lid, key, data, recovery)


class Env:
    def __init__(self, n=5, **conf):
        self.store = MemoryMetadataStore()
        self.pool = MemoryTransportPool()
        for i in range(n):
            bid = f"b{i}"
            self.pool.bookies[bid] = RefusingBookie(bid)
            self.store.put(f"bookies/writable/{bid}",
                           json.dumps({"bookie_id": bid, "rack": "r"}).encode())
        self.now = 0.0
        self.scheduled: list = []
        base = {"add_overload_backoff_ms": 10, "add_overload_backoff_max_ms": 80,
                "add_overload_retry_s": 60.0}
        base.update(conf)
        self.bk = BookKeeper(store=self.store, transports=self.pool, rng=random.Random(3),
                             background=False, conf=base, clock=lambda: self.now,
                             call_later=lambda d, fn: self.scheduled.append((d, fn)))

    def run_scheduled(self) -> list[float]:
        delays = []
        while self.scheduled:
            delay, fn = self.scheduled.pop(0)
            delays.append(delay)
            self.now += delay
            fn()
        return delays


@pytest.fixture
def env():
    e = Env()
    yield e
    e.bk.close()


def test_overloaded_bookie_is_retried_not_replaced(env):
    lh = env.bk.create_ledger(3, 3, 3)
    ensemble = lh.metadata.current_ensemble
    env.pool.bookies[ensemble[1]].refuse = 6
    [fut] = lh.add_entries_async([b"a", b"b"])
    assert not fut.done() and len(env.scheduled) == 1      # waiting on a backoff
    delays = env.run_scheduled()
    assert fut.result(timeout=5) == [0, 1]
    assert len(delays) == 6 and all(0.0 <= d <= 0.080 for d in delays)
    assert lh.metadata.current_ensemble == ensemble and lh.error is None
    assert lh.add_entries([b"c"]) == [2]
    lh.close()


def test_bookie_overloaded_past_the_budget_counts_as_failed(env):
    lh = env.bk.create_ledger(3, 3, 3)
    ensemble = lh.metadata.current_ensemble
    env.pool.bookies[ensemble[0]].refuse = 10 ** 6
    [fut] = lh.add_entries_async([b"a"])
    assert len(env.scheduled) == 1
    env.now += 61.0                  # past add_overload_retry_s since the first refusal
    env.run_scheduled()              # refused again -> a bookie failure: ensemble change
    assert fut.result(timeout=30) == [0]
    new = lh.metadata.current_ensemble
    assert new[0] != ensemble[0] and new[1:] == ensemble[1:]


def test_a_bookies_too_large_aborts_with_too_large_and_replaces_nobody(env):
    lh = env.bk.create_ledger(3, 3, 2)
    ensemble = lh.metadata.current_ensemble
    assert lh.add_entries([b"x"]) == [0]
    victim = env.pool.bookies[ensemble[0]]      # answers first (slot order)
    victim.error, victim.refuse = errors.TooLarge, 1
    [fut] = lh.add_entries_async([b"y"])
    with pytest.raises(errors.TooLarge) as info:
        fut.result(timeout=5)
    # the other bookies stored it: the outcome is unknown
    assert not info.value.outcome_known and ensemble[0] in str(info.value)
    assert isinstance(lh.error, errors.TooLarge)
    with pytest.raises(errors.TooLarge):
        lh.add_entries([b"z"])
    assert lh.metadata.current_ensemble == ensemble
    assert env.bk.get_ledger_metadata(lh.ledger_id).current_ensemble == ensemble


def test_too_large_after_the_quorum_acked_still_fails_the_handle(env):
    """With Qa < Qw the entry may be released before the refusal arrives: the
    add succeeds, and the handle fails from then on (the id can never reach
    its whole write set)."""
    lh = env.bk.create_ledger(3, 3, 2)
    ensemble = lh.metadata.current_ensemble
    victim = env.pool.bookies[ensemble[2]]      # answers last
    victim.error, victim.refuse = errors.TooLarge, 1
    assert lh.add_entries([b"y"]) == [0]
    assert isinstance(lh.error, errors.TooLarge)
    with pytest.raises(errors.TooLarge):
        lh.add_entries([b"z"])
    assert lh.metadata.current_ensemble == ensemble


def test_entry_over_the_limit_is_refused_before_an_id():
    e = Env(max_entry_size_bytes=100)
    try:
        lh = e.bk.create_ledger(3, 2, 2)
        assert lh.limits.max_entry_bytes == 100
        with pytest.raises(errors.TooLarge):
            lh.add_entry(b"x" * 101)
        with pytest.raises(errors.TooLarge):
            lh.add_entry_async(b"x" * 101).result()
        assert lh.add_entry(b"x" * 100) == 0
        assert all(b.refused == 0 for b in e.pool.bookies.values())
    finally:
        e.bk.close()


def test_close_with_a_straggler_still_backing_off_warns_and_closes(caplog):
    """Qa acks released every entry; the third bookie's copy is still backing
    off from TooManyRequests when ``close()`` has waited ``add_timeout_s``:
    the ledger closes (its entries have Qa copies) and a warning names how
    many requests were unanswered, for an operator's replicas check."""
    env = Env(add_timeout_s=0.05)
    try:
        lh = env.bk.create_ledger(3, 3, 2)
        env.pool.bookies[lh.metadata.current_ensemble[2]].refuse = 1
        assert lh.add_entries([b"a", b"b"]) == [0, 1]
        assert len(env.scheduled) == 1                       # the straggler's retry
        with caplog.at_level("WARNING", logger="pybk_spark.ledger"):
            lh.close()
        assert lh.metadata.is_closed and lh.metadata.last_entry_id == 1
        assert any("1 request(s) to bookies unanswered" in r.getMessage()
                   and "Qw=3" in r.getMessage() for r in caplog.records)
    finally:
        env.bk.close()
