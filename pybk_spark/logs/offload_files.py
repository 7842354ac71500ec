"""The Parquet files of offloaded segments: layout, writing, checking,
reading back and deleting, on a local path or any ``pyarrow.fs`` filesystem
(protocol/offload.py says when; logs/offload.py runs the steps).

Layout
------
``<location>/<log>/<log uid>/`` is the log's dataset directory: a plain
Parquet dataset, one file per offloaded segment named
``<ledger id:020d>-<part:05d>.parquet``, sorted by entry id, row groups of
about ``row_group_bytes``.  Files being written start with ``_tmp-``, which
``pyarrow.dataset`` and Spark skip, so a table reader never sees one.
A final name depends only on the log and the ledger: writing a segment
again replaces its file, never adds a second copy.

Columns: a raw log's ``ledger_id, entry_id, payload, timestamp``; a
DataFrame log's own columns (its recorded schema) then ``_ledger_id,
_entry_id, _timestamp`` (the names the Spark source's ``includeMetadata``
gives them).  ``timestamp`` / ``_timestamp`` is the entry's append time
(µs, UTC; null for entries written without one).

Checks: each entry has a digest (SHA-256 of its id, time and payload for a
raw log; of its rows as one Arrow IPC batch for a DataFrame log), computed
from what was read from the ledger and again from the file read back; the
record keeps the file's size and SHA-256, checked on every read.

Errors at this boundary: a failure of the filesystem is
``OffloadStoreError`` naming the location; a file that differs from its
record is ``OffloadCorrupt`` naming the file.
"""
from __future__ import annotations

import base64
import hashlib
import os
import posixpath
from dataclasses import dataclass
from typing import Iterator, Optional, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from pybk_spark import errors
from pybk_spark.protocol.append_time import IPC_KEY
from pybk_spark.protocol.log_metadata import LogMetadata
from pybk_spark.protocol.offload_record import OffloadFile, SegmentOffload

TIMESTAMP = pa.timestamp("us", tz="UTC")
RAW_SCHEMA = pa.schema([pa.field("ledger_id", pa.int64()), pa.field("entry_id", pa.int64()),
                        pa.field("payload", pa.binary()), pa.field("timestamp", TIMESTAMP)])
META_FIELDS = (pa.field("_ledger_id", pa.int64()), pa.field("_entry_id", pa.int64()),
               pa.field("_timestamp", TIMESTAMP))
TEMP_PREFIX = "_tmp-"
ROW_GROUP_BYTES = 64 << 20


# -- where ------------------------------------------------------------------------------------
def filesystem(location: str) -> tuple[pafs.FileSystem, str]:
    """(filesystem, root path) of a location: a local path, or a URI any
    ``pyarrow.fs.FileSystem.from_uri`` knows (``file://``, ``s3://``,
    ``gs://``, ``hdfs://``)."""
    if not location:
        raise errors.IncorrectParameter("no offload location: set offload.location "
                                        "(a local path or a URI such as s3://bucket/prefix)")
    if "://" not in location:
        return pafs.LocalFileSystem(), os.path.abspath(location)
    try:
        fs, path = pafs.FileSystem.from_uri(location)
    except (pa.ArrowException, OSError, ValueError) as exc:
        raise errors.IncorrectParameter(f"offload location {location!r}: {exc}") from None
    return fs, path.rstrip("/")


def dataset_dir(md: LogMetadata) -> str:
    """The log's dataset directory, relative to the location: one per
    incarnation of the name, so a log created again never mixes files."""
    return posixpath.join(md.name, md.uid or "no-uid")


def final_name(ledger_id: int, part: int = 0) -> str:
    return f"{ledger_id:020d}-{part:05d}.parquet"


def ledger_of(file_name: str) -> Optional[int]:
    """The ledger id a final or temporary file name carries (None: not ours)."""
    base = file_name[len(TEMP_PREFIX):] if file_name.startswith(TEMP_PREFIX) else file_name
    head = base.split("-", 1)[0]
    return int(head) if head.isdigit() and base.endswith(".parquet") else None


def _store_error(location: str, what: str, exc: BaseException) -> errors.OffloadStoreError:
    return errors.OffloadStoreError(f"offload location {location!r}: {what} failed: {exc}",
                                    location=location)


# -- the tables ---------------------------------------------------------------------------
def log_schema(md: LogMetadata) -> Optional[pa.Schema]:
    """A DataFrame log's recorded table schema; None for a raw log."""
    if md.schema is None:
        return None
    try:
        return pa.ipc.read_schema(pa.py_buffer(base64.b64decode(md.schema)))
    except (ValueError, TypeError, pa.ArrowException) as exc:
        raise errors.MetadataError(f"corrupt schema in log metadata: {exc}") from None


def file_schema(md: LogMetadata) -> pa.Schema:
    schema = log_schema(md)
    return RAW_SCHEMA if schema is None else pa.schema(list(schema) + list(META_FIELDS))


def _padded(batch: pa.RecordBatch, schema: pa.Schema) -> pa.RecordBatch:
    """An entry's batch in the log's schema: columns added to the log after it
    was written (``mergeSchema``) are null."""
    names = batch.schema.names
    columns = []
    for f in schema:
        columns.append(batch.column(names.index(f.name)).cast(f.type) if f.name in names
                       else pa.nulls(batch.num_rows, f.type))
    return pa.RecordBatch.from_arrays(columns, schema=schema)


def table_of_entries(md: LogMetadata, raw: pa.Table) -> pa.Table:
    """Entries read from a ledger (``ledger_id, entry_id, payload, timestamp``,
    the append-time header already stripped) -> the segment's file table."""
    schema = log_schema(md)
    if schema is None:
        return raw.cast(RAW_SCHEMA)
    parts: list[pa.RecordBatch] = []
    ledger: list[int] = []
    entry: list[int] = []
    times: list[Optional[int]] = []
    raw_times = raw.column("timestamp").cast(pa.int64()).to_pylist()
    for lid, eid, payload, t in zip(raw.column("ledger_id").to_pylist(),
                                    raw.column("entry_id").to_pylist(),
                                    _payloads(raw.column("payload")), raw_times):
        try:
            reader = pa.ipc.open_stream(payload)
            batches = list(reader)
        except (pa.ArrowException, ValueError) as exc:
            raise errors.ReadError(f"ledger {lid} entry {eid} is not an Arrow IPC stream: "
                                   f"{exc}", ledger_id=lid, entry_id=eid) from None
        stamp = (reader.schema.metadata or {}).get(IPC_KEY)
        for b in batches:
            parts.append(_padded(b, schema))
            n = b.num_rows
            ledger += [lid] * n
            entry += [eid] * n
            times += [int(stamp) if stamp is not None else t] * n
    table = pa.Table.from_batches(parts, schema=schema)
    table = table.append_column(META_FIELDS[0], pa.array(ledger, pa.int64()))
    table = table.append_column(META_FIELDS[1], pa.array(entry, pa.int64()))
    table = table.append_column(META_FIELDS[2], pa.array(times, pa.int64()).cast(TIMESTAMP))
    return table.combine_chunks()


def _payloads(column: pa.ChunkedArray) -> Iterator[pa.Buffer]:
    for chunk in column.chunks:
        for value in chunk:
            yield value.as_buffer()


def entry_column(table: pa.Table) -> str:
    return "entry_id" if "entry_id" in table.schema.names else "_entry_id"


def entry_digests(table: pa.Table) -> list[bytes]:
    """One digest per entry, in entry order (the table sorted by entry id)."""
    if "payload" in table.schema.names and "_entry_id" not in table.schema.names:
        ids = table.column("entry_id").to_pylist()
        times = table.column("timestamp").cast(pa.int64()).to_pylist()
        return [hashlib.sha256(e.to_bytes(8, "big", signed=True)
                               + (-1 if t is None else t).to_bytes(8, "big", signed=True)
                               + (p or b"")).digest()
                for e, t, p in zip(ids, times, table.column("payload").to_pylist())]
    batch = _own_columns(table)
    out = []
    for start, count in entry_groups(table):
        sink = pa.BufferOutputStream()
        assert batch is not None
        with pa.ipc.new_stream(sink, batch.schema) as writer:
            writer.write_batch(batch.slice(start, count))
        out.append(hashlib.sha256(sink.getvalue()).digest())
    return out


def _own_columns(table: pa.Table) -> Optional[pa.RecordBatch]:
    """A DataFrame log's own columns as one batch (None: no rows)."""
    meta = {f.name for f in META_FIELDS}
    own = table.select([n for n in table.schema.names if n not in meta])
    own = own.replace_schema_metadata(None).combine_chunks()
    return own.to_batches()[0] if own.num_rows else None


def entry_groups(table: pa.Table) -> list[tuple[int, int]]:
    """(first row, rows) of each entry of a table sorted by entry id."""
    ids = table.column(entry_column(table)).to_numpy()
    if len(ids) == 0:
        return []
    starts = np.flatnonzero(np.r_[True, ids[1:] != ids[:-1]])
    counts = np.diff(np.r_[starts, len(ids)])
    return [(int(s), int(c)) for s, c in zip(starts, counts)]


def segment_digest(digests: Sequence[bytes]) -> str:
    return hashlib.sha256(b"".join(digests)).hexdigest()


# -- writing and checking ---------------------------------------------------------------------
@dataclass(frozen=True)
class StagedFile:
    temp_path: str          # absolute, on the location's filesystem
    final_path: str
    file: OffloadFile       # its record (path relative to the dataset directory)


def encode(table: pa.Table, row_group_bytes: int = ROW_GROUP_BYTES) -> pa.Buffer:
    """The table as Parquet bytes: row groups of about ``row_group_bytes``,
    recorded as sorted by entry id."""
    rows = max(1, table.num_rows)
    per_group = max(1, row_group_bytes // max(1, table.nbytes // rows))
    sink = pa.BufferOutputStream()
    pq.write_table(table, sink, row_group_size=per_group,
                   sorting_columns=[pq.SortingColumn(
                       table.schema.get_field_index(entry_column(table)))])
    return sink.getvalue()


def write_temp(fs: pafs.FileSystem, location: str, directory: str, ledger_id: int,
               table: pa.Table, token: str, row_group_bytes: int = ROW_GROUP_BYTES
               ) -> StagedFile:
    """Step 1: the segment's table written under a temporary name."""
    data = encode(table, row_group_bytes)
    name = final_name(ledger_id)
    temp_path = posixpath.join(directory, f"{TEMP_PREFIX}{ledger_id:020d}-00000-{token}.parquet")
    try:
        fs.create_dir(directory, recursive=True)
        with fs.open_output_stream(temp_path) as out:
            out.write(data)
    except (OSError, pa.ArrowException) as exc:
        raise _store_error(location, f"writing {temp_path}", exc) from None
    ids = table.column(entry_column(table))
    first = int(ids[0].as_py()) if len(ids) else 0
    last = int(ids[-1].as_py()) if len(ids) else -1
    return StagedFile(temp_path, posixpath.join(directory, name),
                      OffloadFile(name, data.size, hashlib.sha256(data).hexdigest(),
                                  table.num_rows, first, last))


def read_checked(fs: pafs.FileSystem, location: str, path: str, expected: OffloadFile,
                 digests: Optional[Sequence[bytes]] = None) -> pa.Table:
    """The file's table, after checking its size, SHA-256, row count and entry
    range against ``expected`` (and its per-entry digests against ``digests``
    when given); ``OffloadCorrupt`` naming the file otherwise."""
    try:
        with fs.open_input_file(path) as f:
            data = f.read()
    except FileNotFoundError:
        raise errors.OffloadCorrupt(f"offloaded file {location}/{path} is missing",
                                    file=path) from None
    except (OSError, pa.ArrowException) as exc:
        raise _store_error(location, f"reading {path}", exc) from None

    def bad(what: str) -> errors.OffloadCorrupt:
        return errors.OffloadCorrupt(f"offloaded file {location}/{path}: {what}", file=path)
    if len(data) != expected.size:
        raise bad(f"{len(data)} bytes, its record says {expected.size}")
    if hashlib.sha256(data).hexdigest() != expected.sha256:
        raise bad("its SHA-256 differs from its record")
    try:
        table = pq.read_table(pa.BufferReader(data))
    except (pa.ArrowException, OSError) as exc:
        raise bad(f"not readable as Parquet: {exc}") from None
    ids = table.column(entry_column(table)) if table.num_columns else pa.array([])
    got = (table.num_rows, int(ids[0].as_py()) if len(ids) else 0,
           int(ids[-1].as_py()) if len(ids) else -1)
    if got != (expected.rows, expected.first_entry, expected.last_entry):
        raise bad(f"rows, first and last entry {got}, its record says "
                  f"{(expected.rows, expected.first_entry, expected.last_entry)}")
    if digests is not None and entry_digests(table) != list(digests):
        raise bad("its entries' digests differ from the ledger's")
    return table


def publish(fs: pafs.FileSystem, location: str, staged: StagedFile) -> None:
    """Step 2's end: the temporary file renamed to its final name (replacing
    a copy an earlier run left), then its size checked there."""
    try:
        fs.move(staged.temp_path, staged.final_path)
        info = fs.get_file_info(staged.final_path)
    except (OSError, pa.ArrowException) as exc:
        raise _store_error(location, f"renaming {staged.temp_path}", exc) from None
    if info.size != staged.file.size:
        raise errors.OffloadCorrupt(f"offloaded file {location}/{staged.final_path}: "
                                    f"{info.size} bytes after the rename, {staged.file.size} "
                                    "written", file=staged.final_path)


def delete_paths(fs: pafs.FileSystem, location: str, paths: Sequence[str]) -> None:
    for path in paths:
        try:
            fs.delete_file(path)
        except FileNotFoundError:
            pass
        except (OSError, pa.ArrowException) as exc:
            raise _store_error(location, f"deleting {path}", exc) from None


def delete_record_files(record: SegmentOffload) -> None:
    """Delete a record's files (those already gone are skipped)."""
    fs, root = filesystem(record.location)
    delete_paths(fs, record.location, [posixpath.join(root, record.directory, f.path)
                                       for f in record.files])


def listing(fs: pafs.FileSystem, location: str, directory: str) -> list[pafs.FileInfo]:
    """The files in a dataset directory (none when it does not exist)."""
    try:
        return [i for i in fs.get_file_info(pafs.FileSelector(directory, allow_not_found=True))
                if i.type == pafs.FileType.File]
    except (OSError, pa.ArrowException) as exc:
        raise _store_error(location, f"listing {directory}", exc) from None


# -- reading a segment back as ledger entries -------------------------------------------------
def read_segment(record: SegmentOffload) -> pa.Table:
    """An offloaded segment as its file table, every file checked against its record."""
    fs, root = filesystem(record.location)
    tables = [read_checked(fs, record.location, posixpath.join(root, record.directory, f.path), f)
              for f in record.files]
    if not tables:
        return RAW_SCHEMA.empty_table()
    return pa.concat_tables(tables).combine_chunks()


def as_entries(table: pa.Table, ledger_id: int) -> pa.Table:
    """A file table -> entries as a ``LogReader`` returns them (``ledger_id,
    entry_id, payload, timestamp``): a DataFrame log's rows are encoded again,
    one Arrow IPC stream per entry, with its append time in the stream's
    schema metadata as the writer stores it."""
    if "_entry_id" not in table.schema.names:
        return table.select(RAW_SCHEMA.names).cast(RAW_SCHEMA)
    batch = _own_columns(table)
    times = table.column("_timestamp").cast(pa.int64()).to_pylist()
    entry_ids, payloads, stamps = [], [], []
    for start, count in entry_groups(table):
        assert batch is not None
        part = batch.slice(start, count)
        t = times[start]
        if t is not None:
            part = part.replace_schema_metadata({IPC_KEY: str(t).encode()})
        sink = pa.BufferOutputStream()
        with pa.ipc.new_stream(sink, part.schema) as writer:
            writer.write_batch(part)
        entry_ids.append(table.column("_entry_id")[start].as_py())
        payloads.append(sink.getvalue().to_pybytes())
        stamps.append(t)
    return pa.Table.from_arrays(
        [pa.array([ledger_id] * len(entry_ids), pa.int64()), pa.array(entry_ids, pa.int64()),
         pa.array(payloads, pa.binary()), pa.array(stamps, pa.int64()).cast(TIMESTAMP)],
        schema=RAW_SCHEMA)
