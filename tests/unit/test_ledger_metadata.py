"""Pure metadata transforms: the protocol's close rules, recovery convergence and
the fragment invariants (#2615)."""
import pytest

from pybk_spark import errors
from pybk_spark.protocol import ledger_metadata as lm

ENS = ("b1", "b2", "b3")


def fresh(**kw):
    return lm.new_ledger(1, kw.pop("ensemble", ENS), kw.pop("wq", 2), kw.pop("aq", 2), **kw)


@pytest.mark.parametrize("e,w,a", [(2, 3, 1), (3, 2, 3), (3, 3, 0), (0, 0, 0), (3, 1, 2)])
def test_bad_quorums_are_rejected(e, w, a):
    with pytest.raises(errors.IncorrectParameter):
        lm.validate_quorums(e, w, a)


def test_non_integer_quorums_are_rejected():
    with pytest.raises(errors.IncorrectParameter):
        lm.validate_quorums(3, "2", 2)


def test_json_round_trip():
    md = fresh(custom={"app": "x"}, password=b"pw")
    assert lm.LedgerMetadata.from_json(md.to_json()) == md


def test_corrupt_json_is_a_metadata_error():
    with pytest.raises(errors.MetadataError):
        lm.LedgerMetadata.from_json(b"{")


def test_writer_close_rules():
    md = fresh()
    closed = lm.close_by_writer(md, 11, 100)
    assert (closed.state, closed.last_entry_id) == (lm.CLOSED, 11)
    assert lm.close_by_writer(closed, 11, 100) is closed            # same last entry: success
    with pytest.raises(errors.LedgerClosed):
        lm.close_by_writer(closed, 12, 100)                          # different: error
    with pytest.raises(errors.LedgerFenced):
        lm.close_by_writer(lm.to_in_recovery(md), 11, 100)           # in recovery: error


def test_recoveries_converge_on_first_close():
    md = lm.to_in_recovery(fresh())
    first = lm.close_by_recovery(md, 12, 0)
    assert lm.close_by_recovery(first, 9, 0).last_entry_id == 12


def test_closed_ledger_needs_no_recovery():
    closed = lm.close_by_writer(fresh(), 3, 0)
    assert lm.to_in_recovery(closed) is closed


def test_ensemble_change_by_writer_only_while_open():
    md = fresh(ensemble=("b1", "b2", "b3"))
    changed = lm.replace_bookies(md, 12, {0: "b4"})
    assert changed.ensembles == ((0, ENS), (12, ("b4", "b2", "b3")))
    assert changed.ensemble_for(11) == ENS and changed.ensemble_for(12)[0] == "b4"
    with pytest.raises(errors.LedgerFenced):
        lm.replace_bookies(lm.to_in_recovery(md), 12, {0: "b4"})


def test_new_fragment_never_starts_before_the_last_one():
    md = lm.replace_bookies(fresh(), 12, {0: "b4"})
    with pytest.raises(errors.IllegalOp):
        lm.replace_bookies(md, 5, {1: "b5"})
    same = lm.replace_bookies(md, 12, {1: "b5"})
    assert same.ensembles[-1] == (12, ("b4", "b5", "b3"))


def test_duplicate_bookies_refused():
    with pytest.raises(errors.IllegalOp):
        lm.replace_bookies(fresh(), 0, {0: "b2"})
    with pytest.raises(errors.IncorrectParameter):
        fresh(ensemble=("b1", "b1", "b2"))


def test_fragments_view():
    md = lm.replace_bookies(fresh(), 12, {0: "b4"})
    assert md.fragments() == [(0, 11, ENS), (12, -1, ("b4", "b2", "b3"))]
    closed = lm.close_by_writer(md, 20, 0)
    assert closed.fragments() == [(0, 11, ENS), (12, 20, ("b4", "b2", "b3"))]
    empty = lm.close_by_writer(fresh(), -1, 0)
    assert empty.fragments() == []


def test_rereplication_swaps_one_bookie_in_a_complete_fragment():
    md = lm.close_by_writer(lm.replace_bookies(fresh(), 12, {0: "b4"}), 20, 0)
    moved = lm.replace_fragment_bookie(md, 0, "b2", "b5")
    assert moved.ensembles[0] == (0, ("b1", "b5", "b3"))
    assert lm.replace_fragment_bookie(moved, 0, "b2", "b5") is moved   # idempotent
    with pytest.raises(errors.IllegalOp):
        lm.replace_fragment_bookie(fresh(), 0, "b2", "b5")               # still being written


def test_password_check():
    md = fresh(password=b"secret")
    lm.check_password(md, b"secret")
    with pytest.raises(errors.Unauthorized):
        lm.check_password(md, b"wrong")


def test_recovery_records_the_writers_ensemble_and_reads_both_bookies_of_a_replaced_slot():
    md = lm.new_ledger(7, ("a", "b", "c", "d"), 2, 2)
    assert md.writer_ensemble is None and b"writer_ensemble" not in md.to_json()
    rec = lm.to_in_recovery(md)
    assert rec.writer_ensemble == ("a", "b", "c", "d")
    assert lm.to_in_recovery(rec) is rec                      # idempotent
    changed = lm.replace_bookies(rec, 19, {3: "e"}, by_writer=False)
    again = lm.LedgerMetadata.from_json(changed.to_json())
    assert again == changed and again.writer_ensemble == ("a", "b", "c", "d")
    assert lm.recovery_read_bookies(again, 3) == ("e", "d")   # replaced: both
    assert lm.recovery_read_bookies(again, 0) == ("a",)
    assert lm.recovery_read_bookies(md, 3) == ("d",)          # never recovered


def test_a_recovery_does_not_close_over_a_concurrent_recoverys_ensemble_change():
    rec = lm.to_in_recovery(lm.new_ledger(7, ("a", "b", "c"), 2, 2))
    assert not lm.recovery_replaced_tail(rec)
    mine = rec.ensembles
    theirs = lm.replace_bookies(rec, 5, {1: "d"}, by_writer=False)
    assert lm.recovery_replaced_tail(theirs)
    with pytest.raises(errors.RecoveryRaced):
        lm.close_by_recovery(theirs, 9, 0, wrote_through=mine)
    closed = lm.close_by_recovery(theirs, 9, 0, wrote_through=theirs.ensembles)
    assert closed.last_entry_id == 9
    assert lm.close_by_recovery(closed, 12, 0, wrote_through=mine) is closed   # first close stands
