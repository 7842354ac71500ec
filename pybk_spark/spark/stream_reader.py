"""Streaming source ``spark.readStream.format("bookkeeper").option("log", NAME)``.

Theory of operation
-------------------
Offsets are log positions (stream_offsets.py).  On the driver (one long-lived
Python process per query):
  * ``initialOffset``: ``earliest`` = first entry of the first untruncated
    segment; ``latest`` = the current end; or a JSON offset; or, with
    ``startingTimestamp``, the first entry appended at or after it
    (time_seek.py).  A restarted query ignores it and resumes from its
    checkpointed offset.
  * ``latestOffset(start, limit)``: re-reads the log metadata, measures every
    segment from ``start`` on (closed: its entry count; the open tail: its LAC
    from a NON-fencing open, so a live writer is never disturbed) and advances
    within the admission limits (``maxEntriesPerTrigger``,
    ``maxBytesPerTrigger``; ``minEntriesPerTrigger`` holds the batch back
    until ``maxTriggerDelay`` has passed since the last one; stream_offsets.py);
    ``ReadAllAvailable`` from Spark lifts them all.  With
    ``Trigger.AvailableNow`` it never goes past the end fixed by
    ``prepareForTriggerAvailableNow`` and never waits for more entries.  It
    keeps the log's latest offset and the lag behind it (entries, bytes) for
    ``reportLatestOffset`` (the query progress).
  * ``partitions(start, end)``: per-ledger ranges cut into fragment slices, as
    the batch read plans them; each ledger's password is checked against its
    metadata here, so a wrong one fails the query on the driver.
Executors read slices exactly like the batch reader (entries up to the planned
last one, which is <= the LAC seen by the driver) and decode DataFrame entries.
An offloaded segment is planned and read from its files with the same
offsets (spark/offloaded.py), so a query that lags past the offload's grace
period reads on without a gap or a duplicate.
``commit(end)`` deletes nothing (the log is shared); it records the query's
position in etcd (``positions/<log>/<name>``, protocol/positions.py), which
truncation will not pass.  The name is minted by ``initialOffset`` and rides
in every offset (key ``"stream"``), so it lives in the query's checkpoint and
a restarted query keeps it; an offset without it (a checkpoint written
before) registers nothing.

Every offset names the log it was taken in (``"uid"``, stream_offsets.py).
An offset of a log that was deleted while a log of the same name was
created is data loss (``failOnDataLoss``): the query fails with
``LogRecreated`` naming both uids, or warns and reads the new log from its
first entry.  The registered position carries the uid too.
"""
from __future__ import annotations

import json
import logging
import time
import uuid
from typing import TYPE_CHECKING, Any, Callable, Iterator, Optional, Sequence

import pyarrow as pa
from pyspark.sql.datasource import DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import (ReadAllAvailable, ReadLimit, ReadMaxBytes,
                                              ReadMaxRows, ReadMinRows,
                                              SupportsTriggerAvailableNow)

from pybk_spark import errors
from pybk_spark.logs.log import read_log
from pybk_spark.logs.positions import record
from pybk_spark.protocol import log_identity
from pybk_spark.protocol.ledger_metadata import password_for
from pybk_spark.protocol.log_metadata import SEGMENT_CLOSED, LogMetadata
from pybk_spark.protocol.positions import RegisteredPosition
from pybk_spark.spark import data_loss, offloaded
from pybk_spark.spark.client_cache import close_handle, new_client, open_handle
from pybk_spark.spark.options import LATEST, ReadOptions, StreamOptions
from pybk_spark.spark.planning import LedgerView, Slice, plan_ledger, split_to_min
from pybk_spark.spark.reader import LedgerSlicePartition, partition_of, read_partition
from pybk_spark.spark.stream_offsets import (Extent, Offset, advance, count, delay_batch, lag,
                                             ranges, uid_of, with_uid)
from pybk_spark.spark.spark_errors import our_line_first
from pybk_spark.spark.time_seek import LogTimes, entry_at_or_after

if TYPE_CHECKING:
    from pybk_spark.ledger.port import LedgerClient

CLOSED_STATE = "CLOSED"
_log = logging.getLogger("pybk_spark.spark")


def other_log(md: LogMetadata, offset: dict[str, Any], fail_on_data_loss: bool) -> bool:
    """True: ``offset`` was taken in another log of ``md``'s name, one
    deleted since (data loss: ``LogRecreated`` unless failOnDataLoss=false,
    which warns)."""
    recorded = uid_of(offset)
    if log_identity.recreated(recorded, md.uid):
        data_loss.report(fail_on_data_loss, log_identity.describe(md.name, recorded, md.uid),
                         errors.LogRecreated, log=md.name, offset=json.dumps(offset,
                                                                             sort_keys=True))
        return True
    if not log_identity.comparable(recorded, md.uid):
        _log.debug("event=log_uid_unchecked log=%s offset_uid=%s log_uid=%s",
                   md.name, recorded, md.uid)
    return False


def measure(bk: LedgerClient, md: LogMetadata, from_index: int, passwords: Sequence[bytes], *,
            read_lac: bool = True, fail_on_data_loss: bool = True) -> list[Extent]:
    """Extents of the log's segments from ``from_index`` up to the first open one
    (an offloaded segment is closed, measured from the log's metadata).  A
    listed ledger that was deleted is data loss (data_loss.py): with
    ``fail_on_data_loss=False`` it counts as a closed, empty segment."""
    if from_index < md.truncated_ledgers:
        raise errors.LogTruncated("stream position was truncated away", log=md.name,
                                  index=from_index, first_index=md.truncated_ledgers)
    out = []
    for i, seg in enumerate(md.segments):
        index = md.truncated_ledgers + i
        if index < from_index:
            continue
        if seg.state == SEGMENT_CLOSED and seg.entry_count >= 0:
            out.append(Extent(index, seg.ledger_id, seg.entry_count, True, seg.byte_count))
            continue
        try:
            meta = bk.get_ledger_metadata(seg.ledger_id)
        except errors.NoSuchLedger:
            data_loss.report(fail_on_data_loss, "a ledger of the log was deleted",
                             log=md.name, index=index, ledger_id=seg.ledger_id)
            out.append(Extent(index, seg.ledger_id, 0, True))
            continue
        if meta.state == CLOSED_STATE:
            out.append(Extent(index, seg.ledger_id, meta.last_entry_id + 1, True, meta.length))
            continue
        end = 0
        if read_lac:
            handle = open_handle(bk, seg.ledger_id, recovery=False, passwords=passwords)
            try:
                end = handle.last_add_confirmed + 1
            finally:
                close_handle(handle)
        out.append(Extent(index, seg.ledger_id, end, False))
        break
    return out


def stream_start(bk: LedgerClient, md: LogMetadata, t_ms: int, passwords: Sequence[bytes],
                 fail_on_data_loss: bool) -> Offset:
    """A stream's first position for ``startingTimestamp``: the first entry, in
    log order, appended at or after ``t_ms`` among the segments readable now;
    the log's current end when there is none (later entries are newer;
    time_seek.py)."""
    earliest = Offset(md.truncated_ledgers, 0)
    extents = measure(bk, md, earliest.index, passwords, fail_on_data_loss=fail_on_data_loss)
    log = LogTimes.of(md)
    for ext in extents:
        view = LedgerView(ext.ledger_id, (), ext.end - 1)
        entry = entry_at_or_after(bk, view, t_ms, log, passwords)
        if entry < ext.end:
            return Offset(ext.index, entry)
    return advance(earliest, extents)


def _average_entry_bytes(md: LogMetadata) -> Optional[float]:
    """Average payload bytes per entry over the log's closed segments (None:
    none has a recorded size); what the open tail's entries are costed at."""
    entries = nbytes = 0
    for seg in md.segments:
        if seg.state == SEGMENT_CLOSED and seg.entry_count > 0 and seg.byte_count >= 0:
            entries += seg.entry_count
            nbytes += seg.byte_count
    return nbytes / entries if entries else None


def plan_range(bk: LedgerClient, md: LogMetadata, begin: Offset, finish: Offset,
               extents: list[Extent], opts: ReadOptions) -> list[Slice]:
    """Fragment slices of the log's entries in [begin, finish); each ledger's
    password is checked against its metadata here (the driver, not tasks).
    An offloaded segment is planned from its record (spark/offloaded.py):
    the same entry ids, read from its files, its ledger not needed."""
    records = offloaded.records_in(md)
    slices: list[Slice] = []
    for ledger_id, first, last in ranges(begin, finish, extents):
        if ledger_id in records:
            slices.extend(plan_ledger(offloaded.view_of(ledger_id, records[ledger_id]), first,
                                      last + 1, opts.max_entries_per_partition))
            continue
        try:
            meta = bk.get_ledger_metadata(ledger_id)
        except errors.NoSuchLedger:
            data_loss.report(opts.fail_on_data_loss, "a ledger of the log was deleted",
                             log=md.name, ledger_id=ledger_id, first=first, last=last)
            continue
        password_for(meta, opts.passwords)                    # on the driver, not in tasks
        view = LedgerView(ledger_id, tuple(meta.fragments()), last)
        slices.extend(plan_ledger(view, first, LATEST, opts.max_entries_per_partition))
    return slices


class BookKeeperStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    def __init__(self, opts: StreamOptions, table_schema: Optional[str],
                 clock: Callable[[], float] = time.monotonic,
                 wall_clock: Callable[[], float] = time.time,
                 new_name: Callable[[], str] = lambda: "stream-" + uuid.uuid4().hex[:12]):
        self.opts = opts
        self.table_schema = table_schema
        self._target: Optional[Offset] = None          # Trigger.AvailableNow end
        self._bk: Optional[LedgerClient] = None        # driver-side client, created lazily
        self._clock, self._wall_clock, self._new_name = clock, wall_clock, new_name
        self._name: Optional[str] = None               # registered position name
        self._last_batch_at = clock()                  # maxTriggerDelay counts from here
        self._report: Optional[dict[str, Any]] = None            # reportLatestOffset (progress)

    # -- driver ------------------------------------------------------------------------------
    def _client(self) -> LedgerClient:
        if self._bk is None:
            self._bk = new_client(self.opts.read.metadata_uri, self.opts.read.client_conf)
        return self._bk

    def _log(self) -> LogMetadata:
        return read_log(self._client().metadata_store, self._log_name)[0]

    @property
    def _log_name(self) -> str:
        """Option 'log' (parse_stream_options requires it of a one-log stream)."""
        if self.opts.read.log is None:
            raise errors.IncorrectParameter("the streaming bookkeeper source needs option 'log'")
        return self.opts.read.log

    def _extents(self, md: LogMetadata, start: Offset, read_lac: bool = True) -> list[Extent]:
        return measure(self._client(), md, start.index, self.opts.read.passwords,
                       read_lac=read_lac, fail_on_data_loss=self.opts.read.fail_on_data_loss)

    def _end(self, md: LogMetadata, start: Offset, budget: Optional[int]) -> Offset:
        return advance(start, self._extents(md, start), budget)

    def _clamp(self, md: LogMetadata, start: Offset) -> Offset:
        """``start``, or the log's first entry when truncation removed ``start``
        (data loss: LogTruncated unless failOnDataLoss=false)."""
        first = Offset(md.truncated_ledgers, 0)
        if start.index >= first.index:
            return start
        data_loss.report(self.opts.read.fail_on_data_loss,
                         "the stream's position was truncated away", log=md.name,
                         index=start.index, entry=start.entry, first_index=first.index)
        return first

    def _out(self, offset: Offset, uid: Optional[str]) -> dict[str, Any]:
        d = with_uid(offset.to_dict(), uid)
        if self._name is not None:
            d["stream"] = self._name
        return d

    def _resume(self, md: LogMetadata, offset: dict[str, Any]) -> Offset:
        """Where to read ``md`` from, given an offset: the offset itself
        (clamped to what truncation left), or the log's first entry when the
        offset was taken in a log since deleted (data loss, ``other_log``)."""
        start = self._in(offset)
        if other_log(md, offset, self.opts.read.fail_on_data_loss):
            return Offset(md.truncated_ledgers, 0)
        return self._clamp(md, start)

    def _in(self, offset: dict[str, Any]) -> Offset:
        name = offset.get("stream") if isinstance(offset, dict) else None
        if name is not None and self._name is None:
            self._name = str(name)
        return Offset.from_dict(offset)

    @our_line_first
    def initialOffset(self) -> dict[str, Any]:
        md = self._log()
        self._name = self._new_name()
        earliest = Offset(md.truncated_ledgers, 0)
        if self.opts.read.times.start_ms is not None:          # startingTimestamp
            return self._out(stream_start(self._client(), md, self.opts.read.times.start_ms,
                                          self.opts.read.passwords,
                                          self.opts.read.fail_on_data_loss), md.uid)
        if self.opts.starting == "earliest":
            return self._out(earliest, md.uid)
        if self.opts.starting == "latest":
            return self._out(self._end(md, earliest, None), md.uid)
        named = json.loads(self.opts.starting)
        if other_log(md, named, self.opts.read.fail_on_data_loss):
            return self._out(earliest, md.uid)
        return self._out(Offset.from_dict(named), md.uid)

    def getDefaultReadLimit(self) -> ReadLimit:
        """One limit for Spark to hand back (it does not interpret it); the
        source applies every limit set in the options (``_budgets``)."""
        o = self.opts
        if o.max_entries_per_trigger is not None:
            return ReadMaxRows(o.max_entries_per_trigger)
        if o.max_bytes_per_trigger is not None:
            return ReadMaxBytes(o.max_bytes_per_trigger)
        if o.min_entries_per_trigger is not None:
            return ReadMinRows(o.min_entries_per_trigger)
        return ReadAllAvailable()

    def _budgets(self, limit: ReadLimit) -> tuple[Optional[int], Optional[int], Optional[int]]:
        """(max entries, max bytes, min entries) for this trigger: none for
        ReadAllAvailable (Trigger.Once, or Spark overriding the options);
        otherwise the options, with the limit Spark passed taking precedence."""
        if isinstance(limit, ReadAllAvailable):
            return None, None, None
        o = self.opts
        most, nbytes, least = (o.max_entries_per_trigger, o.max_bytes_per_trigger,
                               o.min_entries_per_trigger)
        if isinstance(limit, ReadMaxRows):
            most = limit.max_rows
        elif isinstance(limit, ReadMaxBytes):
            nbytes = limit.max_bytes
        elif isinstance(limit, ReadMinRows):
            least = limit.min_rows
        return most, nbytes, least

    @our_line_first
    def prepareForTriggerAvailableNow(self) -> None:
        md = self._log()
        self._target = self._end(md, Offset(md.truncated_ledgers, 0), None)

    @our_line_first
    def latestOffset(self, start: dict[str, Any], limit: ReadLimit) -> dict[str, Any]:
        md = self._log()
        begin = self._resume(md, start)
        extents = self._extents(md, begin)
        average = _average_entry_bytes(md)
        latest = advance(begin, extents)
        most, nbytes, least = self._budgets(limit)
        now = self._clock()
        available = count(begin, min(latest, self._target or latest), extents)
        if self._target is None and delay_batch(available, least, now - self._last_batch_at,
                                                self.opts.max_trigger_delay_s):
            end = begin                                     # minEntriesPerTrigger: wait
        else:
            end = advance(begin, extents, most, nbytes, average)
        if self._target is not None and end > self._target:
            end = max(begin, self._target)
        if end > begin:
            self._last_batch_at = now
        entries, behind_bytes = lag(end, extents, average)
        self._report = dict(latest.to_dict(), entriesBehindLatest=entries,
                            bytesBehindLatest=behind_bytes)
        return self._out(end, md.uid)

    def reportLatestOffset(self) -> Optional[dict[str, Any]]:
        """The log's latest offset, for the query progress (``latestOffset``),
        with how far the planned batch's end is behind it: PySpark gives a
        Python source no ``metrics`` of its own (Kafka's
        ``avgOffsetsBehindLatest``), so they ride along here."""
        return self._report

    @our_line_first
    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> list[InputPartition]:
        bk = self._client()
        md = self._log()
        if other_log(md, end, self.opts.read.fail_on_data_loss):
            return []                       # planned in a log since deleted: nothing to read
        begin, finish = self._resume(md, start), self._in(end)
        if finish <= begin:
            return []
        extents = self._extents(md, begin, read_lac=False)
        slices = plan_range(bk, md, begin, finish, extents, self.opts.read)
        records = offloaded.records_in(md)
        return [partition_of(s, records)
                for s in split_to_min(slices, self.opts.read.min_partitions)]

    @our_line_first
    def commit(self, end: dict[str, Any]) -> None:
        """Spark committed every batch up to ``end``: record the query's
        position (CAS, forward only) so that truncation keeps what it needs."""
        offset = self._in(end)
        if self._name is None or not self._still_there(self._log_name, end):
            return
        record(self._client().metadata_store, RegisteredPosition(
            self._log_name, self._name, offset.index, offset.entry, "stream",
            self._wall_clock(), uid=uid_of(end)))

    def _still_there(self, name: str, offset: dict[str, Any]) -> bool:
        """False: the log ``offset`` was taken in is gone (deleted, perhaps
        created again): its position would only be left behind.  A restarted
        query commits its last checkpointed offset again, which may be one."""
        try:
            md = read_log(self._client().metadata_store, name)[0]
        except errors.LogNotFound:
            return False
        return not log_identity.recreated(uid_of(offset), md.uid)

    def stop(self) -> None:
        if self._bk is not None:
            self._bk.close()
            self._bk = None

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_bk"] = None                            # never pickle a client
        return state

    # -- executors ------------------------------------------------------------------------------
    @our_line_first
    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        if not isinstance(partition, LedgerSlicePartition):
            return
        yield from read_partition(partition, self.opts.read, self.table_schema)
