"""Append times (protocol/append_time.py): stamps, the entry header, the
segment decision and the bounded search."""
import pyarrow as pa
import pytest

from pybk_spark import errors
from pybk_spark.protocol import append_time as at
from pybk_spark.protocol import log_metadata as logmd


def test_stamps_never_go_backwards():
    assert at.stamp(0, 1.5) == 1_500_000
    assert at.stamp(2_000_000, 1.5) == 2_000_000          # the clock stepped back


def test_frame_and_unframe_round_trip_vectorised():
    framed = at.frame([b"a", b"", b"hello"], 1_700_000_000_123_456)
    assert at.time_of_framed(framed[2]) == 1_700_000_000_123_456
    arr = pa.chunked_array([pa.array(framed[:1], pa.binary()), pa.array(framed[1:], pa.binary())])
    times, payloads = at.unframe(arr)
    assert payloads.to_pylist() == [b"a", b"", b"hello"]
    assert times.type == pa.timestamp("us", tz="UTC")
    assert times.cast(pa.int64()).to_pylist() == [1_700_000_000_123_456] * 3
    sliced = pa.array(framed, pa.binary()).slice(1)          # an offset into the buffers
    assert at.unframe(sliced)[0].cast(pa.int64()).to_pylist() == [1_700_000_000_123_456] * 2
    with pytest.raises(errors.ReadError):
        at.unframe(pa.array([b"short"], pa.binary()))
    assert at.is_time_prefixed({"entry_format": at.TIME_PREFIXED})
    assert not at.is_time_prefixed({"log": "x"})


def test_segment_side_decides_from_recorded_times():
    assert at.segment_side(10, 20, 21) == at.BEFORE
    assert at.segment_side(10, 20, 10) == at.AT_START
    assert at.segment_side(10, 20, 15) == at.SEARCH
    assert at.segment_side(-1, -1, 15) == at.SEARCH          # unknown (open tail, old data)
    assert at.segment_side(-1, 20, 25) == at.BEFORE


@pytest.mark.parametrize("t,expected", [(0, 0), (10, 0), (11, 2), (30, 4), (31, 6), (99, 6)])
def test_first_at_or_after_is_a_bounded_binary_search(t, expected):
    times = [10, 10, 20, 20, 30, 30]
    probes = []

    def time_of(e):
        probes.append(e)
        return times[e]
    assert at.first_at_or_after(0, 5, t, time_of) == expected
    assert len(probes) <= 3                                  # log2(6) rounded up


def test_entries_without_time_count_as_older_than_any_time():
    assert at.first_at_or_after(0, 99, 5, lambda e: None) == 100
    assert at.first_at_or_after(3, 2, 5, lambda e: 0) == 3   # empty range


def test_segments_record_times_and_old_metadata_reads_unknown():
    md = logmd.new_log("t")
    md = logmd.open_as_leader(md, (), {}, 7)
    md = logmd.record_closed(md, {7: (9, 100)}, {7: (1000, 2000)})
    seg = md.segments[0]
    assert (seg.first_time_us, seg.last_time_us) == (1000, 2000)
    again = logmd.LogMetadata.from_json(md.to_json())
    assert again.segments[0].last_time_us == 2000
    md2, _ = logmd.append_closed(again, [(8, 5, 50, 5)], times={8: (3000, 4000)})
    assert md2.segments[-1].first_time_us == 3000
    old = b'{"name": "o", "segments": [{"ledger_id": 3, "state": "closed", "entry_count": 2}]}'
    s = logmd.LogMetadata.from_json(old).segments[0]
    assert (s.first_time_us, s.last_time_us) == (-1, -1)
    assert "first_time_us" not in logmd.LogMetadata.from_json(old).to_json().decode()
