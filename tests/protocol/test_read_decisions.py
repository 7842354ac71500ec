"""Read decisions: verified prefix, merged sparse answers, re-replication rows,
LAC coverage, replica order / speculative reads and the read verdict, each
checked against a naive oracle."""
import itertools

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from pybk_spark import errors
from pybk_spark.protocol import read_decisions as rd
from pybk_spark.protocol import recovery as rc
from pybk_spark.protocol.distribution import is_covered, write_set


# -- answer kinds --------------------------------------------------------------------------------
def test_answer_kind_of_each_outcome():
    assert rd.answer_kind(None) == rd.OK
    assert rd.answer_kind(errors.NoSuchLedger(ledger_id=1)) == rd.NO_LEDGER
    assert rd.answer_kind(errors.NoSuchEntry(ledger_id=1, entry_id=2)) == rd.NO_ENTRY
    for exc in (errors.BookieUnavailable("down"), errors.Timeout("slow"),
                errors.Unauthorized("wrong key"), errors.LedgerFenced(), OSError("reset")):
        assert rd.answer_kind(exc) == rd.ERROR, exc


# -- verified prefix -----------------------------------------------------------------------------
def test_verified_prefix_cuts_at_the_first_bad_row():
    assert rd.verified_prefix(np.array([True, True, True])) == 3
    assert rd.verified_prefix(np.array([True, False, True])) == 1      # rows after it dropped
    assert rd.verified_prefix(np.array([False, True])) == 0
    assert rd.verified_prefix(np.array([], dtype=bool)) == 0


def test_usable_prefix_needs_the_wanted_first_id():
    calls = []

    def verify():
        calls.append(1)
        return np.array([True, True, False])
    assert rd.usable_prefix(None, 5, verify) == 0
    assert rd.usable_prefix(6, 5, verify) == 0
    assert calls == []                          # digests not checked for a wrong answer
    assert rd.usable_prefix(5, 5, verify) == 2
    assert calls == [1]


@given(st.lists(st.booleans(), max_size=12))
def test_verified_prefix_matches_naive(ok):
    n = 0
    while n < len(ok) and ok[n]:
        n += 1
    assert rd.verified_prefix(np.array(ok, dtype=bool)) == n


# -- merged sparse answers ---------------------------------------------------------------------
def _naive_first_copies(ids, first):
    seen = {}
    for pos, e in enumerate(ids):
        seen.setdefault(e, pos)
    out, e = [], first
    while e in seen:
        out.append(seen[e])
        e += 1
    return out


@settings(max_examples=300)
@given(st.lists(st.integers(0, 12), max_size=30), st.integers(0, 4))
def test_gap_free_first_copies_matches_naive(ids, first):
    ids = [e for e in ids if e >= first]
    got = rd.gap_free_first_copies(np.array(ids, dtype=np.int64), first)
    assert got.tolist() == _naive_first_copies(ids, first)


def test_gap_free_first_copies_examples():
    # two bookies' answers concatenated: the first copy of each id wins
    assert rd.gap_free_first_copies(np.array([0, 2, 1, 2, 3]), 0).tolist() == [0, 2, 1, 4]
    assert rd.gap_free_first_copies(np.array([0, 1, 3]), 0).tolist() == [0, 1]   # gap at 2
    assert rd.gap_free_first_copies(np.array([1, 2]), 0).tolist() == []          # no front


def test_copy_rows_keeps_verified_wanted_rows_only():
    ids = np.array([3, 4, 5, 6])
    ok = np.array([True, False, True, True])
    assert rd.copy_rows(ids, ok, np.array([3, 4, 6])).tolist() == [True, False, False, True]


# -- LAC coverage ------------------------------------------------------------------------------
def test_lac_coverage_exhaustive_matches_coverage():
    kinds_all = [rd.OK, rd.NO_LEDGER, rd.NO_ENTRY, rd.ERROR, None]
    for E in range(1, 5):
        for Qw in range(1, E + 1):
            for Qa in range(1, Qw + 1):
                for kinds in itertools.product(kinds_all, repeat=E):
                    cov = rd.LacCoverage(E, Qw, Qa, floor=3)
                    for s, k in enumerate(kinds):
                        if k is not None:
                            cov.on_answer(s, k, 10 * s)
                    answered = {s for s, k in enumerate(kinds)
                                if k in (rd.OK, rd.NO_LEDGER, rd.NO_ENTRY)}
                    assert cov.covered == is_covered(E, Qw, Qa, answered)
                    alive = {s for s, k in enumerate(kinds) if k != rd.ERROR}
                    assert cov.impossible == (not is_covered(E, Qw, Qa, alive))
                    lacs = [10 * s for s, k in enumerate(kinds) if k == rd.OK]
                    assert cov.max_lac == max(lacs, default=-1)
                    assert cov.lac == max(lacs + [3])


def test_fence_phase_is_the_lac_coverage():
    """Recovery's fence phase and the readers' LAC query are one machine."""
    assert rc.FenceLacPhase is rd.LacCoverage
    ph = rc.FenceLacPhase(3, 2, 2)
    assert ph.floor == -1 and ph.lac == -1


# -- replica order, speculative reads, verdict ----------------------------------------------------
def test_replica_order_rotates_the_write_set():
    for E, Qw in ((3, 2), (5, 3), (4, 4)):
        for e in range(2 * E):
            ws = write_set(e, E, Qw)
            orders = {rd.replica_order(e, E, Qw, turn) for turn in range(Qw)}
            assert len(orders) == Qw                  # every replica goes first once
            for order in orders:
                assert sorted(order) == sorted(ws)
            assert rd.replica_order(e, E, Qw, 0) == ws
            assert rd.replica_order(e, E, Qw, 1) == ws[1:] + ws[:1]


def test_replica_run_speculative_then_failover():
    run = rd.ReplicaRun((2, 0, 1))
    assert run.next_replica() == 2
    assert run.wait_limit(0.5) == 0.5
    assert run.on_silence() == 0                      # slow: ask the next one as well
    assert run.on_answer(rd.ERROR) is None            # the other is still out
    assert run.on_answer(rd.CORRUPT) == 1             # nothing out: next untried
    assert run.wait_limit(0.5) is None                # nobody left to ask
    assert run.on_silence() is None
    assert run.on_answer(rd.NO_ENTRY) is None
    assert run.exhausted and run.verdict == rd.BAD_DIGEST


def _naive_verdict(kinds):
    if all(k == rd.CORRUPT for k in kinds):
        return rd.BAD_DIGEST_ALL
    if all(k in (rd.NO_ENTRY, rd.NO_LEDGER) for k in kinds):
        return rd.MISSING
    if rd.CORRUPT in kinds:
        return rd.BAD_DIGEST
    return rd.FAILED


def test_replica_run_verdict_exhaustive():
    kinds_all = [rd.CORRUPT, rd.NO_ENTRY, rd.NO_LEDGER, rd.ERROR]
    for n in range(1, 5):
        for kinds in itertools.product(kinds_all, repeat=n):
            run = rd.ReplicaRun(tuple(range(n)))
            asked = [run.next_replica()]
            for k in kinds:
                nxt = run.on_answer(k)
                if nxt is not None:
                    asked.append(nxt)
            assert asked == list(range(n))            # each replica once, in order
            assert run.exhausted
            assert run.verdict == _naive_verdict(kinds)


@given(st.integers(1, 5), st.lists(st.sampled_from(["silence", "answer"]), max_size=20))
def test_replica_run_never_asks_twice(n, events):
    run = rd.ReplicaRun(tuple(range(n)))
    asked = [run.next_replica()]
    for ev in events:
        if ev == "silence":
            nxt = run.on_silence()
        elif run.outstanding:
            nxt = run.on_answer(rd.ERROR)
        else:
            continue
        if nxt is not None:
            asked.append(nxt)
        assert run.outstanding >= 0
    assert asked == list(range(len(asked))) and len(asked) <= n


# -- recovery's probe: a positive answer that already arrived wins ---------------------------------
def test_probe_settled_waits_for_an_arrived_success():
    p = rc.EntryProbe(12, 3, 2, 2)
    a, b = p.slots
    p.on_answer(a, rc.NO_ENTRY)
    assert p.status == rc.MISSING
    assert not p.settled(success_arrived_unread=True)     # read it first
    assert p.settled(success_arrived_unread=False)
    p.on_answer(b, rc.OK)
    assert p.status == rc.EXISTS and p.settled(True)
    q = rc.EntryProbe(5, 5, 3, 2)
    assert not q.settled(False)                            # undecided: keep waiting
    for s in q.slots:
        q.on_answer(s, rc.ERROR)
    assert q.status == rc.UNRECOVERABLE and q.settled(False)
