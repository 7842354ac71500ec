"""Checking one add request's Arrow batch before it is journaled: size
limits, no nulls, one ledger, entry ids ascending (``validate_batch``), all
without a per-entry Python loop.  Pure: no I/O, no bookie state.

The limits are two plain numbers (``BatchLimits``): the real bookie passes
its ``BookieConfig`` (which has both fields, with these defaults), the
in-memory bookies an ``AddBatchLimits``.  A lone add that travels as its
entry record (``validate_entry``) is held to the same limits and rules.
"""
from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Protocol

import numpy as np
import pyarrow as pa

from pybk_spark import errors
from pybk_spark.wire.entries import Record, batch_from_bytes, parse_entry_record

MiB = 1024 * 1024
DEFAULT_MAX_ENTRY_BYTES = 5 * MiB
DEFAULT_MAX_BATCH_BYTES = 64 * MiB


class BatchLimits(Protocol):
    """What ``validate_batch`` checks an add against."""

    @property
    def max_entry_bytes(self) -> int: ...

    @property
    def max_batch_bytes(self) -> int: ...


@dataclass(frozen=True)
class AddBatchLimits:
    max_entry_bytes: int = DEFAULT_MAX_ENTRY_BYTES
    max_batch_bytes: int = DEFAULT_MAX_BATCH_BYTES


def validate_batch(data: bytes, ledger_id: int, cfg: BatchLimits) -> pa.RecordBatch:
    """Parse + check one add batch without a per-entry Python loop (numpy
    views of the Arrow buffers: a one-entry add pays microseconds, not the
    ~25 us of each Arrow compute call; a one-entry batch, the synchronous
    add, is checked with scalars)."""
    if len(data) > cfg.max_batch_bytes:
        raise errors.TooLarge(f"batch of {len(data)} bytes > max_batch_bytes {cfg.max_batch_bytes}")
    batch = batch_from_bytes(data)
    n = batch.num_rows
    if n == 0:
        raise errors.BadRequest("empty entry batch")
    cols = batch.columns
    if any(col.null_count for col in cols):
        raise errors.BadRequest("entry batch has null values")
    lids = cols[0].to_numpy()
    ids = cols[1].to_numpy()
    if n == 1:
        wrong_ledger, ordered = lids[0] != ledger_id, ids[0] >= 0
    else:
        wrong_ledger = lids.min() != ledger_id or lids.max() != ledger_id
        ordered = ids[0] >= 0 and bool((np.diff(ids) > 0).all())
    if wrong_ledger:
        raise errors.BadRequest(f"batch rows must all belong to ledger {ledger_id}")
    if not ordered:
        raise errors.BadRequest("entry ids must be >= 0 and strictly ascending")
    biggest = max_value_length(cols[3])
    if biggest > cfg.max_entry_bytes:
        raise errors.TooLarge(f"entry payload of {biggest} bytes > max_entry_bytes {cfg.max_entry_bytes}")
    return batch


def validate_entry(record: Record, cfg: BatchLimits) -> tuple[int, int, int]:
    """Check one add's entry record (a lone add: wire/entries.py, entry
    records) against the same limits and id rule as ``validate_batch``,
    with scalars; (ledger id, entry id, LAC)."""
    if len(record) > cfg.max_batch_bytes:
        raise errors.TooLarge(f"batch of {len(record)} bytes > max_batch_bytes {cfg.max_batch_bytes}")
    ledger_id, entry_id, lac, _length, start = parse_entry_record(record)
    if entry_id < 0:
        raise errors.BadRequest("entry ids must be >= 0 and strictly ascending")
    size = len(record) - start
    if size > cfg.max_entry_bytes:
        raise errors.TooLarge(f"entry payload of {size} bytes > max_entry_bytes {cfg.max_entry_bytes}")
    return ledger_id, entry_id, lac


_OFFSET_PAIR = struct.Struct("<ii")


def max_value_length(arr: pa.BinaryArray) -> int:
    """Longest value of a (non-empty) binary array, from its offsets buffer."""
    if len(arr) == 1:
        start, end = _OFFSET_PAIR.unpack_from(arr.buffers()[1], arr.offset * 4)
        return int(end - start)
    offsets = np.frombuffer(arr.buffers()[1], dtype=np.int32,
                            count=len(arr) + 1, offset=arr.offset * 4)
    return int(np.diff(offsets).max())
