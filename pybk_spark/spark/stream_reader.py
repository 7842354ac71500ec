"""Streaming source ``spark.readStream.format("bookkeeper").option("log", NAME)``.

Theory of operation
-------------------
Offsets are log positions (stream_offsets.py).  On the driver (one long-lived
Python process per query):
  * ``initialOffset``: ``earliest`` = first entry of the first untruncated
    segment; ``latest`` = the current end; or a JSON offset.  A restarted query
    ignores it and resumes from its checkpointed offset.
  * ``latestOffset(start, limit)``: re-reads the log metadata, measures every
    segment from ``start`` on (closed: its entry count; the open tail: its LAC
    from a NON-fencing open, so a live writer is never disturbed) and advances
    at most ``limit`` entries (``maxEntriesPerTrigger``); with
    ``Trigger.AvailableNow`` never past the end fixed by
    ``prepareForTriggerAvailableNow``.
  * ``partitions(start, end)``: per-ledger ranges cut into fragment slices, as
    the batch read plans them; each ledger's password is checked against its
    metadata here, so a wrong one fails the query on the driver.
Executors read slices exactly like the batch reader (entries up to the planned
last one, which is <= the LAC seen by the driver) and decode DataFrame entries.
``commit(end)`` deletes nothing: the log is shared and has its own retention.
"""
from __future__ import annotations

import json
from typing import Iterator, Optional

import pyarrow as pa
from pyspark.sql.datasource import DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import (ReadAllAvailable, ReadLimit, ReadMaxRows,
                                              SupportsTriggerAvailableNow)

from pybk_spark import errors
from pybk_spark.spark import data_loss
from pybk_spark.protocol.ledger_metadata import check_password
from pybk_spark.protocol.log_metadata import SEGMENT_CLOSED, LogMetadata
from pybk_spark.spark.options import LATEST, StreamOptions
from pybk_spark.spark.planning import LedgerView, plan_ledger, split_to_min
from pybk_spark.spark.stream_offsets import Extent, Offset, advance, ranges

CLOSED_STATE = "CLOSED"


def measure(bk, md: LogMetadata, from_index: int, password: bytes, *,
            read_lac: bool = True, fail_on_data_loss: bool = True) -> list[Extent]:
    """Extents of the log's segments from ``from_index`` up to the first open one.
    A listed ledger that was deleted is data loss (data_loss.py): with
    ``fail_on_data_loss=False`` it counts as a closed, empty segment."""
    if from_index < md.truncated_ledgers:
        raise errors.LogTruncated("stream position was truncated away", log=md.name,
                                  index=from_index, first_index=md.truncated_ledgers)
    from pybk_spark.spark.reader import _close_handle, _open
    out = []
    for i, seg in enumerate(md.segments):
        index = md.truncated_ledgers + i
        if index < from_index:
            continue
        if seg.state == SEGMENT_CLOSED and seg.entry_count >= 0:
            out.append(Extent(index, seg.ledger_id, seg.entry_count, True))
            continue
        try:
            meta = bk.get_ledger_metadata(seg.ledger_id)
        except errors.NoSuchLedger:
            data_loss.report(fail_on_data_loss, "a ledger of the log was deleted",
                             log=md.name, index=index, ledger_id=seg.ledger_id)
            out.append(Extent(index, seg.ledger_id, 0, True))
            continue
        if meta.state == CLOSED_STATE:
            out.append(Extent(index, seg.ledger_id, meta.last_entry_id + 1, True))
            continue
        end = 0
        if read_lac:
            handle = _open(bk, seg.ledger_id, recovery=False, password=password)
            try:
                end = handle.last_add_confirmed + 1
            finally:
                _close_handle(handle)
        out.append(Extent(index, seg.ledger_id, end, False))
        break
    return out


class BookKeeperStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    def __init__(self, opts: StreamOptions, table_schema: Optional[str]):
        self.opts = opts
        self.table_schema = table_schema
        self._target: Optional[Offset] = None          # Trigger.AvailableNow end
        self._bk = None                                # driver-side client, created lazily

    # -- driver ------------------------------------------------------------------------------
    def _client(self):
        if self._bk is None:
            from pybk_spark.client import BookKeeper
            self._bk = BookKeeper(self.opts.read.metadata_uri)
        return self._bk

    def _log(self) -> LogMetadata:
        from pybk_spark.log import read_log
        return read_log(self._client().metadata_store, self.opts.read.log)[0]

    def _extents(self, md: LogMetadata, start: Offset, read_lac: bool = True) -> list[Extent]:
        return measure(self._client(), md, start.index, self.opts.read.password,
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

    def initialOffset(self) -> dict:
        md = self._log()
        earliest = Offset(md.truncated_ledgers, 0)
        if self.opts.starting == "earliest":
            return earliest.to_dict()
        if self.opts.starting == "latest":
            return self._end(md, earliest, None).to_dict()
        return Offset.from_dict(json.loads(self.opts.starting)).to_dict()

    def getDefaultReadLimit(self) -> ReadLimit:
        if self.opts.max_entries_per_trigger is None:
            return ReadAllAvailable()
        return ReadMaxRows(self.opts.max_entries_per_trigger)

    def prepareForTriggerAvailableNow(self) -> None:
        md = self._log()
        self._target = self._end(md, Offset(md.truncated_ledgers, 0), None)

    def latestOffset(self, start: dict, limit: ReadLimit) -> dict:
        md = self._log()
        begin = self._clamp(md, Offset.from_dict(start))
        budget = limit.max_rows if isinstance(limit, ReadMaxRows) else None
        end = self._end(md, begin, budget)
        if self._target is not None and end > self._target:
            end = max(begin, self._target)
        return end.to_dict()

    def partitions(self, start: dict, end: dict) -> list[InputPartition]:
        from pybk_spark.spark.reader import LedgerSlicePartition
        bk = self._client()
        md = self._log()
        begin, finish = self._clamp(md, Offset.from_dict(start)), Offset.from_dict(end)
        if finish <= begin:
            return []
        extents = self._extents(md, begin, read_lac=False)
        slices = []
        for ledger_id, first, last in ranges(begin, finish, extents):
            try:
                meta = bk.get_ledger_metadata(ledger_id)
            except errors.NoSuchLedger:
                data_loss.report(self.opts.read.fail_on_data_loss,
                                 "a ledger of the log was deleted", log=md.name,
                                 ledger_id=ledger_id, first=first, last=last)
                continue
            check_password(meta, self.opts.read.password)      # on the driver, not in tasks
            view = LedgerView(ledger_id, tuple(meta.fragments()), last)
            slices.extend(plan_ledger(view, first, LATEST,
                                      self.opts.read.max_entries_per_partition))
        return [LedgerSlicePartition.of(s)
                for s in split_to_min(slices, self.opts.read.min_partitions)]

    def commit(self, end: dict) -> None:
        pass

    def stop(self) -> None:
        if self._bk is not None:
            self._bk.close()
            self._bk = None

    def __getstate__(self):
        state = dict(self.__dict__)
        state["_bk"] = None                            # never pickle a client
        return state

    # -- executors ------------------------------------------------------------------------------
    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        from pybk_spark.spark.reader import LedgerSlicePartition, read_partition
        if not isinstance(partition, LedgerSlicePartition):
            return
        yield from read_partition(partition, self.opts.read, self.table_schema)
