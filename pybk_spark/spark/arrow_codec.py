"""Arrow <-> ledger entries for logs written from DataFrames.

Theory of operation
-------------------
A DataFrame log stores one Arrow IPC *stream* (schema message + ONE record
batch) per ledger entry, so every entry decodes on its own.  The log's
metadata records the table schema once (``LogMetadata.schema`` = base64 of the
IPC-serialized Arrow schema).

The recorded schema is *canonical*: Spark's schema converted to Arrow with
every field (and every nested child) nullable and no metadata.  Spark marks
columns not-null when it can prove it; a later DataFrame with the same columns
but other nullability is the same table, so nullability never causes a
SchemaMismatch and a read never declares a column not-null that the next
append might fill with nulls.  Two schemas are compatible iff their canonical
forms are equal.

Entries are bounded by rows AND serialized bytes: a batch is cut into slices
of at most ``max_rows`` rows sized from its average row width; a slice whose
IPC stream is still over ``max_bytes`` is halved until it fits (a single row
larger than ``max_bytes`` becomes one entry of its own).  All work is
per-slice / per-entry Arrow calls; never per row.

Append time: each entry's IPC schema carries the time it was appended
(metadata ``pybk.appendTime``, decimal µs since the epoch, UTC;
protocol/append_time.py), stamped by the writer when it encodes the entry.
``decode_batch`` exposes it as ``_timestamp`` with the position columns
(null for entries written before it was recorded).

Schema evolution (``mergeSchema``): a DataFrame may add nullable columns
AFTER the recorded ones (:func:`merge_schemas`); the log then records the
wider schema and older entries read back with nulls in the new columns
(:func:`conform` pads a batch whose columns are a prefix of the schema).  A
query that fixed its schema before the change reads newer entries without
the added columns.  Any other difference (a column dropped, renamed,
re-typed or moved) is refused with ``SchemaMismatch`` naming it
(:func:`schema_difference`).

Pure: no I/O, no clock.
"""
from __future__ import annotations

import base64
from typing import Iterator, Optional

import numpy as np
import pyarrow as pa
from pyspark.sql.pandas.types import from_arrow_schema, to_arrow_schema
from pyspark.sql.types import StructType

from pybk_spark import errors
from pybk_spark.protocol.append_time import IPC_KEY as IPC_TIME_KEY
from pybk_spark.wire.entries import payload_views

META_LEDGER = "_ledger_id"
META_ENTRY = "_entry_id"
META_TIME = "_timestamp"
TIMESTAMP = pa.timestamp("us", tz="UTC")
META_FIELDS = (pa.field(META_LEDGER, pa.int64()), pa.field(META_ENTRY, pa.int64()),
               pa.field(META_TIME, TIMESTAMP))


# -- schemas ------------------------------------------------------------------------------
def _nullable_type(t: pa.DataType) -> pa.DataType:
    if pa.types.is_struct(t):
        return pa.struct([_nullable_field(t.field(i)) for i in range(t.num_fields)])
    if pa.types.is_large_list(t):
        return pa.large_list(_nullable_field(t.value_field))
    if pa.types.is_list(t):
        return pa.list_(_nullable_field(t.value_field))
    if pa.types.is_map(t):
        return pa.map_(t.key_type, _nullable_field(t.item_field))
    return t


def _nullable_field(f: pa.Field) -> pa.Field:
    return pa.field(f.name, _nullable_type(f.type), nullable=True)


def canonical_schema(schema: pa.Schema) -> pa.Schema:
    """Every field nullable (recursively), no metadata."""
    return pa.schema([_nullable_field(f) for f in schema])


def spark_to_canonical(spark_schema: StructType) -> pa.Schema:
    return canonical_schema(to_arrow_schema(spark_schema, timezone="UTC"))


def canonical_to_spark(schema: pa.Schema) -> StructType:
    return from_arrow_schema(schema, prefer_timestamp_ntz=True)


def refuse_unstorable(spark_schema: StructType) -> None:
    """IncorrectParameter naming the first column whose type would not read
    back as written (a variant reads back as its struct of binaries, an
    interval of hours as one of days to seconds...) or that Arrow cannot
    carry at all: the sink refuses it before anything is written."""
    for field in spark_schema.fields:
        wrote = field.dataType.simpleString()
        try:
            back = canonical_to_spark(spark_to_canonical(StructType([field]))).fields[0]
            read = back.dataType.simpleString()
        except (TypeError, ValueError, NotImplementedError, pa.ArrowException):
            read = None
        if read == wrote:
            continue
        how = (f"it would read back as {read}" if read is not None
               else "Arrow, the entries' format, cannot carry it")
        raise errors.IncorrectParameter(
            f"column {field.name!r} has type {wrote}, which the bookkeeper sink cannot store "
            f"faithfully ({how}): cast it to a type that round-trips (e.g. to_json() for a "
            f"variant, a long of microseconds for an interval) or drop the column")


def encode_schema(schema: pa.Schema) -> str:
    return base64.b64encode(schema.serialize().to_pybytes()).decode("ascii")


def decode_schema(text: str) -> pa.Schema:
    try:
        return pa.ipc.read_schema(pa.py_buffer(base64.b64decode(text)))
    except (ValueError, TypeError, pa.ArrowException) as exc:
        raise errors.MetadataError(f"corrupt schema in log metadata: {exc}") from None


def with_metadata_columns(schema: pa.Schema) -> pa.Schema:
    clash = [f.name for f in META_FIELDS if f.name in schema.names]
    if clash:
        raise errors.IncorrectParameter(
            f"option 'includeMetadata' adds columns {clash} that the log's schema already has")
    return pa.schema(list(schema) + list(META_FIELDS))


def schema_difference(recorded: pa.Schema, incoming: pa.Schema) -> str:
    """What differs, in words ('' when nothing does)."""
    parts = []
    have = {f.name: f.type for f in recorded}
    new = {f.name: f.type for f in incoming}
    missing = [n for n in recorded.names if n not in new]
    added = [n for n in incoming.names if n not in have]
    retyped = [f"{n} {have[n]} -> {new[n]}" for n in recorded.names
               if n in new and have[n] != new[n]]
    if missing:
        parts.append(f"columns missing from the DataFrame: {missing}")
    if retyped:
        parts.append(f"types changed: {retyped}")
    if added:
        parts.append(f"columns added: {added}")
    common = [n for n in incoming.names if n in have]
    if not missing and not retyped and common != recorded.names:
        parts.append(f"columns in another order: log {recorded.names}, DataFrame {common}")
    elif not missing and not retyped and added and incoming.names[:len(recorded)] != recorded.names:
        parts.append("added columns must come after the log's columns")
    return "; ".join(parts)


def merge_schemas(recorded: pa.Schema, incoming: pa.Schema) -> pa.Schema:
    """The schema to record under ``mergeSchema``: ``incoming`` when it is
    ``recorded`` plus (nullable, canonical) columns at the end; otherwise
    ``SchemaMismatch`` naming the difference."""
    n = len(recorded)
    if (len(incoming) > n and incoming.names[:n] == recorded.names
            and pa.schema(list(incoming)[:n]).equals(recorded)):
        return incoming
    if incoming.equals(recorded):
        return recorded
    raise errors.SchemaMismatch(
        "mergeSchema only adds nullable columns after the log's columns; "
        + (schema_difference(recorded, incoming) or "schemas differ"))


def conform(batch: pa.RecordBatch, schema: pa.Schema) -> pa.RecordBatch:
    """Relabel/cast a batch to exactly ``schema`` (columnar, no per-row work).
    An entry written before columns were added (its columns a prefix of
    ``schema``) gets null columns; one written after (``schema`` a prefix of
    its columns) loses the columns the reader does not know."""
    if batch.schema.equals(schema):
        return batch
    got, want = batch.schema.names, schema.names
    if got != want:
        if len(got) < len(want) and want[:len(got)] == got:
            batch = pa.RecordBatch.from_arrays(
                list(batch.columns) + [pa.nulls(batch.num_rows, f.type)
                                       for f in list(schema)[len(got):]],
                names=want)
        elif len(got) > len(want) and got[:len(want)] == want:
            batch = pa.RecordBatch.from_arrays(list(batch.columns)[:len(want)], names=want)
        else:
            raise errors.SchemaMismatch("batch columns differ from the log's schema",
                                        got=got, expected=want)
        if batch.schema.equals(schema):
            return batch
    try:
        return pa.RecordBatch.from_arrays(batch.columns, schema=schema)
    except (pa.ArrowException, ValueError, TypeError):
        pass
    try:
        return batch.cast(schema)
    except (pa.ArrowException, ValueError, TypeError) as exc:
        raise errors.SchemaMismatch(f"batch does not conform to the log's schema: {exc}") from None


# -- entries ---------------------------------------------------------------------------------
def _write_stream(sink: pa.NativeFile, batch: pa.RecordBatch) -> None:
    with pa.ipc.new_stream(sink, batch.schema) as writer:
        writer.write_batch(batch)


def _stream_size(batch: pa.RecordBatch) -> int:
    """Bytes of ``batch`` as one IPC stream (counted, nothing copied)."""
    sink = pa.MockOutputStream()
    _write_stream(sink, batch)
    return int(sink.size())


def _fit(batch: pa.RecordBatch, max_bytes: int) -> Iterator[tuple[pa.RecordBatch, int]]:
    """``batch`` halved until each part's stream fits ``max_bytes`` (a
    single row as it is) -> (part, bytes of its stream)."""
    size = _stream_size(batch)
    if batch.num_rows <= 1 or size <= max_bytes:
        yield batch, size
        return
    half = batch.num_rows // 2
    yield from _fit(batch.slice(0, half), max_bytes)
    yield from _fit(batch.slice(half), max_bytes)


def row_slices(batch: pa.RecordBatch, max_bytes: int) -> Iterator[pa.RecordBatch]:
    """``batch`` as zero-copy slices of whole rows, each about ``max_bytes``
    or less (a row over it alone): a batch within it is yielded as it is.
    An ``EntryRun`` fed slices holds about one request's worth however
    large a batch Spark hands over, so its 32-bit offsets never overflow."""
    n = batch.num_rows
    if batch.nbytes <= max_bytes or n <= 1:
        yield batch
        return
    rows = max(1, max_bytes * n // batch.nbytes)
    for start in range(0, n, rows):
        yield batch.slice(start, rows)


class EntryRun:
    """Entries encoded back to back into one buffer, taken as one binary
    column (``take``) that ``add_entries_async`` sends as it is: an entry is
    written once, with no copy into its own ``bytes`` and none to join
    those into a request.  The stream sizes ``_fit`` measures place each
    entry, so the buffer is allocated once at its final size when taken,
    where a growing stream would copy what it holds at every doubling."""

    def __init__(self) -> None:
        self._parts: list[pa.RecordBatch] = []
        self._ends: list[int] = []

    def __len__(self) -> int:
        return len(self._ends)

    @property
    def nbytes(self) -> int:
        return self._ends[-1] if self._ends else 0

    def add(self, batch: pa.RecordBatch, max_rows: int, max_bytes: int,
            time_us: Optional[int] = None) -> list[tuple[int, int]]:
        """Encode ``batch`` as entries after those already here, in row
        order -> (entry bytes, rows in it) of each; an empty batch adds none.
        ``time_us``: the append time every entry records."""
        n = batch.num_rows
        if n == 0:
            return []
        if time_us is not None:
            batch = batch.replace_schema_metadata({IPC_TIME_KEY: str(int(time_us)).encode()})
        row_bytes = max(1, batch.nbytes // n)
        step = max(1, min(max_rows, (max_bytes * 9 // 10) // row_bytes))
        added = []
        for offset in range(0, n, step):
            for part, size in _fit(batch.slice(offset, step), max_bytes):
                self._parts.append(part)
                self._ends.append(self.nbytes + size)
                added.append((size, part.num_rows))
        return added

    def take(self) -> pa.Array:
        """The entries so far as one binary column; the run starts empty again."""
        parts, ends = self._parts, self._ends
        self._parts, self._ends = [], []
        data = pa.allocate_buffer(ends[-1] if ends else 0)
        sink = pa.FixedSizeBufferWriter(data)
        for part in parts:
            _write_stream(sink, part)
        if sink.tell() != data.size:       # the measured sizes place every entry
            raise RuntimeError(f"entries wrote {sink.tell()} bytes, measured {data.size}")
        offsets = np.zeros(len(ends) + 1, dtype=np.int32)
        offsets[1:] = ends
        return pa.Array.from_buffers(pa.binary(), len(ends), [None, pa.py_buffer(offsets), data])


def _open_entry(payload: bytes | pa.Buffer) -> tuple[list[pa.RecordBatch], Optional[int]]:
    """One entry -> (its record batches, its append time in µs or None)."""
    try:
        reader = pa.ipc.open_stream(payload if isinstance(payload, pa.Buffer)
                                    else pa.py_buffer(payload))
        batches = list(reader)
    except (pa.ArrowException, ValueError) as exc:
        raise errors.ReadError(f"entry is not an Arrow IPC stream: {exc}") from None
    stamp = (reader.schema.metadata or {}).get(IPC_TIME_KEY)
    return batches, (int(stamp) if stamp is not None else None)


def entry_time(payload: bytes | pa.Buffer) -> Optional[int]:
    """The append time (µs) a DataFrame entry records, None if none."""
    return _open_entry(payload)[1]


def decode_entry(payload: bytes | pa.Buffer, schema: pa.Schema) -> Iterator[pa.RecordBatch]:
    """One entry (bytes or pa.Buffer) -> its record batch(es) conformed to ``schema``."""
    for batch in _open_entry(payload)[0]:
        yield conform(batch, schema)


def decode_batch(raw: pa.RecordBatch, schema: pa.Schema, *, include_metadata: bool
                 ) -> Optional[pa.RecordBatch]:
    """A raw read batch (ledger_id, entry_id, payload) -> one table batch;
    with ``include_metadata`` each row also carries its entry's position."""
    parts: list[pa.RecordBatch] = []
    counts: list[int] = []
    times: list[Optional[int]] = []
    # zero-copy views (a scalar's ``as_buffer()`` copies the value: 0.3 ms per MiB)
    for payload in payload_views(raw.column("payload")):
        rows = 0
        batches, stamp = _open_entry(payload if len(payload) else pa.py_buffer(b""))
        for b in batches:
            parts.append(conform(b, schema))
            rows += b.num_rows
        counts.append(rows)
        times.append(stamp)
    if not parts:
        return None
    table = pa.Table.from_batches(parts, schema=schema).combine_chunks()
    if include_metadata:
        reps = np.asarray(counts, dtype=np.int64)
        ledger = np.repeat(raw.column("ledger_id").to_numpy(zero_copy_only=False).astype(np.int64), reps)
        entry = np.repeat(raw.column("entry_id").to_numpy(zero_copy_only=False).astype(np.int64), reps)
        table = table.append_column(META_FIELDS[0], pa.array(ledger, pa.int64()))
        table = table.append_column(META_FIELDS[1], pa.array(entry, pa.int64()))
        stamps = pa.array(times, pa.int64()).cast(TIMESTAMP)
        table = table.append_column(META_FIELDS[2], stamps.take(
            pa.array(np.repeat(np.arange(len(times), dtype=np.int64), reps))))
    batches = table.to_batches()           # one chunk per column after combine_chunks
    return batches[0] if batches else None
