"""The flush in slices: lone adds' records into batches, pauses between slices.

A checkpoint runs in the bookie's flusher thread beside the threads that
serve adds.  While it runs Python bytecode it holds the GIL, and a thread
that wants the GIL waits for the holder to let go: at once when the holder
sleeps or does I/O, else only after the interpreter's switch interval
(5 ms).  So the flush does its work in slices of a few hundred refs, each
slice a handful of numpy / pyarrow calls (the per-byte work in C), with a
short sleep between slices (``pause``): an add waits at most one slice for
the GIL, and the store lock is taken per slice, never across a whole
ledger's refs.  The flush takes longer; no add stalls behind it.

``decode`` turns entry records (``pybk_spark.wire.entries.ENTRY_RECORD``:
header, digest, payload) into one batch of ENTRY_SCHEMA with vector
operations on their concatenation instead of a Python step per record.
"""
from __future__ import annotations

import time
from typing import Iterator, Sequence, TypeVar

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from pybk_spark.wire.entries import ENTRY_RECORD, ENTRY_SCHEMA, Record

SLICE = 256             # refs / records handled between two pauses
PAUSE_S = 0.0001        # a sleep long enough for a waiting add thread to take the GIL
_MAX_SLICE_BYTES = 1 << 30     # a binary column's int32 offsets stay in range

_HEAD = np.dtype([("ledger", "<i8"), ("entry", "<i8"), ("lac", "<i8"), ("length", "<i8"),
                  ("dlen", "<u2")])
assert _HEAD.itemsize == ENTRY_RECORD.size
_HEAD_BYTES = np.arange(ENTRY_RECORD.size, dtype=np.int64)

T = TypeVar("T")


def pause() -> None:
    """Let the threads serving adds take the GIL (and the store lock)."""
    time.sleep(PAUSE_S)


def in_slices(items: Sequence[T], size: int = SLICE) -> Iterator[Sequence[T]]:
    """``items`` in slices of ``size``, with a ``pause`` between two slices."""
    for i in range(0, len(items), size):
        if i:
            pause()
        yield items[i:i + size]


def _offsets(sizes: np.ndarray) -> pa.Buffer:
    """A binary column's int32 offsets for values of ``sizes`` bytes."""
    offsets = np.zeros(len(sizes) + 1, np.int32)
    np.cumsum(sizes, out=offsets[1:])
    return pa.py_buffer(offsets)


def _spans(begin: np.ndarray, sizes: np.ndarray) -> np.ndarray:
    """The positions of every byte of the spans ``[begin, begin + size)``
    (few: the records' heads and digests)."""
    firsts = np.repeat(begin - np.cumsum(sizes) + sizes, sizes)
    out: np.ndarray = firsts + np.arange(len(firsts), dtype=np.int64)
    return out


def decode(records: Sequence[Record]) -> pa.RecordBatch:
    """Entry records (each checked when it was taken in) as one batch of
    ENTRY_SCHEMA, in the order given; the same batch as
    ``records_to_batch``."""
    n = len(records)
    lens = np.fromiter(map(len, records), np.int64, n)
    total = int(lens.sum())
    if total > _MAX_SLICE_BYTES and n > 1:
        half = n // 2
        return pa.Table.from_batches([decode(records[:half]), decode(records[half:])],
                                     schema=ENTRY_SCHEMA).combine_chunks().to_batches()[0]
    u8 = np.frombuffer(b"".join(records), np.uint8)
    starts = np.zeros(n, np.int64)
    np.cumsum(lens[:-1], out=starts[1:])
    heads = u8[starts[:, None] + _HEAD_BYTES].view(_HEAD).reshape(n)
    dlens = heads["dlen"].astype(np.int64)
    d = int(dlens[0])
    if (dlens == d).all():      # one digest type: slice the records as a binary column
        whole = pa.Array.from_buffers(pa.binary(), n, [None, _offsets(lens), pa.py_buffer(u8)])
        head = ENTRY_RECORD.size + d
        payload = pc.binary_slice(whole, head, int(lens.max()))
        digest = pc.binary_slice(whole, ENTRY_RECORD.size, head)
    else:
        keep = np.ones(len(u8), bool)        # the payloads: all but the heads and digests
        keep[_spans(starts, dlens + ENTRY_RECORD.size)] = False
        payload = pa.Array.from_buffers(pa.binary(), n, [
            None, _offsets(lens - ENTRY_RECORD.size - dlens), pa.py_buffer(u8[keep])])
        digest = pa.Array.from_buffers(pa.binary(), n, [
            None, _offsets(dlens), pa.py_buffer(u8[_spans(starts + ENTRY_RECORD.size, dlens)])])
    return pa.RecordBatch.from_arrays([
        pa.array(heads["ledger"]), pa.array(heads["entry"]), pa.array(heads["lac"]),
        payload, digest, pa.array(heads["length"]),
    ], schema=ENTRY_SCHEMA)
