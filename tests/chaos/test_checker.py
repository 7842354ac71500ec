"""The checker on hand-built histories and final states (no processes):
each invariant is shown to fire on a bad history and to stay quiet on a
good one, including the unknown-outcome rules."""
from __future__ import annotations

from pybk_spark.protocol import ledger_metadata as lm
from pybk_spark.protocol.recovery import RecoveryDecision

from . import checker as chk
from .history import History, digest, load_histories, pair_ops


def _d(i):
    return digest(f"w:{i}:x".encode())


def _ops(tmp_path, records):
    """records: (proc, op, outcome, fields) -> paired ops via real files;
    op "recovery" (fields: a RecoveryDecision) is a recovery's recorded decision."""
    hists = {}
    for proc, op, outcome, fields in records:
        h = hists.setdefault(proc, History(str(tmp_path / f"{proc}.jsonl"), proc))
        if op == "recovery":
            h.recovery(fields)
            continue
        inv = {k: v for k, v in fields.items() if k in ("ledger", "digests", "log", "session",
                                                        "offset")}
        op_id = h.invoke(op, **inv)
        if outcome is not None:
            h.complete(op_id, op, outcome, **{k: v for k, v in fields.items() if k != "digests"
                                               or op == "read"})
    for h in hists.values():
        h.close()
    return pair_ops(load_histories(str(tmp_path)))


def _ledger(lid, n, last=None, qa=2, qw=3, beyond=None):
    last = n - 1 if last is None else last
    fl = chk.FinalLedger(lid, lm.CLOSED, last, qa, qw, digests=[_d(i) for i in range(last + 1)])
    fl.beyond_quorum = beyond or {}
    fl.snapshot = (lm.CLOSED, last, 0, 3, qw, qa, (0,))
    return fl


def _adds(n, outcome="ok", lid=1, start=0):
    return [("w", "add", outcome, {"ledger": lid, "digests": [_d(i)], "entry": i})
            for i in range(start, start + n)]


def test_good_history_has_no_violation(tmp_path):
    ops = _ops(tmp_path, _adds(5) + [("r", "read", "ok", {"ledger": 1, "entry": 0,
                                                         "digests": [_d(0), _d(1)]})])
    final = chk.FinalState(ledgers={1: _ledger(1, 5)})
    assert chk.check(ops, final) == []


def test_lost_acked_entry_is_reported_with_its_history(tmp_path):
    ops = _ops(tmp_path, _adds(5))
    final = chk.FinalState(ledgers={1: _ledger(1, 5, last=2)})     # closed too early
    vs = chk.check(ops, final)
    assert {(v.invariant, v.entry) for v in vs} >= {("I1", 3), ("I1", 4)}
    hist = chk.minimal_history(ops, vs[0])
    assert hist and all(op["ledger"] == 1 for op in hist)


def test_unknown_outcome_may_or_may_not_be_present(tmp_path):
    ops = _ops(tmp_path, _adds(3) + _adds(2, outcome="unknown", start=3))
    for last in (2, 3, 4):
        assert chk.check(ops, chk.FinalState(ledgers={1: _ledger(1, 5, last=last)})) == []


def test_killed_process_leaves_unknown_ops(tmp_path):
    ops = _ops(tmp_path, _adds(2) + [("w", "add", None, {"ledger": 1, "digests": [_d(2)]})])
    assert ops[-1]["outcome"] == "unknown"
    assert chk.check(ops, chk.FinalState(ledgers={1: _ledger(1, 3)})) == []


def test_failed_op_present_is_a_violation(tmp_path):
    ops = _ops(tmp_path, _adds(2) + _adds(1, outcome="fail", start=2))
    vs = chk.check(ops, chk.FinalState(ledgers={1: _ledger(1, 3)}))
    assert [v.invariant for v in vs] == ["I1"] and "FAILED" in vs[0].message


def test_different_payload_and_phantom_entry(tmp_path):
    ops = _ops(tmp_path, _adds(3))
    fl = _ledger(1, 3)
    fl.digests[1] = digest(b"someone else")
    vs = chk.check(ops, chk.FinalState(ledgers={1: fl}))
    msgs = " ".join(v.message for v in vs)
    assert "differs" in msgs and "no invoked operation" in msgs


def test_out_of_order_entries(tmp_path):
    ops = _ops(tmp_path, _adds(3, outcome="unknown"))
    fl = _ledger(1, 3)
    fl.digests = [_d(0), _d(2), _d(1)]
    vs = chk.check(ops, chk.FinalState(ledgers={1: fl}))
    assert any("out of invoke order" in v.message for v in vs)


def test_beyond_last_on_an_ack_quorum(tmp_path):
    ops = _ops(tmp_path, _adds(3))
    ok_final = chk.FinalState(ledgers={1: _ledger(1, 3, beyond={3: 1, 4: 2})})
    assert chk.check(ops, ok_final) == []          # 4 cannot be acked before 3
    bad = chk.FinalState(ledgers={1: _ledger(1, 3, beyond={3: 2})})
    assert [v.invariant for v in chk.check(ops, bad)] == ["I2"]


def test_beyond_last_rewritten_by_a_recovery_that_lost_the_close_race(tmp_path):
    """Seed 12002 (tests/chaos/test_regression_12002.py): recovery A closed
    at 2; recovery B had found 3-5 and re-wrote them to every bookie before
    converging on A's close.  B's recorded decision explains the copies."""
    lost_race = ("lw", "recovery", None, RecoveryDecision(1, 1, 5))
    closer = ("rec", "recovery", None, RecoveryDecision(1, 2, 2))
    final = chk.FinalState(ledgers={1: _ledger(1, 3, qa=3, beyond={3: 3, 4: 3, 5: 3})})
    ops = _ops(tmp_path, _adds(3) + [closer, lost_race])
    assert chk.check(ops, final) == []
    assert [op["op"] for op in chk.minimal_history(ops, chk.Violation("I2", "", 1, 3))
            if op["outcome"] == "note"] == ["recovery", "recovery"]


def test_beyond_last_that_no_recovery_rewrote_is_still_a_fencing_hole(tmp_path):
    final = chk.FinalState(ledgers={1: _ledger(1, 3, qa=3, beyond={3: 3})})
    unexplained = [
        [],                                                          # no recovery recorded
        [("rec", "recovery", None, RecoveryDecision(1, 2, 2))],      # found nothing past 2
        [("rec", "recovery", None, RecoveryDecision(1, 3, 6))],      # re-wrote from 4 only
        [("rec", "recovery", None, RecoveryDecision(2, 1, 5))],      # another ledger
    ]
    for i, notes in enumerate(unexplained):
        d = tmp_path / str(i)
        d.mkdir()
        vs = chk.check(_ops(d, _adds(3) + notes), final)
        assert [(v.invariant, v.entry) for v in vs] == [("I2", 3)], notes


def test_beyond_last_is_judged_on_the_writers_bookies_not_a_later_replacement():
    """Chaos seed 2026112620, ledger 1213 (E=3 Qw=Qa=2): the writer's changes
    took slot 1 from bookie-2 to bookie-5 to bookie-4, recovery closed at 6
    (bookie-4 lacked entry 7), and autorecovery then put bookie-2 back in
    slot 1 with its copy of 7 from its first membership.  Entry 7's write set
    in the current ensemble is bookie-2 and bookie-3, both holding it; in the
    writer's last ensemble, which recovery recorded, it is bookie-4 and
    bookie-3: the copies that could have made an ack quorum."""
    md = lm.LedgerMetadata.from_json(
        b'{"ack_quorum": 2, "ensemble_size": 3, "write_quorum": 2, "ledger_id": 1213, '
        b'"ensembles": [[0, ["bookie-1", "bookie-2", "bookie-3"]]], "last_entry_id": 6, '
        b'"length": 815, "state": "CLOSED", "digest_type": "crc32c", '
        b'"writer_ensemble": ["bookie-1", "bookie-4", "bookie-3"]}')
    assert chk.beyond_bookies(md, 7) == ["bookie-4", "bookie-3"]
    assert chk.beyond_bookies(md, 8) == ["bookie-3", "bookie-1"]
    never_recovered = lm.LedgerMetadata.from_json(md.to_json().replace(
        b', "writer_ensemble": ["bookie-1", "bookie-4", "bookie-3"]', b""))
    assert never_recovered.writer_ensemble is None
    assert chk.beyond_bookies(never_recovered, 7) == ["bookie-2", "bookie-3"]


def test_closed_length_must_be_the_payload_bytes_read_back(tmp_path):
    ops = _ops(tmp_path, _adds(3))
    fl = _ledger(1, 3)
    fl.length, fl.payload_bytes = 0, 120           # a recovery close that recorded 0
    assert [v.invariant for v in chk.check(ops, chk.FinalState(ledgers={1: fl}))] == ["I7"]
    fl.length = 120
    assert chk.check(ops, chk.FinalState(ledgers={1: fl})) == []
    fl.payload_bytes = None                        # unreadable: I1 judges, not I7
    assert chk.check_lengths(chk.FinalState(ledgers={1: fl})) == []


def test_reader_saw_other_sequence_or_beyond_last(tmp_path):
    ops = _ops(tmp_path, _adds(3) + [
        ("r", "read", "ok", {"ledger": 1, "entry": 1, "digests": [_d(2)]}),
        ("r", "read", "ok", {"ledger": 1, "entry": 2, "digests": [_d(2), _d(3)]})])
    vs = chk.check(ops, chk.FinalState(ledgers={1: _ledger(1, 3)}))
    assert [v.invariant for v in vs] == ["I3", "I3"]


def test_a_gone_ledger_is_a_violation_only_if_a_tracked_writer_wrote_it(tmp_path):
    """A tailing reader may read a ledger no tracked process wrote (a Spark
    sink task's) that is deleted afterwards by design (its attempt aborted):
    no violation.  A tracked writer's ledger that is gone still is one."""
    ops = _ops(tmp_path, _adds(3) + [
        ("r", "read", "ok", {"ledger": 1, "entry": 0, "digests": [_d(0)]}),
        ("r", "read", "ok", {"ledger": 9, "entry": 0, "digests": [_d(0)]})])
    assert chk.check_readers(ops, chk.FinalState(ledgers={1: _ledger(1, 3)})) == []
    vs = chk.check_readers(ops, chk.FinalState(ledgers={}))
    assert [(v.invariant, v.ledger) for v in vs] == [("I3", 1)]


def test_closed_metadata_must_not_change():
    snaps = [(1.0, 1, (lm.OPEN, -1, 0, 3, 3, 2, (0,))),
             (2.0, 1, (lm.CLOSED, 4, 0, 3, 3, 2, (0,))),
             (3.0, 1, (lm.CLOSED, 5, 0, 3, 3, 2, (0,)))]
    vs = chk.check_metadata(snaps, chk.FinalState())
    assert [v.invariant for v in vs] == ["I4"]
    assert chk.check_metadata(snaps[:2], chk.FinalState()) == []


def test_log_gap_duplicate_and_reader_prefix(tmp_path):
    appends = [("lw", "append", "ok", {"log": "a", "digests": [_d(i)], "ledger": 1 + i // 2,
                                       "entry": i % 2}) for i in range(4)]
    reads = [("r", "read", "ok", {"log": "a", "session": 0, "offset": 0,
                                  "digests": [_d(0), _d(1), _d(2)]})]
    ops = _ops(tmp_path, appends + reads)
    good = chk.FinalState(ledgers={1: _ledger(1, 2), 2: _ledger(2, 2)}, logs={"a": [1, 2]})
    good.ledgers[2].digests = [_d(2), _d(3)]
    assert chk.check(ops, good) == []
    bad = chk.FinalState(ledgers={1: _ledger(1, 2), 2: _ledger(2, 2)}, logs={"a": [1, 2]})
    bad.ledgers[2].digests = [_d(1), _d(3)]          # duplicate of 1, append 2 lost
    kinds = sorted(v.invariant for v in chk.check(ops, bad))
    assert "I5" in kinds and "I3" in kinds


def test_replicas_floor_and_strict():
    fl = _ledger(1, 2)
    fl.replicas = {0: 3, 1: 2}
    final = chk.FinalState(ledgers={1: fl}, replicas_checked=True)
    assert chk.check_replicas(final, strict=False) == []
    assert [v.entry for v in chk.check_replicas(final, strict=True)] == [1]
    fl.replicas = {0: 1, 1: 3}
    assert [v.entry for v in chk.check_replicas(final, strict=False)] == [0]


def test_i8_sink_exactly_once():
    """The Spark sink log must hold every source log entry once, unchanged."""
    final = chk.FinalState(ledgers={1: _ledger(1, 3), 2: _ledger(2, 2)}, logs={"a": [1, 2]})
    good = [[1, 0, _d(0)], [1, 1, _d(1)], [1, 2, _d(2)], [2, 0, _d(0)], [2, 1, _d(1)]]
    assert chk.check_sink({"a": good}, final) == []
    assert chk.sink_totals({"a": good}, final)["a"] == {
        "source_entries": 5, "sink_rows": 5, "duplicates": 0, "lost": 0}
    dup = good + [[1, 1, _d(1)]]
    assert [v.message for v in chk.check_sink({"a": dup}, final)] == [
        "source entry written to a-sink more than once"]
    lost = good[:-1]
    (v,) = chk.check_sink({"a": lost}, final)
    assert v.invariant == "I8" and "1 source entries missing" in v.message
    changed = good[:-1] + [[2, 1, _d(9)]]
    assert "differs" in chk.check_sink({"a": changed}, final)[0].message
    assert "no entry of the source" in chk.check_sink({"a": good + [[7, 0, _d(0)]]},
                                                      final)[0].message
    assert chk.check_sink(None, final)[0].invariant == "I8"


def test_spark_ledgers_are_not_entries_from_nowhere():
    sink = _ledger(9, 2)
    sink.digests = [digest(b"arrow-1"), digest(b"arrow-2")]
    sink.foreign = True
    final = chk.FinalState(ledgers={9: sink})
    assert chk.check_acked([], final) == []
    sink.foreign = False
    assert chk.check_acked([], final)


def test_autorecovery_totals_count_failed_copies_by_reason(tmp_path):
    """The autorecovery workers' round notes, through real history files,
    summed: the failed copies by reason add up to the failed count."""
    h = History(str(tmp_path / "ar0.jsonl"), "ar0")
    h.note("autorecovery", lost=["b1"], fragments_copied=3, fragments_failed=3,
           failed_by_reason={"ReadError": 1, "NotEnoughBookies": 2})
    h.note("autorecovery", lost=[], fragments_copied=0, fragments_failed=1,
           failed_by_reason={"ReadError": 1})
    h.note("autorecovery", error="Timeout: etcd unreachable")
    h.note("ledger", ledger=7)
    h.close()
    got = chk.autorecovery_totals(pair_ops(load_histories(str(tmp_path))))
    assert got == {"rounds": 3, "copied": 3, "failed": 4, "rounds_with_lost": 1, "errors": 1,
                   "failed_by_reason": {"NotEnoughBookies": 2, "ReadError": 2}}
    assert list(got["failed_by_reason"]) == ["NotEnoughBookies", "ReadError"]   # tie: by name
    assert sum(got["failed_by_reason"].values()) == got["failed"]


def test_autorecovery_totals_count_rounds_by_leadership(tmp_path):
    """I10's notes: each round's leadership, counted by kind."""
    h = History(str(tmp_path / "ar0.jsonl"), "ar0")
    for state in ("leader", "leader", "unknown", "standby", "error"):
        h.note("autorecovery", leadership=state, **({"error": "x"} if state == "error" else {}))
    h.close()
    got = chk.autorecovery_totals(pair_ops(load_histories(str(tmp_path))))
    assert (got["rounds"], got["rounds_leader"], got["rounds_unknown"], got["rounds_standby"],
            got["rounds_error"]) == (5, 2, 1, 1, 1)
    assert chk.autorecovery_totals([]) == {}


def test_offloaded_files_that_differ_from_their_ledger_are_reported(tmp_path):
    ops = _ops(tmp_path, _adds(5) + [("v", "append", "ok", {"ledger": 2, "digests": [_d(10 + i)],
                                                            "entry": i}) for i in range(3)])
    kept = _ledger(1, 5)
    kept.files = list(kept.digests)
    gone = chk.FinalLedger(2, lm.CLOSED, 2, 1, 1, digests=[_d(10 + i) for i in range(3)],
                           offloaded=True)           # judged from its files alone
    final = chk.FinalState(ledgers={1: kept, 2: gone})
    assert chk.check(ops, final) == []
    kept.files = kept.digests[:2] + [_d(9)] + kept.digests[3:]
    (v,) = chk.check(ops, final)
    assert (v.invariant, v.ledger, v.entry) == ("I11", 1, 2)
    kept.files, kept.files_error = None, "OffloadCorrupt('x.parquet')"
    assert [v.invariant for v in chk.check(ops, final)] == ["I11"]
    gone.digests, gone.read_error = None, "OffloadCorrupt('y.parquet')"
    assert {v.invariant for v in chk.check(ops, final)} == {"I1", "I11"}
