"""An entry batch's IPC stream as a list of buffers for one gathering send,
its payloads sent from where they lie.

Arrow's IPC writer hands each body buffer of a record batch to its sink as
it is (``batch_to_parts``).  A payload column that does not lie in one
buffer - a striped bookie's runs of a request (``batch_parts``), a read
answer's stored batches (``rows_parts``) - is written with a stand-in buffer
of the right length, whose place among the writer's output the payload
pieces then take (``_with_views``).  The bytes are those of
``entries.batch_to_buffer`` of the rows joined; where a stand-in cannot be
used, the rows are joined and written as before.
"""
from __future__ import annotations

import mmap
from typing import Any

import numpy as np
import pyarrow as pa

from pybk_spark.wire.entries import (ENTRY_SCHEMA, Payload, batch_to_buffer, binary_buffers,
                                     one_batch, write_stream)


class _PartsSink:
    """A write-only file that keeps what Arrow's IPC writer hands it: the
    record batch's body buffers arrive as zero-copy ``pyarrow.Buffer`` views
    of the stored entries, so they are sent from where they lie."""

    def __init__(self) -> None:
        self.parts: list[Any] = []
        self.closed = False

    def write(self, data: Any) -> int:
        self.parts.append(data)
        return len(data)

    def flush(self) -> None:
        pass

    def close(self) -> None:
        self.closed = True


def batch_to_parts(batch: pa.RecordBatch) -> list[Any]:
    """Like :func:`batch_to_buffer`, but as the list of buffers the IPC writer
    produced, large ones zero-copy views of ``batch`` (for a gathering send)."""
    sink = _PartsSink()
    write_stream(pa.PythonFile(sink, mode="w"), batch)
    return sink.parts


def _with_views(batch: pa.RecordBatch, stand_in: pa.Buffer, views: list[Any]) -> list[Any] | None:
    """``batch_to_parts(batch)`` with ``views`` in the place of its payload
    buffer ``stand_in``: Arrow's IPC writer hands each body buffer over as
    it is, so the stand-in is found by its address and size; None where the
    writer copied it."""
    parts = batch_to_parts(batch)
    for i, part in enumerate(parts):
        if isinstance(part, pa.Buffer) and part.address == stand_in.address \
                and part.size == stand_in.size:
            parts[i:i + 1] = views
            return parts
    return None


# from this many bytes of payloads up, an add goes out as the buffers of its
# IPC stream (``batch_parts``), its payloads sent from where they lie; below
# it, one buffer costs less than a gathering send and its views
GATHER_FROM = 64 << 10
_PAYLOAD = ENTRY_SCHEMA.get_field_index("payload")


def add_payload(batch: pa.RecordBatch, mask: Any = None) -> "Payload":
    """What an add request carries for ``batch``'s rows where ``mask`` is
    set (None: every row): one buffer (``batch_to_buffer``), or from
    ``GATHER_FROM`` bytes up the list of :func:`batch_parts`."""
    payload = batch.column(_PAYLOAD)
    offsets = payload.buffers()[1]
    ends = np.frombuffer(offsets, dtype=np.int32, count=len(payload) + 1,
                         offset=payload.offset * 4) if offsets is not None else (0, 0)
    if ends[-1] - ends[0] < GATHER_FROM:      # (``RecordBatch.nbytes`` costs 15 us)
        return batch_to_buffer(batch if mask is None else batch.filter(pa.array(mask)))
    return batch_parts(batch, mask)


# a striped part is gathered from at most this many runs of the request's
# payload buffer; more (many small entries) are copied by ``filter``, which
# then costs less than a view per run and stays inside a ``sendmsg``'s iovecs
GATHER_MAX_RUNS = 64


def batch_parts(batch: pa.RecordBatch, mask: Any = None) -> list[Any]:
    """The IPC stream of ``batch``'s rows where ``mask`` (a numpy bool array;
    None: every row) is set, as the list of buffers of :func:`batch_to_parts`:
    the same bytes as ``batch_to_buffer(batch.filter(mask))``, with the
    payloads sent from where they lie in ``batch``.

    A bookie of a striped ledger holds runs of the request's entries (two
    of every three at E=3 Qw=2).  The part's other columns are gathered with
    numpy (a few bytes per entry: Arrow's ``filter`` costs 20 us a column);
    its payload column is written with a stand-in of the right length (a
    slice of the request's own payload buffer) whose place in the writer's
    output is then taken by views of the runs: Arrow's IPC writer hands each
    body buffer over as it is, so the stand-in is found by its address and
    size."""
    if mask is None:
        return batch_to_parts(batch)
    selected = np.flatnonzero(mask)
    breaks = np.flatnonzero(np.diff(selected) != 1) + 1
    if len(breaks) + 1 > GATHER_MAX_RUNS or not len(selected) \
            or any(col.buffers()[0] is not None for col in batch.columns):
        return batch_to_parts(batch.filter(pa.array(mask)))
    runs = list(zip(selected[np.r_[0, breaks]].tolist(),
                    (selected[np.r_[breaks - 1, len(selected) - 1]] + 1).tolist()))
    columns: list[pa.Array] = []
    stand_in: Any = None
    views: list[pa.Buffer] = []
    for i, col in enumerate(batch.columns):
        if col.type != pa.binary():
            columns.append(pa.array(col.to_numpy()[selected]))
            continue
        _, offsets, data = col.buffers()
        ends = np.frombuffer(offsets, dtype=np.int32, count=len(col) + 1, offset=col.offset * 4)
        part_ends = np.zeros(len(selected) + 1, dtype=np.int32)
        np.cumsum(np.diff(ends)[selected], out=part_ends[1:])
        pieces = [data.slice(int(ends[a]), int(ends[b] - ends[a])) for a, b in runs]
        if i == _PAYLOAD:
            stand_in, views = data.slice(int(ends[0]), int(part_ends[-1])), pieces
            values = stand_in
        else:
            values = pa.py_buffer(b"".join(pieces))
        columns.append(pa.Array.from_buffers(pa.binary(), len(selected),
                                             [None, pa.py_buffer(part_ends), values]))
    batch_in = pa.RecordBatch.from_arrays(columns, schema=ENTRY_SCHEMA)
    if stand_in is None or not stand_in.size:
        return batch_to_parts(batch_in)
    parts = _with_views(batch_in, stand_in, views)
    return parts if parts is not None else batch_to_parts(batch.filter(pa.array(mask)))


# the stand-in of ``rows_parts``: address space reserved, never written or
# read (a private, read-only anonymous mapping: untouched, it holds no
# memory and no commit charge), so an answer's payload buffer has an
# address of its own that no real buffer has
_STAND_IN_BYTES = 1 << 30
_stand_in: list[pa.Buffer] = []


def _stand_in_of(nbytes: int) -> pa.Buffer | None:
    if nbytes > _STAND_IN_BYTES:
        return None
    if not _stand_in:
        _stand_in.append(pa.py_buffer(mmap.mmap(-1, _STAND_IN_BYTES, prot=mmap.PROT_READ,
                                                flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)))
    return _stand_in[0].slice(0, nbytes)


def rows_parts(rows: pa.RecordBatch | pa.Table) -> list[Any]:
    """The IPC stream of ``rows`` as one batch, as buffers for a gathering
    send: the same bytes as ``batch_to_buffer(one_batch(rows))``, with the
    payloads of a table's chunks sent from where they lie instead of copied
    together.

    A read answer of several stored batches (a pull's) is joined from them.
    Its other columns are a few bytes per entry and are joined with numpy;
    its payload column is written with a stand-in of the joined length
    (``_stand_in_of``), whose place in the writer's output the chunks'
    payload bytes then take, as :func:`batch_parts` does.  Where that does
    not apply (one chunk, nulls, more chunks than a send gathers, or the
    writer copied the stand-in), the rows are joined as before."""
    if isinstance(rows, pa.RecordBatch):
        return batch_to_parts(rows)
    chunks = [c for c in rows.to_batches() if c.num_rows]
    if not 2 <= len(chunks) <= GATHER_MAX_RUNS \
            or any(col.buffers()[0] is not None for c in chunks for col in c.columns):
        return batch_to_parts(one_batch(rows))
    n = rows.num_rows
    columns: list[pa.Array] = []
    stand_in: Any = None
    views: list[pa.Buffer] = []
    for i, field in enumerate(ENTRY_SCHEMA):
        if field.type != pa.binary():
            columns.append(pa.array(np.concatenate([c.column(i).to_numpy() for c in chunks])))
            continue
        ends = [binary_buffers(c.column(i)) for c in chunks]
        joined_ends = np.zeros(n + 1, dtype=np.int32)
        np.cumsum(np.concatenate([np.diff(o) for o, _ in ends]), out=joined_ends[1:])
        pieces = [data.slice(int(o[0]), int(o[-1]) - int(o[0])) for o, data in ends
                  if data is not None and o[-1] > o[0]]
        if i == _PAYLOAD:
            stand_in = _stand_in_of(int(joined_ends[-1]))
            if stand_in is None or not stand_in.size:
                return batch_to_parts(one_batch(rows))
            values, views = stand_in, pieces
        else:
            values = pa.py_buffer(b"".join(pieces))
        columns.append(pa.Array.from_buffers(pa.binary(), n,
                                             [None, pa.py_buffer(joined_ends), values]))
    parts = _with_views(pa.RecordBatch.from_arrays(columns, schema=ENTRY_SCHEMA), stand_in, views)
    return parts if parts is not None else batch_to_parts(one_batch(rows))
