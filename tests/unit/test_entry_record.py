"""A lone add's entry record and the lane's entry frame (wire/entries.py,
wire/lane_frames.py): decoded, they are the batch the batch path builds, and
they meet the same checks (wire/add_validation.py)."""
from __future__ import annotations

import pytest

from pybk_spark import errors
from pybk_spark.wire import lane_frames
from pybk_spark.wire.add_validation import AddBatchLimits, validate_entry
from pybk_spark.wire.digest import Digester
from pybk_spark.wire.entries import (entry_record_head, make_batch, parse_entry_record,
                                     records_to_batch)


def _record(entry_id: int, payload: bytes, lac: int = -1, base: int = 0) -> bytes:
    digest = Digester("crc32c", b"pw").one(5, entry_id, lac, base + len(payload), payload)
    return entry_record_head(5, entry_id, lac, base + len(payload), digest) + payload


@pytest.mark.parametrize("n", [1, 3])
def test_records_decode_to_the_batch_the_batch_path_builds(n):
    payloads = [bytes([i]) * (10 + i) for i in range(n)]
    lengths, total = [], 0
    for p in payloads:
        total += len(p)
        lengths.append(total)
    records = [_record(i, p, lac=i - 1, base=lengths[i] - len(p)) for i, p in enumerate(payloads)]
    digests = Digester("crc32c", b"pw").compute(5, range(n), [i - 1 for i in range(n)], lengths,
                                                payloads)
    expected = make_batch(5, range(n), [i - 1 for i in range(n)], lengths, payloads, digests)
    assert records_to_batch(records).equals(expected)


def test_entry_frame_round_trip_and_checks():
    record = _record(7, b"x" * 50)
    frame = lane_frames.entry_frame(42, True, b"key", record[:-50], b"x" * 50)
    body = frame[lane_frames.HEADER_BYTES:]
    assert lane_frames.frame_length(frame[:lane_frames.HEADER_BYTES], len(frame)) == len(body)
    assert lane_frames.is_entry_frame(body)
    request_id, recovery, key, got = lane_frames.parse_entry_frame(body)
    assert (request_id, recovery, key, bytes(got)) == (42, True, b"key", record)
    assert validate_entry(got, AddBatchLimits()) == (5, 7, -1)
    assert parse_entry_record(got)[3] == 50
    with pytest.raises(errors.TooLarge):
        validate_entry(got, AddBatchLimits(max_entry_bytes=49))
    with pytest.raises(errors.TooLarge):
        validate_entry(got, AddBatchLimits(max_batch_bytes=len(record) - 1))
    with pytest.raises(errors.BadRequest):
        validate_entry(_record(-1, b"x"), AddBatchLimits())
    with pytest.raises(errors.BadRequest):          # shorter than its digest
        validate_entry(record[:30], AddBatchLimits())
    with pytest.raises(ValueError):
        lane_frames.parse_entry_frame(body[:12])
