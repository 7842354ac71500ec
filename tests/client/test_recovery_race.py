"""A fencing open that fails after another recovery closed the ledger
reports the close, not the failure (in-memory bookies, scripted).

The writer of a (3, 3, 3) ledger has 0-4 acknowledged, LAC 4 on every
bookie, and 5-9 on one bookie only (never acknowledged).  Recovery B reads
5-9 and decides to re-write them; right then recovery A, which cannot reach
that bookie, closes the ledger at 4, and B loses a bookie, so its re-write
cannot complete (three bookies: no replacement).  B's open must return the
ledger as A closed it: a CLOSED ledger is what a fencing open promises, and
all recoveries converge on the first close.  Without a close by someone
else, the same failure is still a ``LedgerRecoveryError``.
"""
from __future__ import annotations

import json
import random

import pytest

from pybk_spark import errors
from pybk_spark.ledger.client import BookKeeper
from pybk_spark.metadata.memory_store import MemoryMetadataStore
from pybk_spark.protocol import ledger_metadata as lm
from pybk_spark.transport.memory import MemoryBookie, MemoryTransportPool


@pytest.fixture
def memory_cluster():
    store = MemoryMetadataStore()
    bookies = {b: MemoryBookie(b) for b in ("b0", "b1", "b2")}
    for b in bookies:
        store.put(f"bookies/writable/{b}", json.dumps({"bookie_id": b, "address": ""}).encode())
    clients = []

    def client() -> BookKeeper:     # each client its own view of the network
        bk = BookKeeper(store=store, transports=MemoryTransportPool(bookies),
                        rng=random.Random(1), background=False)
        clients.append(bk)
        return bk
    yield bookies, client
    for bk in clients:
        bk.close()


def _ledger_with_unacknowledged_tail(writer: BookKeeper):
    lh = writer.create_ledger(3, 3, 3)
    lid, key = lh.ledger_id, lm.master_key(b"")
    acked = [b"acked-%d" % i for i in range(5)]
    assert lh.add_entries(acked) == list(range(5))
    ensemble = lh.metadata.current_ensemble
    for b in ensemble:                          # the writer's explicit LAC while idle
        writer.transports.get(b).write_lac(lid, key, 4)
    writer.transports.stalled.update(ensemble[1:])
    lh.add_entries_async([b"tail-%d" % i for i in range(5, 10)])   # reaches ensemble[0] only
    return lid, ensemble, acked


def test_recovery_that_fails_after_another_closed_returns_the_close(memory_cluster):
    _, client = memory_cluster
    writer, bk_a, bk_b = client(), client(), client()
    lid, ensemble, acked = _ledger_with_unacknowledged_tail(writer)
    holder, other = ensemble[0], ensemble[1]
    bk_a.transports.hung.add(holder)            # A never sees the tail
    decisions = []

    def a_closes_then_b_loses_a_bookie(decision):
        decisions.append((decision.start, decision.last))
        if len(decisions) == 1:
            bk_a.open_ledger(lid)               # recovery A: closes at 4
            bk_b.transports.down.add(other)     # B's re-write of 5-9 cannot complete
    bk_b.recovery_listener = a_closes_then_b_loses_a_bookie
    rh = bk_b.open_ledger(lid)
    assert decisions == [(4, 9)]
    md = rh.metadata
    assert (md.state, md.last_entry_id, md.length) == (lm.CLOSED, 4, sum(map(len, acked)))
    assert md == bk_a.get_ledger_metadata(lid)
    assert [e.payload for e in rh.read(0, 4)] == acked


def test_recovery_that_fails_with_the_ledger_still_open_raises(memory_cluster):
    _, client = memory_cluster
    writer, bk_b = client(), client()
    lid, ensemble, _ = _ledger_with_unacknowledged_tail(writer)

    def lose_a_bookie(decision):
        bk_b.transports.down.add(ensemble[1])
    bk_b.recovery_listener = lose_a_bookie
    with pytest.raises(errors.LedgerRecoveryError):
        bk_b.open_ledger(lid)
    assert not writer.get_ledger_metadata(lid).is_closed
