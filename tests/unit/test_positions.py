"""Registered read positions: forward-only CAS transform and the retention rule (pure)."""
import pytest

from pybk_spark import errors
from pybk_spark.protocol.positions import RegisteredPosition, advance, blockers, check_name


def at(index, entry, name="q"):
    return RegisteredPosition("log", name, index, entry, "stream", 1.0)


def test_positions_only_move_forward():
    assert advance(None, at(1, 5)) == at(1, 5)
    assert advance(at(1, 5), at(2, 0)) == at(2, 0)
    assert advance(at(2, 0), at(1, 9)) == at(2, 0)          # a late commit does not move back


def test_a_position_blocks_truncation_of_its_own_segment_only():
    registered = [at(3, 0, "a"), at(5, 7, "b")]
    assert blockers(3, registered) == []                    # segments 0-2 are behind both
    assert blockers(4, registered) == [at(3, 0, "a")]
    assert [p.name for p in blockers(9, registered)] == ["a", "b"]


def test_json_round_trip_and_names():
    p = at(4, 2)
    assert RegisteredPosition.from_json(p.to_json()) == p
    with pytest.raises(errors.MetadataError):
        RegisteredPosition.from_json(b"{}")
    with pytest.raises(errors.IncorrectParameter):
        check_name("a/b")


def test_sink_positions_are_informational_and_keep_their_batch_id():
    from pybk_spark.protocol.positions import SINK
    sink = RegisteredPosition("log", "sink-ab12", 2, 0, SINK, 1.0, batch_id=7, detail="/ck/q1")
    assert RegisteredPosition.from_json(sink.to_json()) == sink
    assert blockers(9, [sink, at(1, 0)]) == [at(1, 0)]     # a writer holds nothing back
    empty_batch = RegisteredPosition("log", "sink-ab12", 2, 0, SINK, 2.0, batch_id=8)
    assert advance(sink, empty_batch) == empty_batch        # same place, later batch
    assert advance(empty_batch, sink) == empty_batch        # a replayed commit: no step back
    old = RegisteredPosition.from_json(b'{"log": "l", "name": "q", "index": 1, "entry": 0}')
    assert (old.kind, old.batch_id, old.detail) == ("stream", None, "")


def test_a_sinks_position_is_just_past_its_ledgers():
    from pybk_spark.protocol.positions import after_written
    assert after_written([10, 11, 12, 13], 5, [11, 12]) == (8, 0)
    assert after_written([10, 11], 0, []) is None            # an empty batch
    assert after_written([10, 11], 0, [99]) is None          # replayed: ledgers deleted
