"""copy_fragment / verify_ledger / run_audit against the in-memory bookies and
metadata twin (fast, deterministic); the same paths run against real
processes in test_rereplicate.py."""
import json
import random

import pytest

from pybk_spark.admin.operations import rereplicate as rr
from pybk_spark.ledger.client import BookKeeper
from pybk_spark.metadata.memory_store import MemoryMetadataStore
from pybk_spark.transport.memory import MemoryTransportPool


@pytest.fixture
def env():
    store = MemoryMetadataStore()
    pool = MemoryTransportPool()
    for i in range(5):
        bid = f"b{i}"
        pool.add_bookie(bid)
        store.put(f"bookies/writable/{bid}", json.dumps({"bookie_id": bid}).encode())
    bk = BookKeeper(store=store, transports=pool, rng=random.Random(7), background=False)
    yield bk, store, pool
    bk.close()


def _lose(store, pool, bookie):
    pool.down.add(bookie)
    store.delete(f"bookies/writable/{bookie}")


def _ledger(bk, n=100, e=3, w=2, a=2):
    lh = bk.create_ledger(e, w, a)
    lh.add_entries([f"v{i}".encode() for i in range(n)])
    lh.close()
    return bk.get_ledger_metadata(lh.ledger_id)


def _read_all(bk, lid, n):
    rh = bk.open_ledger(lid, recovery=False)
    return [e.payload for e in rh.read(0, n - 1)]


def test_lost_bookie_copied_and_verified(env):
    bk, store, pool = env
    md = _ledger(bk, 100)
    lost = md.current_ensemble[1]
    _lose(store, pool, lost)
    assert rr.verify_ledger(bk, md.ledger_id)[0]["bookie"] == lost
    res = rr.run_audit(bk, delay_s=0, now=1000.0)
    assert lost in res.lost and len(res.work) == 1
    w = res.work[0]
    assert w.replacement not in md.current_ensemble and w.replacement != lost
    row = rr.copy_fragment(bk, w)
    assert row["outcome"] == "replicated", row
    assert row["path"] == "client" and row["pull_error"]   # in-memory bookies cannot pull
    assert row["entries"] == len([e for e in range(100) if (1 - e) % 3 < 2])
    new_md = bk.get_ledger_metadata(md.ledger_id)
    assert lost not in new_md.all_bookies() and w.replacement in new_md.current_ensemble
    assert rr.verify_ledger(bk, md.ledger_id) == []
    assert _read_all(bk, md.ledger_id, 100) == [f"v{i}".encode() for i in range(100)]
    again = rr.copy_fragment(bk, w)                 # idempotent
    assert again["outcome"] == "already-done"


def test_missing_mark_and_delay(env):
    bk, store, pool = env
    md = _ledger(bk, 10)
    lost = md.current_ensemble[0]
    _lose(store, pool, lost)
    first = rr.run_audit(bk, delay_s=60, now=1000.0)
    assert first.lost == {} and store.get(f"audit/missing/{lost}") is not None
    later = rr.run_audit(bk, delay_s=60, now=1061.0)
    assert lost in later.lost and later.lost[lost] == 1000.0
    # it comes back: the mark is cleared
    store.put(f"bookies/writable/{lost}", json.dumps({"bookie_id": lost}).encode())
    back = rr.run_audit(bk, delay_s=60, now=1100.0)
    assert back.lost == {} and store.get(f"audit/missing/{lost}") is None


def test_entries_without_surviving_replica_fail_clearly(env):
    bk, store, pool = env
    md = _ledger(bk, 30)
    a, b = md.current_ensemble[0], md.current_ensemble[1]    # entry 0's whole write set
    _lose(store, pool, a)
    _lose(store, pool, b)
    res = rr.run_audit(bk, delay_s=0, now=1.0)
    rows = [rr.copy_fragment(bk, w) for w in res.work]
    assert {r["outcome"] for r in rows} == {"failed"}
    assert all("no surviving intact replica" in r["error"] for r in rows)
    assert rr.failure_reasons(rows) == {"ReadError": len(rows)}      # the typed reason
    assert a in bk.get_ledger_metadata(md.ledger_id).all_bookies()   # no CAS on failure


def test_decommission_reads_from_the_live_bookie(env):
    bk, store, pool = env
    md = _ledger(bk, 50, e=3, w=3, a=2)
    target = md.current_ensemble[2]
    rr.mark_decommissioned(store, target, 5.0)
    res = rr.run_audit(bk, now=10.0)
    assert set(res.lost) == {target} and res.lost[target] == 5.0
    row = rr.copy_fragment(bk, res.work[0])
    assert row["outcome"] == "replicated" and row["entries"] == 50
    assert target not in bk.get_ledger_metadata(md.ledger_id).all_bookies()
    rr.clear_decommissioned(store, target)
    assert target not in rr.run_audit(bk, now=11.0).lost


def test_verify_repairs_missing_copies_on_live_bookies(env):
    """An entry acknowledged at Qa whose third write failed keeps Qa copies;
    verify with repair fills the live bookie in from the other replicas."""
    bk, store, pool = env
    md = _ledger(bk, 60, e=3, w=3, a=2)
    holder = md.current_ensemble[2]
    rows = pool.bookies[holder].ledgers[md.ledger_id].rows
    for e in (5, 6, 40):
        rows.pop(e)
    found = rr.verify_ledger(bk, md.ledger_id)
    assert found and found[0]["bookie"] == holder and found[0]["missing"] == 3
    assert rr.verify_ledger(bk, md.ledger_id, repair=True) == []
    assert rr.verify_ledger(bk, md.ledger_id) == []
    assert {5, 6, 40} <= set(rows)
    assert _read_all(bk, md.ledger_id, 60) == [f"v{i}".encode() for i in range(60)]


def test_damaged_bookie_marker_repaired_onto_the_same_bookie(env):
    from pybk_spark.admin.operations.damage_repair import repair_damaged
    from pybk_spark.protocol import damage_marker as dm
    bk, store, pool = env
    md = _ledger(bk, 60, e=3, w=3, a=2)
    open_lh = bk.create_ledger(3, 3, 2)
    open_lh.add_entries([b"x"] * 5)              # still being written
    # 3 of 5 bookies each: the two ensembles share at least one
    victim = sorted(set(md.current_ensemble) & set(open_lh.metadata.current_ensemble))[0]
    rows = pool.bookies[victim].ledgers[md.ledger_id].rows
    for e in range(10, 20):                      # lost to damage on the victim
        del rows[e]
    assert not pool.bookies[victim].ledgers[md.ledger_id].fenced  # closed by its writer
    store.put_if_absent(dm.marker_key(victim), dm.marker_value(
        [(md.ledger_id, 10, 19), (open_lh.ledger_id, 0, dm.OPEN), (999, 0, 0)], False))
    report = {r["ledger"]: r for r in repair_damaged(bk)}
    assert report[md.ledger_id]["copied"] == 10 and report[md.ledger_id]["entries"] == "10-19"
    out = {lid: r["outcome"] for lid, r in report.items()}
    assert out[md.ledger_id] == "repaired" and out[999] == "deleted"
    assert sorted(rows) == list(range(60))        # copied back onto the same bookie
    assert pool.bookies[victim].ledgers[md.ledger_id].fenced     # a lost fence is restored
    assert rr.verify_ledger(bk, md.ledger_id) == []
    assert out[open_lh.ledger_id] == "waiting"     # checked once it is closed
    left = dm.parse_marker(store.get(dm.marker_key(victim)).value)
    assert left == ([(open_lh.ledger_id, 0, dm.OPEN)], False)
    open_lh.close()
    out = {r["ledger"]: r["outcome"] for r in repair_damaged(bk)}
    assert out == {open_lh.ledger_id: "repaired"}
    assert store.get(dm.marker_key(victim)) is None


def test_unattributed_damage_checks_every_ledger_on_the_bookie(env):
    """A ledger all of whose records were damaged cannot be named by the
    bookie: ``unattributed`` makes the auditor check every ledger on it."""
    from pybk_spark.admin.operations.damage_repair import repair_damaged
    from pybk_spark.protocol import damage_marker as dm
    bk, store, pool = env
    md = _ledger(bk, 30, e=3, w=3, a=2)
    victim = md.current_ensemble[1]
    del pool.bookies[victim].ledgers[md.ledger_id]          # wholly lost
    store.put_if_absent(dm.marker_key(victim), dm.marker_value([], True))
    out = repair_damaged(bk)
    assert [(r["ledger"], r["outcome"]) for r in out] == [(md.ledger_id, "repaired")]
    assert sorted(pool.bookies[victim].ledgers[md.ledger_id].rows) == list(range(30))
    assert store.get(dm.marker_key(victim)) is None
