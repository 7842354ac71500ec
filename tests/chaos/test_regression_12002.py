"""Chaos seed 12002, ledger 3142 (docs/testing.md): two fencing recoveries of
a Qa = Qw ledger at once, scripted deterministically on in-memory bookies.

The writer of a (3, 3, 3) ledger has 0-4 acknowledged and every bookie knows
LAC 4; its adds 5-9 reach one bookie (``holder``) while the two others are
paused, so they are never acknowledged.  Recovery B reaches every bookie: it
reads 5-9 from ``holder`` and decides to re-write them.  Right then (B's
recorded decision is the interleaving point) recovery A, which cannot reach
``holder``, fences the two others, settles 5 as never acknowledged (with
Qa = Qw one NoSuchEntry does) and closes at 4.  B then re-writes 5-9 to all
three bookies with recovery adds, which pass fences by design, and its close
CAS accepts A's close.  Every bookie ends with 5-9 beyond the close: what
the checker's I2 flagged in seed 12002.  Each recovery's own decision is in
the history, so the checker tells these copies from a write through a fence.
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

from . import checker as chk
from .history import History, digest, load_histories, pair_ops


def _cluster():
    store = MemoryMetadataStore()
    bookies = {b: MemoryBookie(b) for b in ("b0", "b1", "b2")}
    for b in bookies:
        store.put(f"bookies/writable/{b}", json.dumps({"bookie_id": b, "address": ""}).encode())

    def client(hist: History | None = None) -> BookKeeper:
        # each client has its own view of the network (what it can reach),
        # all of them the same bookies
        return BookKeeper(store=store, transports=MemoryTransportPool(bookies),
                          rng=random.Random(1), background=False,
                          recovery_listener=hist.recovery if hist else None)
    return bookies, client


def test_two_recoveries_one_closes_short_the_other_rewrites_the_tail(tmp_path):
    bookies, client = _cluster()
    hw = History(str(tmp_path / "w.jsonl"), "w")
    ha, hb = History(str(tmp_path / "a.jsonl"), "a"), History(str(tmp_path / "b.jsonl"), "b")
    writer, bk_a, bk_b, reader = client(hw), client(ha), client(hb), client()
    try:
        lh = writer.create_ledger(3, 3, 3)
        lid, key = lh.ledger_id, lm.master_key(b"")
        acked = [b"w:%d:acked" % i for i in range(5)]
        tail = [b"w:%d:tail" % i for i in range(5, 10)]
        op = hw.invoke("add", ledger=lid, digests=[digest(p) for p in acked])
        assert lh.add_entries(acked) == list(range(5))
        hw.ok(op, "add", ledger=lid, entry=0)
        ensemble = lh.metadata.current_ensemble
        holder, paused = ensemble[0], ensemble[1:]
        for b in ensemble:                  # the writer's explicit LAC while idle
            writer.transports.get(b).write_lac(lid, key, 4)
        writer.transports.stalled.update(paused)
        hw.invoke("add", ledger=lid, digests=[digest(p) for p in tail])   # never completes
        tail_futs = lh.add_entries_async(tail)
        assert [e for e in range(10) if e in bookies[holder].ledgers[lid].rows] == list(range(10))
        assert all(5 not in bookies[b].ledgers[lid].rows for b in paused)

        bk_a.transports.hung.add(holder)    # A never reaches the bookie holding the tail
        seen = {}

        def a_closes_between_bs_read_and_its_rewrite(decision):
            hb.recovery(decision)
            if "a" not in seen:
                seen["b_decision"] = decision
                seen["a"] = bk_a.open_ledger(lid)       # fencing recovery A, start to end
        bk_b.recovery_listener = a_closes_between_bs_read_and_its_rewrite
        rh_b = bk_b.open_ledger(lid)                    # fencing recovery B
        rh_a = seen["a"]

        # B found and re-wrote 5-9; A found nothing after 4 and closed there; B converged
        assert (seen["b_decision"].start, seen["b_decision"].last) == (4, 9)
        assert rh_a.metadata == rh_b.metadata
        md = rh_b.metadata
        assert (md.state, md.last_entry_id, md.length) == (lm.CLOSED, 4, sum(map(len, acked)))
        assert writer.get_ledger_metadata(lid) == md
        # every acknowledged entry is in the closed ledger
        assert [e.payload for e in reader.open_ledger(lid, recovery=False).read(0, 4)] == acked
        # B's recovery adds left the tail on every bookie, beyond the close (seed 12002's I2)
        for b in ensemble:
            assert all(e in bookies[b].ledgers[lid].rows for e in range(5, 10)), b
        # ... yet no reader can read past the last entry
        for recovery in (False, True):
            with pytest.raises(errors.NoSuchEntry):
                reader.open_ledger(lid, recovery=recovery).read(0, 5)
        # the writer's adds were never acknowledged, and none gets through now
        assert not any(f.done() for f in tail_futs)
        assert all(bookies[b].ledgers[lid].fenced for b in ensemble)
        writer.transports.stalled.clear()
        with pytest.raises(errors.LedgerFenced):
            lh.add_entry(b"w:10:late")
        for h in (hw, ha, hb):
            h.close()

        # the checker: B's recorded decision explains the copies beyond the close
        final = chk.collect_final_state(reader, ledger_ids=[lid], log=lambda m: None)
        assert final.ledgers[lid].beyond_quorum == {e: 3 for e in range(5, 10)}
        ops = pair_ops(load_histories(str(tmp_path)))
        assert [(op["proc"], op["start"], op["found"]) for op in ops
                if op.get("op") == "recovery"] == [("b", 4, 9), ("a", 4, 4)]
        assert chk.check(ops, final) == []
        # without that record the same copies are a fencing hole
        unexplained = [op for op in ops if op["proc"] != "b"]
        assert [(v.invariant, v.entry) for v in chk.check(unexplained, final)] == [("I2", 5)]
    finally:
        for bk in (writer, bk_a, bk_b, reader):
            bk.close()
