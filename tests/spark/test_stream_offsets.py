"""Pure streaming-offset arithmetic (no I/O)."""
import pytest

from pybk_spark import errors
from pybk_spark.spark.stream_offsets import Extent, Offset, advance, ranges

EXT = [Extent(2, 100, 5, True), Extent(3, 101, 0, True), Extent(4, 102, 3, True),
       Extent(5, 103, 4, False)]


def test_advance_all_stops_at_open_lac():
    assert advance(Offset(2, 0), EXT) == Offset(5, 4)


def test_advance_with_budget_and_normalisation():
    assert advance(Offset(2, 0), EXT, 5) == Offset(3, 0)      # closed segment done -> next
    assert advance(Offset(2, 0), EXT, 6) == Offset(4, 1)      # empty segment skipped
    assert advance(Offset(2, 3), EXT, 1) == Offset(2, 4)
    assert advance(Offset(5, 4), EXT, 10) == Offset(5, 4)     # nothing new
    assert advance(Offset(6, 0), EXT) == Offset(6, 0)         # past the end: stays


def test_budget_walk_is_gap_free_and_disjoint():
    pos, seen = Offset(2, 0), []
    while True:
        nxt = advance(pos, EXT, 2)
        if nxt == pos:
            break
        seen.extend((lid, e) for lid, a, b in ranges(pos, nxt, EXT) for e in range(a, b + 1))
        pos = nxt
    assert seen == [(100, e) for e in range(5)] + [(102, e) for e in range(3)] + [
        (103, e) for e in range(4)]


def test_ranges():
    assert ranges(Offset(2, 3), Offset(4, 2), EXT) == [(100, 3, 4), (102, 0, 1)]
    assert ranges(Offset(2, 3), Offset(2, 3), EXT) == []
    assert ranges(Offset(4, 0), Offset(5, 0), EXT[:3]) == [(102, 0, 2)]   # end past a closed segment


def test_bad_offset_is_a_clear_error():
    with pytest.raises(errors.IncorrectParameter):
        Offset.from_dict({"index": -1, "entry": 0})
    with pytest.raises(errors.IncorrectParameter):
        Offset.from_dict({"ledger": 3})
