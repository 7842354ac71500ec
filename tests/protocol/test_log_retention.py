"""A log's retention (protocol/log_retention.py): which oldest segments a
time or size limit has expired, and what holds them back."""
import pytest

from pybk_spark import errors
from pybk_spark.protocol import log_retention as lr
from pybk_spark.protocol.log_metadata import (SEGMENT_CLOSED, SEGMENT_OPEN, LogMetadata,
                                              Segment)
from pybk_spark.protocol.positions import SINK, RegisteredPosition

S = 1_000_000      # µs per second


def log(*segments, truncated=0, **props) -> LogMetadata:
    return LogMetadata("l", tuple(segments), truncated_ledgers=truncated,
                       properties={k.replace("_", "."): str(v) for k, v in props.items()})


def seg(lid, last_s=-1, nbytes=100, state=SEGMENT_CLOSED) -> Segment:
    return Segment(lid, state, entry_count=10, byte_count=nbytes,
                   last_time_us=last_s * S if last_s >= 0 else -1)


def test_no_limits_no_expiry():
    assert lr.expired(log(seg(1, 0), seg(2, 0), seg(3, 0)), 10**6 * S) == 0
    assert not lr.retention_of(log()).limited


def test_time_limit_drops_the_oldest_segments_whose_last_entry_is_older():
    md = log(seg(1, 100), seg(2, 200), seg(3, 300), seg(4, 400), retention_ms=150_000)
    assert lr.expired(md, 351 * S) == 2          # 100 and 200 < 351 - 150
    assert lr.expired(md, 350 * S) == 1          # 200 is exactly 150 s old: kept
    assert lr.expired(md, 10_000 * S) == 3       # never the last segment


def test_size_limit_drops_while_the_rest_still_holds_the_limit():
    md = log(seg(1, nbytes=100), seg(2, nbytes=100), seg(3, nbytes=100), seg(4, nbytes=50),
             retention_bytes=200)
    assert lr.expired(md, 0) == 1                # 350 -> 250 (>= 200); 250 -> 150 would not
    md = log(seg(1, nbytes=100), seg(2, nbytes=100), seg(3, nbytes=100), seg(4, nbytes=50),
             retention_bytes=0)
    assert lr.expired(md, 0) == 3


def test_either_limit_expires_a_segment():
    md = log(seg(1, 100, nbytes=10), seg(2, 900, nbytes=1000), seg(3, 950, nbytes=10),
             retention_ms=500_000, retention_bytes=10)
    assert lr.expired(md, 1000 * S) == 2         # 1 by time, 2 by size


def test_an_open_segment_stops_retention_and_nothing_after_it_goes():
    md = log(seg(1, 100), seg(2, 100, state=SEGMENT_OPEN), seg(3, 100), seg(4, 100),
             retention_ms=1)
    assert lr.expired(md, 1000 * S) == 1


def test_what_retention_cannot_judge_it_keeps():
    md = log(seg(1), seg(2, 100), seg(3, 100), retention_ms=1)    # 1 has no recorded time
    assert lr.expired(md, 1000 * S) == 0
    md = log(seg(1, nbytes=-1), seg(2), seg(3), retention_bytes=0)  # 1 has no recorded size
    assert lr.expired(md, 0) == 0


def test_registered_readers_hold_retention_back_and_sinks_do_not():
    md = log(seg(10, 1), seg(11, 1), seg(12, 1), seg(13, 1), truncated=5, retention_ms=1)
    reader = RegisteredPosition("l", "q", index=6, entry=3)        # inside segment 11
    sink = RegisteredPosition("l", "s", index=5, entry=0, kind=SINK)
    assert lr.expired(md, 100 * S) == 3
    assert lr.expired(md, 100 * S, [reader]) == 1                  # 10 only: 11 is needed
    assert lr.expired(md, 100 * S, [sink]) == 3
    assert lr.expired(md, 100 * S, [RegisteredPosition("l", "old", index=2, entry=0)]) == 0


def test_with_retention_sets_removes_and_validates():
    md = lr.with_retention(log(), ms=60_000, nbytes=1 << 30)
    assert lr.retention_of(md) == lr.Retention(60_000, 1 << 30)
    md = lr.with_retention(md, ms=-1)
    assert lr.retention_of(md) == lr.Retention(None, 1 << 30)
    assert "retention.ms" not in md.properties
    with pytest.raises(errors.IncorrectParameter, match="retention.bytes"):
        lr.with_retention(md, nbytes=-5)
    with pytest.raises(errors.IncorrectParameter, match="retention.ms"):
        lr.retention_of(log(retention_ms="a week"))
