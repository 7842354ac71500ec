"""Pure log-metadata transforms: the protocol's leader-open, roll and truncation
orders, and the atomic / exactly-once batch commit."""
import pytest

from pybk_spark import errors
from pybk_spark.protocol import log_metadata as logmd


def test_leader_open_appends_after_fencing_the_tail():
    md = logmd.new_log("orders")
    md = logmd.open_as_leader(md, logmd.tail_ids(md), {}, 10)
    assert md.ledger_ids == [10] and md.epoch == 1
    assert md.segments[0].start_offset == 0
    md2 = logmd.open_as_leader(md, logmd.tail_ids(md), {10: (41, 1000)}, 11)
    assert md2.ledger_ids == [10, 11]
    assert md2.segments[0].entry_count == 42 and md2.segments[1].start_offset == 42


def test_leader_open_refuses_when_the_tail_moved():
    md = logmd.open_as_leader(logmd.new_log("l"), (), {}, 10)
    stale_tail = logmd.tail_ids(md)
    md = logmd.roll(md, 10, 11)            # another leader rolled meanwhile
    with pytest.raises(logmd.LeaderConflict):
        logmd.open_as_leader(md, stale_tail, {}, 12)


def test_roll_only_by_the_tail_owner():
    md = logmd.open_as_leader(logmd.new_log("l"), (), {}, 10)
    md = logmd.roll(md, 10, 11)
    assert md.ledger_ids == [10, 11]
    with pytest.raises(errors.LedgerFenced):
        logmd.roll(md, 10, 12)


def test_truncation_drops_whole_closed_segments_and_keeps_offsets():
    md = logmd.open_as_leader(logmd.new_log("l"), (), {}, 10)
    md = logmd.roll(md, 10, 11)
    md = logmd.record_closed(md, {10: (9, 100)})
    md = logmd.roll(md, 11, 12)
    md = logmd.record_closed(md, {11: (4, 50)})
    new, dropped = logmd.truncate_before(md, 12)
    assert dropped == [10, 11] and new.ledger_ids == [12]
    assert new.truncated_offset == 15 and new.segments[0].start_offset == 15
    assert new.position(12, 0) > md.position(11, 4)  # ordering survives truncation
    with pytest.raises(errors.LogTruncated):
        new.segment_index(10)


def test_cannot_truncate_open_segments():
    md = logmd.roll(logmd.open_as_leader(logmd.new_log("l"), (), {}, 10), 10, 11)
    with pytest.raises(errors.IllegalOp):
        logmd.truncate_before(md, 11)


def test_batch_commit_is_exactly_once_per_sink_batch():
    md = logmd.new_log("l")
    md, _ = logmd.append_closed(md, [(1, 5, 50, 500)], schema="S", sink=("q", 0))
    again, replaced = logmd.append_closed(md, [(2, 5, 50, 500)], schema="S", sink=("q", 0))
    assert again is md and replaced == []
    md, _ = logmd.append_closed(md, [(3, 1, 1, 1)], schema="S", sink=("q", 1))
    assert md.ledger_ids == [1, 3] and md.sink_commits == {"q": 1}


def test_schema_mismatch_fails_before_anything_changes():
    md, _ = logmd.append_closed(logmd.new_log("l"), [(1, 1, 1, 1)], schema="A")
    with pytest.raises(errors.SchemaMismatch):
        logmd.append_closed(md, [(2, 1, 1, 1)], schema="B")


def test_overwrite_swaps_the_list_and_names_what_to_delete():
    md, _ = logmd.append_closed(logmd.new_log("l"), [(1, 3, 3, 3), (2, 3, 3, 3)], schema="A")
    new, replaced = logmd.append_closed(md, [(5, 2, 2, 2)], schema="B", overwrite=True)
    assert replaced == [1, 2] and new.ledger_ids == [5] and new.schema == "B"
    assert new.segments[0].start_offset == 6


def test_json_round_trip():
    md, _ = logmd.append_closed(logmd.new_log("l"), [(1, 3, 3, 3)], schema="A", sink=("q", 4))
    assert logmd.LogMetadata.from_json(md.to_json()) == md


@pytest.mark.parametrize("name", ["", "a/b", "x" * 201])
def test_bad_log_names(name):
    with pytest.raises(errors.IncorrectParameter):
        logmd.new_log(name)


def test_append_closed_evolves_the_schema_only_from_the_base_it_checked():
    from pybk_spark.protocol import log_metadata as logmd
    md, _ = logmd.append_closed(logmd.new_log("evo"), [(1, 1, 10, 1)], schema="A")
    with pytest.raises(errors.SchemaMismatch):
        logmd.append_closed(md, [(2, 1, 10, 1)], schema="AB")
    evolved, _ = logmd.append_closed(md, [(2, 1, 10, 1)], schema="AB", base_schema="A")
    assert evolved.schema == "AB" and evolved.ledger_ids == [1, 2]
    with pytest.raises(errors.SchemaMismatch):                # changed concurrently to "AC"
        logmd.append_closed(evolved, [(3, 1, 10, 1)], schema="AC", base_schema="A")


def test_one_password_per_log_recorded_as_its_check():
    from pybk_spark.protocol.ledger_metadata import key_check
    pw1, pw2 = key_check(b"pw1"), key_check(b"pw2")
    old = logmd.new_log("l")                       # a log that records no password
    assert b"password_check" not in old.to_json()
    assert logmd.LogMetadata.from_json(old.to_json()) == old
    md = logmd.claim_password(old, pw1)
    assert md.password_check == pw1 and b"pw1" not in md.to_json()
    assert logmd.LogMetadata.from_json(md.to_json()) == md
    assert logmd.claim_password(md, pw1) is md     # the same password: unchanged
    with pytest.raises(errors.Unauthorized, match="wrong password for log 'l'"):
        logmd.claim_password(md, pw2)
    head, _ = logmd.head_from_json(logmd.head_to_json(md, md.segments, ()))
    assert head.password_check == pw1


def test_password_for_picks_the_password_a_ledger_records():
    from pybk_spark.protocol import ledger_metadata as lm
    md = lm.new_ledger(7, ("b1",), 1, 1, password=b"pw2")
    assert lm.password_for(md, [b"pw1", b"pw2"]) == b"pw2"
    with pytest.raises(errors.Unauthorized, match="none of the 2 passwords"):
        lm.password_for(md, [b"pw1", b"pw3"])
    with pytest.raises(errors.Unauthorized, match="wrong password for ledger"):
        lm.password_for(md, [b"pw1"])
