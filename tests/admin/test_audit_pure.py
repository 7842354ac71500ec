"""Unit tests of the pure auditor / entry-set decisions (no I/O)."""

import numpy as np
import pytest

from pybk_spark import errors
from pybk_spark.admin.decisions import audit
from pybk_spark.admin.decisions import entry_sets as es
from pybk_spark.protocol import ledger_metadata as lm
from pybk_spark.protocol.distribution import write_set


def _md(ensembles, state=lm.CLOSED, last=99, e=3, qw=2, qa=2, ctime_ms=0):
    md = lm.new_ledger(7, ensembles[0][1], qw, qa, ctime_ms=ctime_ms)
    from dataclasses import replace
    return replace(md, ensembles=tuple((f, tuple(b)) for f, b in ensembles), state=state,
                   last_entry_id=last if state == lm.CLOSED else -1)


# -- entry sets against a naive oracle -----------------------------------------------------
@pytest.mark.parametrize("E,Qw", [(e, w) for e in range(1, 6) for w in range(1, e + 1)])
def test_slot_entries_matches_write_sets(E, Qw):
    for slot in range(E):
        got = es.slot_entries(5, 40, E, Qw, slot).tolist()
        want = [x for x in range(5, 41) if slot in write_set(x, E, Qw)]
        assert got == want


def test_runs_and_text():
    ids = np.array([0, 1, 2, 5, 7, 8], np.int64)
    assert es.runs(ids) == [(0, 2), (5, 5), (7, 8)]
    assert es.ranges_text(ids) == "0-2,5,7-8"
    assert es.runs(np.empty(0, np.int64)) == []


def test_next_source_covers_everything_a_survivor_holds():
    E, Qw = 4, 3
    needed = es.slot_entries(0, 99, E, Qw, 1)
    remaining, tried = needed, {1}
    while True:
        nxt = es.next_source(remaining, E, Qw, tried)
        if nxt is None:
            break
        slot, ids = nxt
        assert all(slot in write_set(int(x), E, Qw) for x in ids)
        tried.add(slot)
        remaining = np.setdiff1d(remaining, ids)
    assert len(remaining) == 0


def test_next_source_none_when_only_lost_slots_hold():
    # E=3 Qw=2: entries with write set {0,1}; slots 0 and 1 lost
    remaining = np.array([0, 3, 6], np.int64)
    assert es.next_source(remaining, 3, 2, {0, 1}) is None


def test_under_replicated_and_copies():
    E, Qw = 3, 2
    present = {s: es.slot_entries(0, 9, E, Qw, s) for s in range(E)}
    assert es.under_replicated(0, 9, E, Qw, present) == {}
    assert (es.copies_per_entry(0, 9, present) == Qw).all()
    present[2] = present[2][present[2] != 4]
    ur = es.under_replicated(0, 9, E, Qw, present)
    assert list(ur) == [2] and ur[2].tolist() == [4]


# -- lost bookies -----------------------------------------------------------------------------
def test_track_missing_marks_and_clears():
    ch = audit.track_missing({"a", "b", "c"}, {"a"}, {"c": 5.0, "a": 1.0})
    assert ch.mark == {"b"} and ch.clear == {"a"}


def test_lost_after_delay_only():
    seen = {"b": 100.0, "c": 150.0}
    assert set(audit.lost_bookies(seen, 160.0, 30.0)) == {"b"}
    assert set(audit.lost_bookies(seen, 160.0, 0.0)) == {"b", "c"}
    lost = audit.lost_bookies(seen, 160.0, 1000.0, decommissioned=["d"], named=["c"])
    assert lost == {"d": 160.0, "c": 150.0}


def test_known_bookies_from_cookies_and_ensembles():
    md = _md([(0, ["a", "b", "c"]), (10, ["a", "d", "c"])])
    assert audit.known_bookies(["z"], [md]) == {"a", "b", "c", "d", "z"}


# -- fragments ----------------------------------------------------------------------------------
def test_closed_ledger_every_fragment_with_lost_bookie():
    md = _md([(0, ["a", "b", "c"]), (10, ["a", "d", "c"])], last=20)
    res = audit.audit_ledger(md, {"c": 0.0}, 100.0, 30.0, writer_alive=False)
    assert [(w.first, w.last, w.slot) for w in res.work] == [(0, 9, 2), (10, 20, 2)]
    assert res.open_action == ""


def test_untouched_ledger_no_work():
    md = _md([(0, ["a", "b", "c"])])
    assert audit.audit_ledger(md, {"x": 0.0}, 1.0, 0.0, False).work == []


def test_open_last_fragment_deferred_then_fenced():
    md = _md([(0, ["a", "b", "c"]), (10, ["a", "b", "d"])], state=lm.OPEN)
    early = audit.audit_ledger(md, {"b": 100.0}, 110.0, 30.0, writer_alive=True)
    assert early.open_action == audit.DEFER
    assert [(w.first, w.last) for w in early.work] == [(0, 9)]     # complete fragment repaired
    late = audit.audit_ledger(md, {"b": 100.0}, 131.0, 30.0, writer_alive=True)
    assert late.open_action == audit.FENCE
    gone = audit.audit_ledger(md, {"b": 100.0}, 101.0, 30.0, writer_alive=False)
    assert gone.open_action == audit.FENCE


def test_plan_replacements_distinct_per_fragment():
    md = _md([(0, ["a", "b", "c"])], last=5)
    res = audit.audit_ledger(md, {"a": 0.0, "b": 0.0}, 1.0, 0.0, False)
    pool = ["d", "e", "f"]

    def choose(ens, slot, exclude):
        for b in pool:
            if b not in exclude:
                return b
        raise errors.NotEnoughBookies()
    planned, unplaced = audit.plan_replacements(res.work, {"a", "b"}, choose)
    assert [w.replacement for w in planned] == ["d", "e"] and unplaced == []


def test_plan_replacements_not_enough():
    md = _md([(0, ["a", "b", "c"])], last=5)
    res = audit.audit_ledger(md, {"a": 0.0}, 1.0, 0.0, False)
    planned, unplaced = audit.plan_replacements(res.work, {"a"}, lambda e, s, x: (
        _ for _ in ()).throw(errors.NotEnoughBookies()))
    assert planned == [] and len(unplaced) == 1
    assert isinstance(unplaced[0][1], errors.NotEnoughBookies)


# -- dead-writer selection ----------------------------------------------------------------------
def test_select_for_recovery_rules():
    closed = _md([(0, ["a", "b", "c"])])
    assert not audit.select_for_recovery(closed, False, 0, 0, True).recover
    op = _md([(0, ["a", "b", "c"])], state=lm.OPEN, ctime_ms=1_000_000)
    assert not audit.select_for_recovery(op, True, 2_000_000, 0, False).recover
    assert audit.select_for_recovery(op, True, 2_000_000, 0, True).recover
    assert audit.select_for_recovery(op, False, 2_000_000, 0, False).recover
    young = audit.select_for_recovery(op, False, 1_000_500, 10, False)
    assert not young.recover and "min-idle" in young.reason
