"""Arrow encoding of entry batches: the payload format of Add/Read messages.

A batch is one Arrow record batch with ENTRY_SCHEMA, serialized as an Arrow
IPC stream.  Whole batches are built and parsed with vectorised Arrow calls;
nothing here loops over entries in Python except where a caller asks for
Python objects (``to_entries``).

``length`` is BookKeeper's cumulative ledger length: the payload bytes of
every entry up to and including this one, fixed by the writer when it
assigns the id (so recovery closes a ledger at the length its last entry
carries).  It is the last column so that the first five keep their
positions.  Batches in the format before it (five columns) are refused with
a BadRequest that says so; docs/protocol.md, "Entry format".
"""
from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Any, Callable, Sequence, Union, cast

import numpy as np
import pyarrow as pa

from pybk_spark import errors
from pybk_spark.wire.arrow_memory import wire_pool

ENTRY_SCHEMA = pa.schema([
    pa.field("ledger_id", pa.int64(), nullable=False),
    pa.field("entry_id", pa.int64(), nullable=False),
    pa.field("lac", pa.int64(), nullable=False),
    pa.field("payload", pa.binary(), nullable=False),
    pa.field("digest", pa.binary(), nullable=False),
    pa.field("length", pa.int64(), nullable=False),
])
LEGACY_NAMES = ["ledger_id", "entry_id", "lac", "payload", "digest"]   # before ``length``
# an add request's entries: one IPC stream, or its buffers in order (``add_payload``)
Payload = Union[bytes, pa.Buffer, list[Any]]


@dataclass(frozen=True)
class Entry:
    ledger_id: int
    entry_id: int
    payload: bytes
    lac: int = -1
    length: int = -1         # cumulative ledger length up to and including this entry


def cumulative_lengths(base: int, payloads: Sequence[bytes]) -> list[int]:
    """The ``length`` of each of ``payloads`` assigned in order after a
    ledger length of ``base`` bytes."""
    if len(payloads) == 1:                  # a sync add: no numpy round trip (12 us)
        return [base + len(payloads[0])]
    sizes = np.fromiter((len(p) for p in payloads), dtype=np.int64, count=len(payloads))
    return cast(list[int], (base + np.cumsum(sizes)).tolist())


def make_batch(ledger_id: int, entry_ids: Sequence[int], lacs: Sequence[int],
               lengths: Sequence[int], payloads: Sequence[bytes],
               digests: Sequence[bytes]) -> pa.RecordBatch:
    """Arguments in digest-header order (ledger id, entry id, LAC, length), then
    payloads and their digests."""
    n = len(entry_ids)
    if n == 1:
        return _one_row(ledger_id, entry_ids[0], lacs[0], lengths[0], payloads[0], digests[0])
    return pa.RecordBatch.from_arrays([
        pa.array(np.full(n, ledger_id, dtype=np.int64)),
        pa.array(np.arange(entry_ids.start, entry_ids.stop, dtype=np.int64)
                 if isinstance(entry_ids, range) else np.asarray(entry_ids, dtype=np.int64)),
        pa.array(np.asarray(lacs, dtype=np.int64)),
        pa.array(payloads, pa.binary(), memory_pool=wire_pool()),
        pa.array(digests, pa.binary()),
        pa.array(np.asarray(lengths, dtype=np.int64)),
    ], schema=ENTRY_SCHEMA)


_INT64, _BINARY = pa.int64(), pa.binary()
_Q = struct.Struct("<q").pack
_OFFSETS = struct.Struct("<ii").pack


def value_ends(values: Sequence[Any]) -> np.ndarray:
    """The end offset of each of ``values`` laid back to back (int64)."""
    return np.cumsum(np.fromiter(map(len, values), dtype=np.int64, count=len(values)))


def binary_column(values: Sequence[Any], ends: np.ndarray) -> pa.Array:
    """A binary column of ``values`` (``ends``: their ``value_ends``) from
    its two buffers: the offsets and one join of the values, with no
    per-value conversion (``pa.array`` of a list of bytes converts each)."""
    n = len(values)
    offsets = np.empty(n + 1, dtype=np.int32)
    offsets[0] = 0
    offsets[1:] = ends
    return pa.Array.from_buffers(_BINARY, n, [None, pa.py_buffer(offsets),
                                               pa.py_buffer(b"".join(values))])


def run_batch(ledger_id: int, first: int, lac: int, lengths: np.ndarray,
              payloads: Sequence[bytes] | pa.Array, payload_ends: np.ndarray,
              digests: pa.Array) -> pa.RecordBatch:
    """The batch of a run of entries a writer sends: ids ``first`` on, one
    LAC, ``lengths`` their cumulative ledger lengths, ``payload_ends`` the
    ``value_ends`` of ``payloads``, ``digests`` their digest column.  The
    same batch and IPC bytes as ``make_batch`` (tests/unit/test_wire.py).
    ``payloads`` given as a binary column is taken as the batch's column
    as it is (no join)."""
    n = len(payloads)
    return pa.RecordBatch.from_arrays([
        pa.array(np.full(n, ledger_id, dtype=np.int64)),
        pa.array(np.arange(first, first + n, dtype=np.int64)),
        pa.array(np.full(n, lac, dtype=np.int64)),
        payloads if isinstance(payloads, pa.Array) else binary_column(payloads, payload_ends),
        digests,
        pa.array(lengths),
    ], schema=ENTRY_SCHEMA)


def _one_row(ledger_id: int, entry_id: int, lac: int, length: int, payload: bytes,
             digest: bytes) -> pa.RecordBatch:
    """``make_batch`` of one entry (every sync add) from its buffers: 33 us
    against 79 us for six ``pa.array`` conversions; the same batch and IPC bytes
    (tests/wire/test_entries.py)."""
    def i64(v: int) -> pa.Array:
        return pa.Array.from_buffers(_INT64, 1, [None, pa.py_buffer(_Q(v))])

    def binary(v: bytes) -> pa.Array:
        return pa.Array.from_buffers(_BINARY, 1, [None, pa.py_buffer(_OFFSETS(0, len(v))),
                                                  pa.py_buffer(v)])
    return pa.RecordBatch.from_arrays([i64(ledger_id), i64(entry_id), i64(lac), binary(payload),
                                       binary(digest), i64(length)], schema=ENTRY_SCHEMA)


# explicit options: without them every new writer reads two environment
# variables for the legacy-format default (a third of a one-entry encode)
_IPC_OPTIONS = pa.ipc.IpcWriteOptions()


def write_stream(sink: Any, batch: pa.RecordBatch) -> None:
    with pa.ipc.new_stream(sink, ENTRY_SCHEMA, options=_IPC_OPTIONS) as writer:
        writer.write_batch(batch)


# from this many bytes of buffers up, a batch's stream is written into a
# buffer allocated at its final size (measured by a first pass that copies
# nothing): a growing ``BufferOutputStream`` doubles its capacity, copying
# what it holds each time, and a 4.2 MB stream ends in an 8 MiB block, the
# size from which jemalloc (a bookie's pool, wire/arrow_memory.py) hands out
# fresh pages every time: 1.7 ms against 88 us per stream
# (docs/performance.md, "Memory touched for the first time")
EXACT_SIZE_FROM = 1 << 20


def batch_to_buffer(batch: pa.RecordBatch) -> pa.Buffer:
    """The batch as one Arrow IPC stream, without a copy into ``bytes``."""
    if batch.get_total_buffer_size() < EXACT_SIZE_FROM:
        sink = pa.BufferOutputStream()
        write_stream(sink, batch)
        return sink.getvalue()
    size = pa.MockOutputStream()
    write_stream(size, batch)
    buf = pa.allocate_buffer(size.size())
    write_stream(pa.FixedSizeBufferWriter(buf), batch)
    return buf


def joined(payload: "Payload") -> Any:
    """An add's payload as one buffer: a list of parts joined (a transport
    or a check that takes one buffer)."""
    return pa.py_buffer(b"".join(payload)) if isinstance(payload, list) else payload


def batch_to_bytes(batch: pa.RecordBatch) -> bytes:
    return cast(bytes, batch_to_buffer(batch).to_pybytes())


def empty_batch() -> pa.RecordBatch:
    # pa.nulls, not pa.array([]): pa.array imports pandas (~0.5 s) to look for its types
    return pa.RecordBatch.from_arrays([pa.nulls(0, f.type) for f in ENTRY_SCHEMA],
                                      schema=ENTRY_SCHEMA)


def batch_from_bytes(data: Any) -> pa.RecordBatch:
    """Parse and validate one entry batch (bytes or a pyarrow Buffer, read in
    place).  Raises BadRequest on anything odd."""
    if not len(data):
        return empty_batch()
    try:
        reader = pa.ipc.open_stream(data if isinstance(data, pa.Buffer) else pa.py_buffer(data))
        batches = list(reader)
    except (pa.ArrowException, OSError) as exc:  # pyarrow: its own types, and OSError for IO status
        raise errors.BadRequest(f"malformed Arrow IPC entry batch: {exc}") from None
    schema = reader.schema
    if not schema.equals(ENTRY_SCHEMA, check_metadata=False):
        # accept nullable-vs-not differences only if types match exactly
        types_ok = (schema.names == ENTRY_SCHEMA.names and
                    all(a.type == b.type for a, b in zip(schema, ENTRY_SCHEMA)))
        if schema.names == LEGACY_NAMES:
            raise errors.BadRequest("entry batch in the format before entries carried their "
                                    "cumulative length (5 columns, no 'length'): no longer "
                                    "supported (docs/protocol.md, Entry format)")
        if not types_ok:
            raise errors.BadRequest(f"entry batch schema {schema} != {ENTRY_SCHEMA}")
        batches = pa.Table.from_batches(batches, schema).cast(ENTRY_SCHEMA).to_batches()
    if len(batches) == 1:           # what every writer sends: no copy
        return batches[0] if batches[0].num_rows else empty_batch()
    table = pa.Table.from_batches(batches, ENTRY_SCHEMA)
    if table.num_rows == 0:
        return empty_batch()
    return one_batch(table)


# One entry as the bytes its writer framed (a lone add: lane entry frames,
# journal ADD_ENTRY records, the bookie's write cache): ledger id, entry id,
# LAC, length (little-endian int64), the digest's length (u16), the digest,
# then the payload.  Decoded into a batch of ENTRY_SCHEMA only when read.
ENTRY_RECORD = struct.Struct("<qqqqH")
Record = Union[bytes, memoryview]          # an entry record, or a view of one in a frame


def entry_record_head(ledger_id: int, entry_id: int, lac: int, length: int,
                      digest: bytes) -> bytes:
    """What precedes the payload in an entry record."""
    return ENTRY_RECORD.pack(ledger_id, entry_id, lac, length, len(digest)) + digest


def parse_entry_record(record: Any) -> tuple[int, int, int, int, int]:
    """(ledger id, entry id, LAC, length, offset of the payload) of an entry
    record; BadRequest when it is shorter than its header says."""
    if len(record) < ENTRY_RECORD.size:
        raise errors.BadRequest(f"entry record of {len(record)} bytes is shorter than its header")
    ledger_id, entry_id, lac, length, dlen = ENTRY_RECORD.unpack_from(record)
    start = ENTRY_RECORD.size + dlen
    if start > len(record):
        raise errors.BadRequest("entry record shorter than its digest")
    return ledger_id, entry_id, lac, length, start


def records_to_batch(records: Sequence[Any]) -> pa.RecordBatch:
    """Entry records (each checked by ``parse_entry_record`` when it was
    taken in) as one batch of ENTRY_SCHEMA, in the order given."""
    if len(records) == 1:
        rec = records[0]
        ledger_id, entry_id, lac, length, start = parse_entry_record(rec)
        return _one_row(ledger_id, entry_id, lac, length, bytes(rec[start:]),
                        bytes(rec[ENTRY_RECORD.size:start]))
    heads, payloads, digests = [], [], []
    unpack = ENTRY_RECORD.unpack_from
    for rec in records:
        head = unpack(rec)
        start = ENTRY_RECORD.size + head[4]
        heads.append(head[:4])
        digests.append(bytes(rec[ENTRY_RECORD.size:start]))
        payloads.append(bytes(rec[start:]))
    cols = np.array(heads, dtype=np.int64).reshape(-1, 4)
    return pa.RecordBatch.from_arrays([
        pa.array(cols[:, 0]), pa.array(cols[:, 1]), pa.array(cols[:, 2]),
        pa.array(payloads, _BINARY), pa.array(digests, _BINARY), pa.array(cols[:, 3]),
    ], schema=ENTRY_SCHEMA)


def to_entries(batch: pa.RecordBatch) -> list[Entry]:
    cols = batch.to_pydict()
    return [Entry(l, e, p, c, n) for l, e, p, c, n in
            zip(cols["ledger_id"], cols["entry_id"], cols["payload"], cols["lac"], cols["length"])]


def one_batch(rows: pa.RecordBatch | pa.Table) -> pa.RecordBatch:
    """``rows`` as one record batch (a table's chunks copied together)."""
    if isinstance(rows, pa.RecordBatch):
        return rows
    batches = rows.combine_chunks().to_batches()
    return batches[0] if batches else pa.RecordBatch.from_pylist([], schema=rows.schema)


_ALIGN = 64      # each column's buffer starts on a 64-byte boundary, as Arrow's own


def one_batch_into(rows: pa.Table, take: Callable[[int], tuple[memoryview, pa.Buffer]]
                   ) -> pa.RecordBatch:
    """``one_batch`` of an ENTRY_SCHEMA table whose chunks are copied into
    one buffer from ``take(nbytes)`` (a writable view, the Arrow buffer over
    the same memory: a pool's, reused from answer to answer) instead of
    buffers Arrow allocates afresh: a read answer's few stored batches
    joined with no page touched for the first time."""
    n = rows.num_rows
    chunks = [c for c in rows.to_batches() if c.num_rows]
    if len(chunks) < 2:
        return one_batch(rows)
    binary = [binary_buffers(c.column(3)) for c in chunks], [binary_buffers(c.column(4))
                                                               for c in chunks]
    data_bytes = [sum(int(o[-1]) - int(o[0]) for o, _ in col) for col in binary]
    sizes = [8 * n, 8 * n, 8 * n, 4 * (n + 1), data_bytes[0], 4 * (n + 1), data_bytes[1], 8 * n]
    starts = np.cumsum([0] + [-(-size // _ALIGN) * _ALIGN for size in sizes])
    view, buf = take(int(starts[-1]))
    out = np.frombuffer(view, dtype=np.uint8)
    parts = [buf.slice(int(a), size) for a, size in zip(starts[:-1].tolist(), sizes)]
    fixed = {0: 0, 1: 1, 2: 2, 5: 7}          # column -> its buffer among ``sizes``
    for col, at in fixed.items():
        dst = out[starts[at]:starts[at] + sizes[at]].view(np.int64)
        row = 0
        for c in chunks:
            values = c.column(col).to_numpy()
            dst[row:row + len(values)] = values
            row += len(values)
    for k, at in ((0, 3), (1, 5)):            # payload, digest: offsets then data
        offsets = out[starts[at]:starts[at] + sizes[at]].view(np.int32)
        data = out[starts[at + 1]:starts[at + 1] + sizes[at + 1]]
        row = pos = 0
        for o, src in binary[k]:
            m = len(o) - 1
            offsets[row:row + m + 1] = o - (int(o[0]) - pos)
            length = int(o[-1]) - int(o[0])
            if length:
                data[pos:pos + length] = np.frombuffer(src, dtype=np.uint8)[int(o[0]):int(o[-1])]
            row, pos = row + m, pos + length
    arrays = [pa.Array.from_buffers(pa.int64(), n, [None, parts[i]]) for i in (0, 1, 2)]
    arrays += [pa.Array.from_buffers(pa.binary(), n, [None, parts[3], parts[4]]),
               pa.Array.from_buffers(pa.binary(), n, [None, parts[5], parts[6]]),
               pa.Array.from_buffers(pa.int64(), n, [None, parts[7]])]
    return pa.RecordBatch.from_arrays(arrays, schema=ENTRY_SCHEMA)


def binary_buffers(values: pa.Array) -> tuple[np.ndarray, Any]:
    """(the ``len + 1`` value offsets, the data buffer or None) of a binary
    column, the array's own offset applied; other binary types are cast."""
    if values.type != pa.binary():
        values = values.cast(pa.binary())
    _, offsets_buf, data = values.buffers()
    if offsets_buf is None:            # an empty array may carry no buffers
        return np.zeros(len(values) + 1, dtype=np.int32), None
    offsets = np.frombuffer(offsets_buf, dtype=np.int32, count=values.offset + len(values) + 1)
    return offsets[values.offset:], data


def column_ends(values: pa.Array) -> np.ndarray:
    """``value_ends`` of a binary column, from its offsets (int64)."""
    offsets, _ = binary_buffers(values)
    ends: np.ndarray = offsets[1:].astype(np.int64) - int(offsets[0])
    return ends


@dataclass(frozen=True)
class PayloadColumn:
    """A binary column of entry payloads with its ``column_ends``, computed
    once (``of``) and rebased by ``slice``: the sizes that cut a column
    into requests, each request's bytes (``nbytes``) and its entries'
    lengths all read these ends."""
    values: pa.Array
    ends: np.ndarray

    @classmethod
    def of(cls, values: pa.Array) -> PayloadColumn:
        """``values``: a binary column (other binary types are cast)."""
        if values.type != _BINARY:
            values = values.cast(_BINARY)
        return cls(values, column_ends(values))

    def __len__(self) -> int:
        return len(self.values)

    @property
    def nbytes(self) -> int:
        return int(self.ends[-1]) if len(self.ends) else 0

    def sizes(self) -> list[int]:
        """Each value's length."""
        sizes: list[int] = np.diff(self.ends, prepend=0).tolist()
        return sizes

    def slice(self, start: int, stop: int) -> PayloadColumn:
        """Values ``start`` .. ``stop - 1`` (zero-copy) with their ends."""
        if start == 0 and stop >= len(self):
            return self
        base = int(self.ends[start - 1]) if start else 0
        return PayloadColumn(self.values.slice(start, stop - start), self.ends[start:stop] - base)


def payload_views(payloads: pa.Array | pa.ChunkedArray) -> list[Any]:
    """Each value of a binary column as a zero-copy pyarrow Buffer slice
    (empty values as b""; nulls, which entries never hold, as b"" too)."""
    if isinstance(payloads, pa.ChunkedArray):      # a table of row slices (read_handle._gather)
        return [view for chunk in payloads.chunks for view in payload_views(chunk)]
    n = len(payloads)
    offsets, data = binary_buffers(payloads)
    if data is None or n == 0:
        return [b""] * n
    bounds = offsets.tolist()
    piece = data.slice
    return [piece(a, b - a) if b > a else b"" for a, b in zip(bounds[:-1], bounds[1:])]
