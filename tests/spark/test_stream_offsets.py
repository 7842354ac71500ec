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


# -- maxBytesPerTrigger, lag, minEntriesPerTrigger ----------------------------------------------
def test_byte_budget_uses_segment_average_and_admits_at_least_one_entry():
    from pybk_spark.spark.stream_offsets import Extent, Offset, advance
    ext = [Extent(0, 10, 10, True, 1000), Extent(1, 11, 10, True, 100), Extent(2, 12, 5, False)]
    start = Offset(0, 0)
    assert advance(start, ext, max_bytes=350) == Offset(0, 3)          # 100 B per entry
    assert advance(start, ext, max_bytes=1050) == Offset(1, 5)         # then 10 B per entry
    assert advance(start, ext, max_bytes=1) == Offset(0, 1)            # soft: one entry
    assert advance(start, ext, max_bytes=350, max_entries=2) == Offset(0, 2)
    # the open tail: costed at the default, or one entry per trigger when unknown
    tail = Offset(2, 0)
    assert advance(tail, ext, max_bytes=100, default_entry_bytes=25.0) == Offset(2, 4)
    assert advance(tail, ext, max_bytes=10 ** 9) == Offset(2, 1)
    assert advance(Offset(1, 8), ext, max_bytes=10 ** 9) == Offset(2, 0)   # unknown: only first


def test_lag_counts_entries_and_bytes_to_the_end():
    from pybk_spark.spark.stream_offsets import Extent, Offset, lag
    ext = [Extent(0, 10, 10, True, 1000), Extent(1, 11, 5, False)]
    assert lag(Offset(0, 4), ext) == (11, -1)                          # open tail: size unknown
    assert lag(Offset(0, 4), ext, default_entry_bytes=10.0) == (11, 650)
    assert lag(Offset(1, 5), ext) == (0, 0)


def test_delay_batch_waits_for_min_entries_until_the_delay():
    from pybk_spark.spark.stream_offsets import delay_batch
    assert delay_batch(3, 5, since_last_s=1.0, max_delay_s=60.0)
    assert not delay_batch(3, 5, since_last_s=60.0, max_delay_s=60.0)
    assert not delay_batch(5, 5, since_last_s=0.0, max_delay_s=60.0)
    assert not delay_batch(0, None, since_last_s=0.0, max_delay_s=60.0)
