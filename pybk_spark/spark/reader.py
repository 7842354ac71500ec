"""Batch reader of raw ledgers: plan on the driver, read slices on executors.

Theory of operation
-------------------
``partitions()`` runs once, on the driver's Python worker.  It opens a client,
and for every requested ledger fixes the readable prefix BEFORE planning:
  * CLOSED ledger: up to its last entry;
  * OPEN (or IN_RECOVERY) ledger, ``recovery=false``: up to the LAC read by a
    non-fencing open (the writer is not disturbed); the metadata is re-read
    after the LAC so that the fragments cover every entry up to it (an ensemble
    change is durable in the metadata before any entry of it is acknowledged);
  * OPEN ledger, ``recovery=true``: fencing open first (recovery closes the
    ledger), then up to the recovered last entry.
Every ledger's password is checked against its metadata first (a wrong one
fails planning with ``Unauthorized``, not each task).  It then cuts the
prefix into fragment slices (``planning.plan_slices``) and
ships each slice as one picklable :class:`LedgerSlicePartition`.

``read(partition)`` runs on an executor: a non-fencing open of the slice's
ledger and ``read_batches(first, last)``; every batch is relabelled to the
declared Arrow schema (no per-row Python).  A slice that yields fewer or other
entries than planned raises ``ReadError``: a read never silently loses data.
The next read window is fetched on a helper thread while Spark takes the
current batch (``readAheadBatches``, read_ahead.py); order is unchanged.

Filters are never pushed down: the readers keep DataSourceReader's own
``pushFilters`` (every filter stays Spark's to apply), so they plan and read
the same with ``spark.sql.python.filterPushdown.enabled`` on or off.  PySpark
4.x keeps a pushed-down read plan (partitions and the pickled reader) on the
data source object that every query over the same DataFrame shares: a query
with no filter to push reuses the plan the last filtered one narrowed, and
reads too few rows, however fresh each reader is.  A plan narrowed by
filters is therefore never right to make; :func:`note_filters_not_pushed`
says so once per process.

DataSource and reader objects are pickled between processes, so no client is
held on them; each Python worker keeps one lazily opened client per
metadata URI (workers are reused across tasks), and freezes its long-lived
objects out of the garbage collector once (Spark collects after every task).
"""
from __future__ import annotations

import functools
import logging
import random
from typing import TYPE_CHECKING, Any, Iterable, Iterator, Mapping, Optional, Self, Sequence

import pyarrow as pa
import pyspark
from pyspark.sql.datasource import DataSourceReader, InputPartition
from pyspark.sql.types import BinaryType, LongType, StructField, StructType, TimestampType

from pybk_spark import errors
from pybk_spark.config import ClientConfig, as_config
from pybk_spark.logs.log import read_log
from pybk_spark.logs.log_reader import with_append_time
from pybk_spark.metadata.security import EtcdSecurity
from pybk_spark.metadata.store import MetadataStore, read_ledger_metadata
from pybk_spark.protocol import ledger_metadata as lm
from pybk_spark.protocol import log_identity
from pybk_spark.protocol.ledger_metadata import password_for
from pybk_spark.spark import arrow_codec, data_loss, time_seek
from pybk_spark.spark.client_cache import (catch_up_lac, close_handle, drop_client, new_client,
                                           open_handle, worker_client, worker_store)
from pybk_spark.spark.client_options import ClientSettings, client_conf
from pybk_spark.spark.options import ReadOptions
from pybk_spark.spark.planning import LedgerView, Slice, plan_slices, split_to_min
from pybk_spark.protocol.offload_record import SegmentOffload
from pybk_spark.spark import offloaded
from pybk_spark.spark.read_ahead import read_ahead
from pybk_spark.wire.entries import one_batch
from pybk_spark.spark.spark_errors import our_line_first

if TYPE_CHECKING:
    from pybk_spark.ledger.context import ClientContext
    from pybk_spark.ledger.ledger_handle import LedgerHandle
    from pybk_spark.ledger.placement import PlacementPolicy
    from pybk_spark.ledger.port import LedgerClient
    from pybk_spark.ledger.read_handle import ReadHandle
    from pybk_spark.transport.base import TransportPool

RAW_SCHEMA = StructType([
    StructField("ledger_id", LongType(), True),
    StructField("entry_id", LongType(), True),
    StructField("payload", BinaryType(), True),
    StructField("timestamp", TimestampType(), True),       # append time; null: not recorded
])
RAW_SCHEMA_DDL = "ledger_id long, entry_id long, payload binary, timestamp timestamp"
RAW_ARROW_SCHEMA = pa.schema([
    pa.field("ledger_id", pa.int64(), nullable=True),
    pa.field("entry_id", pa.int64(), nullable=True),
    pa.field("payload", pa.binary(), nullable=True),
    pa.field("timestamp", pa.timestamp("us", tz="UTC"), nullable=True),
])

LOG = logging.getLogger("pybk_spark.spark")

CLOSED_STATE = "CLOSED"


class LedgerSlicePartition(InputPartition):
    """Entries [first, last] of one ledger, inside one fragment."""

    def __init__(self, ledger_id: int, first: int, last: int, bookies: tuple[str, ...]):
        super().__init__((ledger_id, first, last))
        self.ledger_id, self.first, self.last, self.bookies = ledger_id, first, last, tuple(bookies)
        self.offload: Optional[SegmentOffload] = None    # set: read from files (offloaded.py)

    @classmethod
    def of(cls, s: Slice) -> "LedgerSlicePartition":
        return cls(s.ledger_id, s.first, s.last, s.bookies)

    def __repr__(self) -> str:
        return (f"LedgerSlicePartition(ledger={self.ledger_id}, entries={self.first}..{self.last}, "
                f"bookies={list(self.bookies)})")


# -- Arrow ------------------------------------------------------------------------------------
def to_raw_batch(batch: pa.RecordBatch | pa.Table) -> pa.RecordBatch | pa.Table:
    """Select and relabel the client's columns to exactly RAW_ARROW_SCHEMA
    (int64, binary, nullable) - columnar casts only, no per-row work.  A
    table (rows gathered from several bookies, not yet copied together)
    stays a table: the decode copies its rows once."""
    arrays = []
    for field in RAW_ARROW_SCHEMA:
        column = batch.column(field.name)
        if column.type != field.type:
            column = column.cast(field.type)
        arrays.append(column)
    if isinstance(batch, pa.Table):
        return pa.Table.from_arrays(arrays, schema=RAW_ARROW_SCHEMA)
    return pa.RecordBatch.from_arrays(arrays, schema=RAW_ARROW_SCHEMA)


def check_schema(schema: StructType, expected: StructType = RAW_SCHEMA) -> None:
    """A user-supplied schema must be the source's schema (names, types, order)."""
    got = [(f.name, f.dataType) for f in schema.fields]
    want = [(f.name, f.dataType) for f in expected.fields]
    if got != want:
        ddl = RAW_SCHEMA_DDL if expected is RAW_SCHEMA else expected.simpleString()
        raise errors.IncorrectParameter(
            f"the bookkeeper source reads this data with schema '{ddl}', "
            f"got {schema.simpleString()}")


def table_schema_of(bk: LedgerClient, opts: ReadOptions) -> Optional[str]:
    """The recorded DataFrame schema of option 'log' (None: raw ledgers)."""
    if opts.log is None:
        return None
    return read_log(bk.metadata_store, opts.log)[0].schema


def output_arrow_schema(table_schema: Optional[str], include_metadata: bool) -> pa.Schema:
    if table_schema is None:
        return RAW_ARROW_SCHEMA
    schema = arrow_codec.decode_schema(table_schema)
    return arrow_codec.with_metadata_columns(schema) if include_metadata else schema


def output_spark_schema(table_schema: Optional[str], include_metadata: bool) -> StructType:
    if table_schema is None:
        return RAW_SCHEMA
    return arrow_codec.canonical_to_spark(output_arrow_schema(table_schema, include_metadata))


def decode_slice(raw_batches: Iterable[pa.RecordBatch], table_schema: Optional[str],
                 include_metadata: bool) -> Iterator[pa.RecordBatch]:
    """Raw entry batches -> the declared output batches (no per-row Python)."""
    if table_schema is None:
        for raw in raw_batches:
            yield one_batch(raw)
        return
    schema = arrow_codec.decode_schema(table_schema)
    for raw in raw_batches:
        out = arrow_codec.decode_batch(raw, schema, include_metadata=include_metadata)
        if out is not None and out.num_rows:
            yield out


# -- driver side: planning ---------------------------------------------------------------------
class PlanningClient:
    """A ``LedgerClient`` for planning: metadata reads, and the full client
    (bookie transports, ledger handles, their imports) built only when a
    ledger that is not closed must be opened (LAC read / recovery) or
    anything else beyond metadata is asked for.  Spark runs each planning
    step in a fresh Python worker, so planning a closed log touches etcd
    only.  ``rng``: the randomness of both (a new log's uid, placement), as
    ``BookKeeper``'s."""

    def __init__(self, uri: str, conf: ClientSettings = (),
                 rng: Optional[random.Random] = None):
        self.uri, self.settings = uri, conf
        self.conf: ClientConfig = as_config(client_conf(conf))
        self.rng = rng or random.Random()
        # the etcd settings given as bk.* options, as BookKeeper takes them
        self.metadata_store: MetadataStore = worker_store(uri, EtcdSecurity.from_config(self.conf))
        self._bk: Optional[LedgerClient] = None

    def _client(self) -> LedgerClient:
        if self._bk is None:
            self._bk = new_client(self.uri, self.settings, store=self.metadata_store, rng=self.rng)
        return self._bk

    def get_ledger_metadata(self, ledger_id: int) -> lm.LedgerMetadata:
        return read_ledger_metadata(self.metadata_store, ledger_id)

    def open_ledger(self, ledger_id: int, password: bytes = b"", recovery: bool = True, *,
                    other_passwords: Sequence[bytes] = ()) -> ReadHandle:
        return self._client().open_ledger(ledger_id, password, recovery,
                                          other_passwords=other_passwords)

    # -- beyond metadata: the full client --------------------------------------------------
    @property
    def context(self) -> ClientContext:
        return self._client().context

    @property
    def transports(self) -> TransportPool:
        return self._client().transports

    @property
    def placement(self) -> PlacementPolicy:
        return self._client().placement

    @placement.setter
    def placement(self, policy: PlacementPolicy) -> None:
        self._client().placement = policy

    def create_ledger(self, ensemble: int = 3, write_quorum: int = 2, ack_quorum: int = 2,
                      digest: str = "crc32c", password: bytes = b"",
                      custom_metadata: Mapping[str, str] | None = None,
                      ledger_id: int | None = None) -> LedgerHandle:
        return self._client().create_ledger(ensemble, write_quorum, ack_quorum, digest, password,
                                            custom_metadata, ledger_id)

    def reserve_ledger_id(self) -> int:
        return self._client().reserve_ledger_id()

    def list_ledgers(self) -> list[int]:
        return self._client().list_ledgers()

    def delete_ledger(self, ledger_id: int) -> None:
        self._client().delete_ledger(ledger_id)

    def set_custom_metadata(self, ledger_id: int,
                            custom: Mapping[str, str]) -> lm.LedgerMetadata:
        return self._client().set_custom_metadata(ledger_id, custom)

    def is_writer_alive(self, ledger_id: int) -> bool:
        return self._client().is_writer_alive(ledger_id)

    def close(self) -> None:
        try:
            if self._bk is not None:
                self._bk.close()
        finally:
            self.metadata_store.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def ledger_view(bk: LedgerClient, ledger_id: int, opts: ReadOptions) -> LedgerView:
    """Fix the readable prefix of one ledger (see module docstring).  A wrong
    password fails here, on the driver, before any task is planned."""
    md = bk.get_ledger_metadata(ledger_id)
    password_for(md, opts.passwords)
    if md.state == CLOSED_STATE:
        return LedgerView(ledger_id, tuple(md.fragments()), md.last_entry_id)
    handle = open_handle(bk, ledger_id, recovery=opts.recovery, passwords=opts.passwords)
    try:
        lac = handle.last_add_confirmed          # the prefix, unless recovery closes the ledger
    finally:
        close_handle(handle)
    md = bk.get_ledger_metadata(ledger_id)      # after the LAC / after recovery closed it
    if opts.recovery:
        if md.state != CLOSED_STATE:
            raise errors.LedgerRecoveryError("ledger still not closed after recovery",
                                             ledger_id=ledger_id, state=md.state)
        readable_last = md.last_entry_id
    elif md.state == CLOSED_STATE:
        readable_last = md.last_entry_id        # closed meanwhile: still a prefix >= LAC
    else:
        readable_last = lac
    return LedgerView(ledger_id, tuple(md.fragments()), int(readable_last))


def resolve_ledgers(bk: LedgerClient, opts: ReadOptions) -> tuple[int, ...]:
    """The ledgers to read: option 'ledgers', or the segments of option 'log'
    (raw logs, whose entries are plain payloads) in log order."""
    if opts.log is None:
        return opts.ledgers
    md, _ = read_log(bk.metadata_store, opts.log)
    ids = tuple(md.ledger_ids)
    if log_identity.recreated(opts.offsets_uid, md.uid):
        raise errors.LogRecreated(
            log_identity.describe(opts.log, opts.offsets_uid, md.uid)
            + "; its ledgers are not this log's: take the offsets again (pybk logmetadata "
            f"{opts.log})", log=opts.log)
    for name, named in (("startingOffsets", opts.starting), ("endingOffsets", opts.ending)):
        unknown = sorted(set(named) - set(ids))
        if unknown:
            raise errors.IncorrectParameter(
                f"option {name!r} names ledgers that are not segments of log {opts.log!r}: {unknown}")
    return ids


def _ledger_then_files(from_ledger: Iterator[Any], part: LedgerSlicePartition,
                       log: Optional[str], bk: LedgerClient,
                       max_entries: int) -> Iterator[Any]:
    """The slice read from its ledger (raw batches, entry ids in column 1);
    when the ledger turns out deleted and the log's metadata now has the
    segment's offload record, the rest of the slice from its files: no entry
    twice, none missed.  Without a record, ``NoSuchLedger`` goes on."""
    next_entry = part.first
    try:
        for batch in from_ledger:
            if batch.num_rows:
                next_entry = batch.column(1)[-1].as_py() + 1
            yield batch
    except errors.NoSuchLedger:
        record = offloaded.records_of(bk, log).get(part.ledger_id) if log is not None else None
        if record is None:
            raise
        yield from (to_raw_batch(b) for b in offloaded.read_slice(
            part.ledger_id, next_entry, part.last, record, max_entries))


def partition_of(s: Slice, records: dict[int, SegmentOffload]) -> LedgerSlicePartition:
    """The slice's partition; an offloaded segment's carries its record
    (``offload``), which sends the executor to the files."""
    part = LedgerSlicePartition.of(s)
    part.offload = records.get(s.ledger_id)
    return part


def plan(bk: LedgerClient, opts: ReadOptions, ledger_ids: Iterable[int]) -> list[Slice]:
    """Slices to read: every readable entry the options select."""
    records = offloaded.records_of(bk, opts.log)
    views: list[LedgerView] = []
    kept: list[int] = []
    for lid in ledger_ids:
        view = offloaded.view_of(lid, records[lid]) if lid in records \
            else _view_or_data_loss(bk, lid, opts)
        if view is not None:
            views.append(view)
            kept.append(lid)
    starts, ends = time_seek.resolve(bk, opts, views, [opts.start_for(lid) for lid in kept],
                                     [opts.end_for(lid) for lid in kept])   # times -> entries
    slices = plan_slices(views, starts, ends, opts.max_entries_per_partition)
    return split_to_min(slices, opts.min_partitions)


def _view_or_data_loss(bk: LedgerClient, ledger_id: int, opts: ReadOptions) -> Optional[LedgerView]:
    """A ledger a log lists but that was deleted is data loss (data_loss.py);
    a ledger named by option 'ledgers' that does not exist stays NoSuchLedger
    unless failOnDataLoss=false (then it is skipped)."""
    try:
        return ledger_view(bk, ledger_id, opts)
    except errors.NoSuchLedger:
        if opts.log is None and opts.fail_on_data_loss:
            raise
        data_loss.report(opts.fail_on_data_loss, "a ledger of the log was deleted",
                         log=opts.log, ledger_id=ledger_id)
        return None


# -- executor side: reading ----------------------------------------------------------------------
def read_slice(bk: LedgerClient, part: LedgerSlicePartition, opts: ReadOptions
               ) -> Iterator[pa.RecordBatch]:
    handle = open_handle(bk, part.ledger_id, recovery=False, passwords=opts.passwords)
    try:
        catch_up_lac(handle, part.last)
        expected = part.first
        for batch in handle.read_batches(part.first, part.last, max_entries=opts.read_batch_entries,
                                         max_bytes=opts.read_batch_bytes,
                                         windows_in_flight=opts.read_windows_in_flight,
                                         as_tables=True):
            if batch.num_rows == 0:
                continue
            out = to_raw_batch(with_append_time(batch, handle.metadata.custom))
            ids = out.column(1)
            first_id, last_id = ids[0].as_py(), ids[-1].as_py()
            if first_id != expected or last_id != expected + out.num_rows - 1:
                raise errors.ReadError("ledger read returned unexpected entry ids",
                                       ledger_id=part.ledger_id, expected_first=expected,
                                       got_first=first_id, got_last=last_id)
            expected = last_id + 1
            yield out
        if expected != part.last + 1:
            raise errors.ReadError("ledger read ended early", ledger_id=part.ledger_id,
                                   planned_last=part.last, read_up_to=expected - 1)
    finally:
        close_handle(handle)


def read_partition(partition: LedgerSlicePartition, opts: ReadOptions,
                   table_schema: Optional[str]) -> Iterator[pa.RecordBatch]:
    """One Spark task (batch or micro-batch): the slice's batches, decoded,
    with ``readAheadBatches`` read windows in flight while Spark takes the
    current one (read_ahead.py)."""
    uri = opts.metadata_uri
    try:
        record = getattr(partition, "offload", None)
        raw: Iterator[Any]
        if record is not None:
            raw = (to_raw_batch(b) for b in offloaded.read_slice(
                partition.ledger_id, partition.first, partition.last, record,
                opts.read_batch_entries))
        else:
            bk = worker_client(uri, opts.client_conf)
            raw = _ledger_then_files(read_slice(bk, partition, opts), partition, opts.log, bk,
                                     opts.read_batch_entries)
        yield from read_ahead(decode_slice(raw, table_schema, opts.include_metadata),
                              opts.read_ahead_batches)
    except errors.NoSuchLedger as exc:
        # deleted after planning: data loss unless nothing of it was planned to be read
        if opts.log is None and opts.fail_on_data_loss:
            raise
        data_loss.report(opts.fail_on_data_loss, "a ledger was deleted while being read",
                         log=opts.log, ledger_id=partition.ledger_id,
                         first=partition.first, last=partition.last, error=exc)
    except Exception:
        drop_client(uri, opts.client_conf)   # next task in this worker: a fresh client
        raise


@functools.cache
def note_filters_not_pushed() -> None:
    """Once per process: the batch readers leave every filter to Spark."""
    LOG.info("bookkeeper source (pyspark %s): filters are not pushed down, because PySpark "
             "keeps a pushed-down read plan on the data source that every query over the "
             "same DataFrame shares; Spark applies every filter after the read "
             "(docs/spark.md, 'Filter pushdown')", pyspark.__version__)


class BookKeeperBatchReader(DataSourceReader):
    """No ``pushFilters`` of its own: see the module docstring."""

    def __init__(self, opts: ReadOptions, table_schema: Optional[str] = None):
        self.opts = opts
        self.table_schema = table_schema          # None: raw ledgers

    @our_line_first
    def partitions(self) -> list[InputPartition]:
        bk = PlanningClient(self.opts.metadata_uri, self.opts.client_conf)
        try:
            ledger_ids = resolve_ledgers(bk, self.opts)
            slices = plan(bk, self.opts, ledger_ids)
            records = offloaded.records_of(bk, self.opts.log) if slices else {}
            return [partition_of(s, records) for s in slices]
        finally:
            bk.close()

    @our_line_first
    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        if not isinstance(partition, LedgerSlicePartition):
            return iter(())            # Spark's placeholder partition when nothing is planned
        return self._read(partition)

    def _read(self, partition: LedgerSlicePartition) -> Iterator[pa.RecordBatch]:
        return read_partition(partition, self.opts, self.table_schema)
