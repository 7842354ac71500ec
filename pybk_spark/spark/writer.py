"""Atomic DataFrame writes into a log: batch writer and exactly-once stream sink.

Theory of operation
-------------------
Driver, ``writer()`` / ``streamWriter()`` (before any task runs): read the
log and refuse a password other than the log's with ``Unauthorized``
(``logs.log.claim_log_password``; the commit's CAS checks it again).  A new
log is created by the commit, so a failed or aborted write leaves no log
behind; a new log in a scope without bookies is refused with
``EmptyScope``.  Then convert the DataFrame schema to its canonical Arrow form
(arrow_codec) and refuse an incompatible append with ``SchemaMismatch`` - no
data has been written yet.

Task, ``write(batches)``: on the first non-empty batch reserve a ledger id,
record it as pending in etcd (pending.py), THEN create the ledger (tagged
``spark_job``) with that id - a task lost in between leaves a pending key
naming no ledger, never an untracked ledger.  It does so on a thread of its
own while the task encodes its first request, which waits for the ledger
before it is sent.  Then it adds every batch, cut into bounded Arrow IPC
entries, with
pipelined ``add_entries_async`` (entries of consecutive batches are encoded
back to back into one buffer and grouped up to ``add_batch_bytes`` per
request; an entry over the ledger's entry
limit - one row too big - fails the task with ``TooLarge`` naming the limit
and the settings, so the job aborts and nothing reaches the log); wait for
all acks, close the ledger and
return ``(ledger id, entries, bytes, rows)`` and the first and last append
time it stamped into its entries (protocol/append_time.py; one wall-clock
stamp per Spark batch, never going backwards).  A task whose write fails
deletes its own ledger (best effort; the driver cleans up in any case).

Driver, ``commit(messages)``: creates the log if it is new, then ONE CAS on
the log (``append_closed``) appends
every task ledger in partition order - readers see all of the write or none
of it; overwrite swaps the whole list in that CAS and deletes the replaced
ledgers AFTER it.  Then :func:`pending.clean_job` deletes ledgers of failed or
retried attempts (pending but not in the log) and the pending keys.
``abort`` deletes every ledger of the job.  If the commit CAS's outcome is
unknown (etcd unavailable / timeout), nothing is deleted: the log decides.

Streaming sink: same task path; ``commit(messages, batchId)`` passes
``sink=(sink id, batchId)`` to ``append_closed``, so the batch's ledgers and
its batch id land in the same CAS and a replayed batch (id <= recorded) is a
no-op whose fresh ledgers are deleted.  After the CAS the sink records its
position (``positions/<log>/sink-<hash>``, kind ``sink``: just past the
batch's ledgers, with the batch id; informational, protocol/positions.py).
"""
from __future__ import annotations

import logging
import threading
import time
import uuid
from collections import deque
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, Deque, Iterable, Iterator, List, Optional, Sequence

import pyarrow as pa
from pyspark import TaskContext
from pyspark.sql.datasource import (DataSourceArrowWriter, DataSourceStreamArrowWriter,
                                    WriterCommitMessage)
from pyspark.sql.types import StructType

from pybk_spark import errors
from pybk_spark.logs.log import (claim_log_password, drop_created_log, find_log,
                                 open_or_create_log, update_log)
from pybk_spark.logs.positions import record_sink
from pybk_spark.logs.truncation import retain
from pybk_spark.metadata.scope import require_bookies
from pybk_spark.protocol import append_time
from pybk_spark.protocol import log_metadata as logmd
from pybk_spark.protocol.ledger_metadata import key_check
from pybk_spark.spark import arrow_codec, pending
from pybk_spark.spark.client_cache import drop_client, new_client, worker_client
from pybk_spark.spark.write_options import WriteOptions
from pybk_spark.spark.spark_errors import our_line_first

if TYPE_CHECKING:
    from concurrent.futures import Future

    from pybk_spark.ledger.ledger_handle import LedgerHandle
    from pybk_spark.ledger.port import LedgerClient

_log = logging.getLogger("pybk_spark.spark")

# A task's entries sent and not yet acknowledged, at most: enough to keep
# every bookie of the ensemble busy while the task encodes the next request
# (two of the client's 16 MiB ones), and bounded, since the client's buffers
# and the bookies' admission hold them.
MAX_INFLIGHT_ADD_BYTES = 32 << 20


@dataclass
class LedgerCommitMessage(WriterCommitMessage):
    partition: int
    attempt: int
    ledger_id: int            # -1: the task had no rows and created no ledger
    entries: int
    bytes: int
    rows: int
    first_time_us: int = -1   # append times of its first / last entry
    last_time_us: int = -1


# -- driver: schema check -------------------------------------------------------------------
def prepare_log(bk: LedgerClient, opts: WriteOptions, spark_schema: StructType,
                overwrite: bool) -> str:
    """Create the log if needed and check the schema; returns the encoded
    schema to record (the log's own string when compatible)."""
    return prepare_log_evolving(bk, opts, spark_schema, overwrite)[0]


def prepare_log_evolving(bk: LedgerClient, opts: WriteOptions, spark_schema: StructType,
                         overwrite: bool) -> tuple[str, Optional[str]]:
    """``prepare_log`` with ``mergeSchema``: -> (schema to record, the recorded
    schema it extends, or None when unchanged)."""
    schema = arrow_codec.spark_to_canonical(spark_schema)
    md = _recorded_log(bk, opts)   # Unauthorized here
    if md.schema is not None and not overwrite and opts.merge_schema:
        recorded = arrow_codec.decode_schema(md.schema)
        if not recorded.equals(schema):
            merged = arrow_codec.merge_schemas(recorded, schema)   # SchemaMismatch naming it
            return arrow_codec.encode_schema(merged), md.schema
    return _prepare_log(bk, opts, schema, overwrite), None


def _recorded_log(bk: LedgerClient, opts: WriteOptions) -> logmd.LogMetadata:
    """The log as recorded, its password claimed (``Unauthorized`` for
    another), or a new log's metadata when there is none: the commit creates
    it (``commit_job``), so a write that fails leaves no log.  Writing a new
    log into a scope without bookies is refused here, before any task runs
    (EmptyScope)."""
    store = bk.metadata_store
    if find_log(store, opts.log) is None:
        require_bookies(store)
        return logmd.new_log(opts.log, password_check=key_check(opts.password))
    return claim_log_password(store, opts.log, opts.password, bk.rng)[0]


def _prepare_log(bk: LedgerClient, opts: WriteOptions, schema: pa.Schema, overwrite: bool
                 ) -> str:
    md = _recorded_log(bk, opts)
    if overwrite:
        return arrow_codec.encode_schema(schema)
    if md.schema is None:
        if md.segments:
            raise errors.SchemaMismatch(
                "log holds raw entries (written by a LogWriter/ledger client), not DataFrame "
                "rows, so a DataFrame cannot be appended to it: write the DataFrame to "
                "another log (a new one, or one written from DataFrames), or read this log "
                "as it is (spark.read: its entries as binary 'payload' rows)", log=opts.log)
        return arrow_codec.encode_schema(schema)
    recorded = arrow_codec.decode_schema(md.schema)
    if not recorded.equals(schema):
        raise errors.SchemaMismatch(
            f"DataFrame schema is incompatible with log {opts.log!r}: log has "
            f"{arrow_codec.canonical_to_spark(recorded).simpleString()}, DataFrame has "
            f"{arrow_codec.canonical_to_spark(schema).simpleString()} ("
            f"{arrow_codec.schema_difference(recorded, schema)}; option mergeSchema=true "
            "allows adding nullable columns at the end)", log=opts.log)
    return md.schema


# -- task ---------------------------------------------------------------------------------------
def _task_ids() -> tuple[int, int]:
    ctx = TaskContext.get()
    if ctx is None:                    # called outside Spark (unit tests)
        return 0, 0
    return ctx.partitionId(), ctx.attemptNumber()


def write_task(opts: WriteOptions, job: str, schema_text: str,
               batches: Iterable[pa.RecordBatch],
               wall_clock: Callable[[], float] = time.time) -> LedgerCommitMessage:
    partition, attempt = _task_ids()
    schema = arrow_codec.decode_schema(schema_text)
    bk = worker_client(opts.metadata_uri, opts.client_conf)
    opening: Optional[_OpeningLedger] = None
    handle: Optional[LedgerHandle] = None
    unchecked: list[tuple[int, int]] = []       # entries encoded before the ledger was open
    entries = nbytes = rows = 0
    first_us = last_us = -1
    try:
        inflight: Deque[tuple[list[Future[list[int]]], int]] = deque()
        # Spark hands over ~1 MB Arrow batches; entries from several of them
        # go out as one add request (one journal record per bookie), because
        # a bookie's cost is per request as much as per byte.  They are
        # encoded back to back into one buffer that becomes the requests'
        # payload column as it is (arrow_codec.EntryRun).
        coalesce_bytes = bk.conf.add_batch_bytes
        run = arrow_codec.EntryRun()
        for batch in batches:
            if batch.num_rows == 0:
                continue
            batch = arrow_codec.conform(batch, schema)
            if opening is None:
                opening = _OpeningLedger(bk, opts, job, partition, attempt)
            last_us = append_time.stamp(last_us, wall_clock())
            first_us = last_us if first_us < 0 else first_us
            for piece in arrow_codec.row_slices(batch, coalesce_bytes):
                if len(run) and run.nbytes + piece.nbytes > coalesce_bytes:
                    if handle is None:
                        handle = _opened(opening, opts, partition, unchecked)
                    _send(handle, run.take(), inflight)
                for size, n in run.add(piece, opts.max_rows_per_entry,
                                       opts.max_bytes_per_entry, last_us):
                    if handle is None:
                        unchecked.append((size, n))
                    else:
                        _check_entry_size(handle, opts, partition, size, n)
                    nbytes, entries, rows = nbytes + size, entries + 1, rows + n
        if opening is not None:
            if handle is None:
                handle = _opened(opening, opts, partition, unchecked)
            if len(run):
                _send(handle, run.take(), inflight)
        for futures, _ in inflight:
            for fut in futures:
                fut.result()
        if handle is not None:
            handle.close()
    except BaseException:
        handle, key = opening.settled() if opening is not None else (None, None)
        _abandon(bk, handle, key)
        drop_client(opts.metadata_uri, opts.client_conf)
        raise
    ledger_id = handle.ledger_id if handle is not None else -1
    return LedgerCommitMessage(partition, attempt, ledger_id, entries, nbytes, rows,
                               first_us, last_us)


class _OpeningLedger:
    """A task's ledger, opened on a thread of its own while the task encodes
    its first request (the three fsynced metadata writes it takes would
    otherwise stall the task, and Spark's feed with it).  Pending first,
    ledger second: a task that dies in between leaves a pending key naming
    no ledger, never an unnamed ledger.  Each is kept here once made, so a
    task that fails abandons exactly what exists (``settled``)."""

    def __init__(self, bk: LedgerClient, opts: WriteOptions, job: str, partition: int,
                 attempt: int) -> None:
        self.key: Optional[str] = None
        self.handle: Optional[LedgerHandle] = None
        self._error: Optional[BaseException] = None
        self._thread = threading.Thread(target=self._open, name="pybk-ledger-open", daemon=True,
                                        args=(bk, opts, job, partition, attempt))
        self._thread.start()

    def _open(self, bk: LedgerClient, opts: WriteOptions, job: str, partition: int,
              attempt: int) -> None:
        try:
            ledger_id = bk.reserve_ledger_id()
            self.key = pending.record(bk.metadata_store, opts.log, job, partition, attempt,
                                      ledger_id)
            self.handle = bk.create_ledger(
                ensemble=opts.ensemble, write_quorum=opts.write_quorum,
                ack_quorum=opts.ack_quorum, password=opts.password,
                custom_metadata={"log": opts.log, "spark_job": job}, ledger_id=ledger_id)
        except BaseException as exc:    # noqa: BLE001 - raised again on the task's thread
            self._error = exc

    def result(self) -> LedgerHandle:
        """The open ledger, once it is; its opening's error raised here."""
        self._thread.join()
        if self._error is not None:
            raise self._error
        assert self.handle is not None, "opened without an error"
        return self.handle

    def settled(self) -> tuple[Optional[LedgerHandle], Optional[str]]:
        """(ledger, pending key) as far as the opening got, once it has ended."""
        self._thread.join()
        return self.handle, self.key


def _opened(opening: _OpeningLedger, opts: WriteOptions, partition: int,
            unchecked: list[tuple[int, int]]) -> LedgerHandle:
    """The task's ledger, open, with every entry encoded before it opened
    checked against its limit: still before anything is sent."""
    handle = opening.result()
    for size, n in unchecked:
        _check_entry_size(handle, opts, partition, size, n)
    unchecked.clear()
    return handle


def _check_entry_size(handle: LedgerHandle, opts: WriteOptions, partition: int, size: int, rows: int) -> None:
    """An entry the ledger cannot take fails the task before it is sent (the
    job then aborts: nothing is appended to the log)."""
    limit = handle.limits.max_entry_bytes
    if size > limit:
        raise errors.TooLarge(
            f"{'a single row' if rows == 1 else f'{rows} rows'} of partition {partition} "
            f"encode(s) to an entry of {size} bytes, over the largest entry the log's ledgers "
            f"accept: {limit} bytes (client config max_entry_size_bytes, bounded by the "
            f"bookies' max_entry_bytes / max_batch_bytes).  Option 'maxBytesPerEntry' "
            f"({opts.max_bytes_per_entry}) splits only between rows: make the row smaller "
            f"or raise those limits", log=opts.log)


def _send(handle: LedgerHandle, payloads: pa.Array,
          inflight: Deque[tuple[list[Future[list[int]]], int]]) -> None:
    """Send ``payloads``; then wait for the oldest sends until at most
    ``MAX_INFLIGHT_ADD_BYTES`` are unacknowledged."""
    inflight.append((handle.add_entries_async(payloads), payloads.nbytes))
    while sum(n for _, n in inflight) > MAX_INFLIGHT_ADD_BYTES:
        for fut in inflight.popleft()[0]:
            fut.result()


def _abandon(bk: LedgerClient, handle: Optional[LedgerHandle], key: Optional[str]) -> None:
    """Best effort: the driver's cleanup covers whatever this misses."""
    if handle is None:
        return
    try:
        handle.close()
    except errors.BKError:
        pass
    try:
        pending.delete_ledgers(bk, [handle.ledger_id])
        if key is not None:
            bk.metadata_store.delete(key)
    except errors.BKError:
        pass


# -- driver: commit / abort ---------------------------------------------------------------------
def committed_ledgers(messages: Sequence[Optional[WriterCommitMessage]]
                      ) -> list[tuple[int, int, int, int]]:
    good = sorted((m for m in messages if isinstance(m, LedgerCommitMessage) and m.ledger_id >= 0),
                  key=lambda m: m.partition)
    return [(m.ledger_id, m.entries, m.bytes, m.rows) for m in good]


def committed_times(messages: Optional[Sequence[Optional[WriterCommitMessage]]]
                    ) -> dict[int, tuple[int, int]]:
    """ledger id -> (first, last) append time (µs) its task stamped."""
    return {m.ledger_id: (getattr(m, "first_time_us", -1), getattr(m, "last_time_us", -1))
            for m in messages or () if isinstance(m, LedgerCommitMessage) and m.ledger_id >= 0}


def message_ledger_ids(messages: Optional[Sequence[Optional[WriterCommitMessage]]]) -> list[int]:
    return [m.ledger_id for m in messages or ()
            if isinstance(m, LedgerCommitMessage) and m.ledger_id >= 0]


def commit_job(bk: LedgerClient, opts: WriteOptions, job: str, schema_text: str,
               messages: Sequence[Optional[WriterCommitMessage]], *,
               overwrite: bool = False, sink: Optional[tuple[str, int]] = None,
               base_schema: Optional[str] = None) -> logmd.LogMetadata:
    ledgers = committed_ledgers(messages)
    times = committed_times(messages)
    replaced: list[int] = []
    check = key_check(opts.password)

    def transform(md: logmd.LogMetadata) -> logmd.LogMetadata:
        new, old = logmd.append_closed(logmd.claim_password(md, check), ledgers, schema=schema_text, sink=sink,
                                       overwrite=overwrite, base_schema=base_schema,
                                       times=times)
        replaced[:] = old
        return new
    store = bk.metadata_store
    _, version, created = open_or_create_log(store, opts.log, bk.rng, check)  # a new log
    try:
        md = update_log(store, opts.log, transform)
    except errors.BKError as exc:
        if getattr(exc, "outcome_known", True):
            if created:
                drop_created_log(store, opts.log, version)
            abort_job(bk, opts, job, messages)        # definitely not committed
        raise
    pending.delete_ledgers(bk, replaced)              # overwrite: after the CAS
    pending.clean_job(bk, opts.log, job, md.ledger_ids, extra=[lid for lid, *_ in ledgers])
    return md


def abort_job(bk: LedgerClient, opts: WriteOptions, job: str,
              messages: Optional[Sequence[Optional[WriterCommitMessage]]]) -> list[int]:
    md = find_log(bk.metadata_store, opts.log)
    in_log = md.ledger_ids if md is not None else []
    return pending.clean_job(bk, opts.log, job, in_log, extra=message_ledger_ids(messages))


class BookKeeperBatchWriter(DataSourceArrowWriter):
    def __init__(self, opts: WriteOptions, schema_text: str, overwrite: bool,
                 job: Optional[str] = None, base_schema: Optional[str] = None,
                 wall_clock: Callable[[], float] = time.time) -> None:
        self.opts, self.schema_text, self.overwrite = opts, schema_text, overwrite
        self.base_schema = base_schema          # mergeSchema: the recorded schema it extends
        self.job = job or uuid.uuid4().hex
        self._wall_clock = wall_clock             # retention's "now"

    @our_line_first
    def write(self, iterator: Iterator[pa.RecordBatch]) -> LedgerCommitMessage:
        return write_task(self.opts, self.job, self.schema_text, iterator)

    @our_line_first
    def commit(self, messages: List[Optional[WriterCommitMessage]]) -> None:
        with new_client(self.opts.metadata_uri, self.opts.client_conf) as bk:
            md = commit_job(bk, self.opts, self.job, self.schema_text, messages,
                            overwrite=self.overwrite, base_schema=self.base_schema)
            retain(bk, self.opts.log, self._wall_clock, md, retry="at the next commit")

    @our_line_first
    def abort(self, messages: List[Optional[WriterCommitMessage]]) -> None:
        with new_client(self.opts.metadata_uri, self.opts.client_conf) as bk:
            abort_job(bk, self.opts, self.job, messages)


def _record_sink_position(bk: LedgerClient, md: logmd.LogMetadata,
                          messages: Sequence[Optional[WriterCommitMessage]], name: str,
                          sink_id: str, batch_id: int, now: float) -> None:
    """The sink's committed position (``pybk positions``; informational, it
    never holds back truncation).  The batch is committed already: a failure
    here is a warning, never a failed batch."""
    try:
        record_sink(bk.metadata_store, md, message_ledger_ids(messages), name, sink_id,
                    batch_id, now)
    except errors.BKError as exc:
        _log.warning(
            "bookkeeper sink %s: batch %d committed, its position not recorded: %s",
            sink_id, batch_id, exc)


class BookKeeperStreamWriter(DataSourceStreamArrowWriter):
    """Exactly-once sink: (sink id, batchId) is recorded in the commit CAS."""

    def __init__(self, opts: WriteOptions, schema_text: str, base_schema: Optional[str] = None,
                 wall_clock: Callable[[], float] = time.time) -> None:
        if opts.sink_id is None:         # parse_write_options(streaming=True) always sets it
            raise errors.IncorrectParameter(
                "the bookkeeper sink needs option 'checkpointLocation' (or 'sinkId')")
        self.opts, self.schema_text, self.base_schema = opts, schema_text, base_schema
        self.sink_id: str = opts.sink_id
        self.job = pending.sink_job(self.sink_id)
        self._wall_clock = wall_clock             # the sink position's updated_at

    @our_line_first
    def write(self, iterator: Iterator[pa.RecordBatch]) -> LedgerCommitMessage:
        return write_task(self.opts, self.job, self.schema_text, iterator)

    @our_line_first
    def commit(self, messages: List[Optional[WriterCommitMessage]], batchId: int) -> None:
        with new_client(self.opts.metadata_uri, self.opts.client_conf) as bk:
            md = commit_job(bk, self.opts, self.job, self.schema_text, messages,
                            sink=(self.sink_id, int(batchId)), base_schema=self.base_schema)
            now = self._wall_clock()
            _record_sink_position(bk, md, messages, self.job, self.sink_id, int(batchId), now)
            retain(bk, self.opts.log, lambda: now, md, retry="at the next commit")

    @our_line_first
    def abort(self, messages: List[Optional[WriterCommitMessage]], batchId: int) -> None:
        with new_client(self.opts.metadata_uri, self.opts.client_conf) as bk:
            abort_job(bk, self.opts, self.job, messages)
