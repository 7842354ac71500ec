"""Streaming source over several logs: ``readStream`` with ``logs`` / ``logPattern``.

Theory of operation
-------------------
The single-log stream (stream_reader.py) run once per log, side by side, in
one query.  The offset is a per-log map (multi_offsets.py,
``{"logs": {"<log>": {"index": I, "entry": E}}, "stream": NAME}``); rows
carry a ``_log`` column (multi_log.py).  On the driver:

  * ``initialOffset``: every log listed at start at its earliest entry, its
    end (``latest``), or the position the ``startingOffsets`` JSON names.
  * ``latestOffset(start, limit)``: lists the logs again (``logPattern`` is
    re-evaluated against ``logs/`` in etcd each trigger, so a log created
    while the query runs is picked up, from its first entry, as Kafka picks
    up new partitions), reports logs that are gone as data loss
    (``failOnDataLoss``: fail with ``LogTruncated``, or warn and drop them)
    and logs deleted and created again under their name (the uid recorded
    with each log's position differs: ``LogRecreated``, or warn and read
    the new log from its first entry),
    measures each log as the single-log source does, and shares the
    admission budgets fairly between the logs (multi_offsets.plan_ends);
    ``minEntriesPerTrigger`` counts the entries waiting in all the logs.
    Under ``Trigger.AvailableNow`` the logs and ends fixed by
    ``prepareForTriggerAvailableNow`` bound the run: logs created later wait
    for the next run.
  * A log must record the stream's schema (fixed when the query starts), or
    extend it with added columns (mergeSchema: the stream reads the columns
    it knows); a log that has no schema and no segment yet is waited for;
    anything else fails the trigger with ``SchemaMismatch`` naming the log.
  * ``partitions(start, end)``: per log, the single-log plan of [start, end)
    (a log missing from ``start`` is new: from its first entry), each slice
    tagged with its log; ``minPartitions`` counts the slices of all logs.
  * ``commit(end)``: records the query's position in every log of ``end``
    (``positions/<log>/<name>``), so truncation keeps what each still needs.
"""
from __future__ import annotations

import dataclasses
import json
import re
from typing import Iterator, Optional

import pyarrow as pa
from pyspark.sql.datasource import InputPartition
from pyspark.sql.streaming.datasource import ReadLimit

from pybk_spark import errors
from pybk_spark.logs.log import list_logs, read_log
from pybk_spark.logs.positions import record
from pybk_spark.protocol import log_identity
from pybk_spark.protocol.log_metadata import LogMetadata
from pybk_spark.protocol.offload_record import SegmentOffload
from pybk_spark.protocol.positions import RegisteredPosition
from pybk_spark.spark import arrow_codec, data_loss, offloaded
from pybk_spark.spark import multi_offsets as mo
from pybk_spark.spark.multi_log import LogSlicePartition, _share, add_log_column
from pybk_spark.spark.options import ReadOptions
from pybk_spark.spark.planning import Slice, split_to_min
from pybk_spark.spark.reader import partition_of, read_partition
from pybk_spark.spark.stream_offsets import (Offset, advance, count, delay_batch, lag,
                                             with_uid)
from pybk_spark.spark.stream_reader import (BookKeeperStreamReader, _average_entry_bytes,
                                            plan_range)
from pybk_spark.spark.spark_errors import our_line_first


def schema_fits(stream_schema: Optional[str], md: LogMetadata) -> Optional[bool]:
    """True: the stream reads this log; None: not yet (no schema, no segment);
    False: it records another schema."""
    if md.schema == stream_schema:
        return True
    if md.schema is None:
        return None if not md.segments and md.truncated_ledgers == 0 else False
    if stream_schema is None:
        return False
    want, got = arrow_codec.decode_schema(stream_schema), arrow_codec.decode_schema(md.schema)
    n = len(want)
    return got.names[:n] == want.names and pa.schema(list(got)[:n]).equals(want)


class BookKeeperMultiLogStreamReader(BookKeeperStreamReader):
    # Trigger.AvailableNow: every log's end when the trigger was prepared
    _targets: Optional[dict[str, Offset]] = None

    # -- the logs -------------------------------------------------------------------------------
    def _listed(self) -> dict[str, LogMetadata]:
        """The logs of the query now that the stream can read (name -> metadata)."""
        store = self._client().metadata_store
        opts = self.opts.read
        names: list[str] = []
        if opts.logs:
            names = list(opts.logs)
        elif opts.log_pattern is not None:
            pattern = re.compile(opts.log_pattern)
            names = sorted(n for n in list_logs(store) if pattern.fullmatch(n))
        out = {}
        for name in names:
            try:
                md = read_log(store, name)[0]
            except errors.LogNotFound:
                continue                               # listed, then deleted: gone
            fits = schema_fits(self.table_schema, md)
            if fits is False:
                raise errors.SchemaMismatch(
                    f"log {name!r} records another schema than the stream's (fixed when the "
                    "query started); every log of a stream must record the same schema",
                    log=name)
            if fits:
                out[name] = md
        return out

    @staticmethod
    def _first(md: LogMetadata) -> Offset:
        return Offset(md.truncated_ledgers, 0)

    def _again(self, recorded: dict[str, Optional[str]],
               logs: dict[str, LogMetadata]) -> list[str]:
        """The logs of ``logs`` deleted and created again since their uid was
        ``recorded``, each reported as data loss (failOnDataLoss)."""
        again = mo.recreated_logs(recorded, {n: md.uid for n, md in logs.items()})
        for name in again:
            data_loss.report(self.opts.read.fail_on_data_loss,
                             log_identity.describe(name, recorded[name], logs[name].uid),
                             errors.LogRecreated, log=name)
        return again

    def _begins(self, start: dict, logs: dict[str, LogMetadata]) -> dict[str, Offset]:
        """Start of every log read now: gone logs reported (data loss), new
        and recreated logs from their first entry, truncated positions clamped."""
        again = self._again(mo.uids(start), logs)
        kept = {n: o for n, o in self._in_map(start).items() if n not in again}
        begins, gone = mo.reconcile(kept, sorted(logs),
                                    {n: self._first(md) for n, md in logs.items()})
        for name in gone:
            data_loss.report(self.opts.read.fail_on_data_loss,
                             "a log the stream was reading was deleted", log=name)
        return {n: self._clamp(logs[n], b) for n, b in begins.items()}

    def _in_map(self, offset: dict) -> dict[str, Offset]:
        name = offset.get("stream") if isinstance(offset, dict) else None
        if name is not None and self._name is None:
            self._name = str(name)
        return mo.parse(offset)

    def _out_map(self, offsets: dict[str, Offset], logs: dict[str, LogMetadata]) -> dict:
        d = mo.to_dict(offsets, {n: md.uid for n, md in logs.items()})
        if self._name is not None:
            d["stream"] = self._name
        return d

    # -- driver ---------------------------------------------------------------------------------
    @our_line_first
    def initialOffset(self) -> dict:
        logs = self._listed()
        self._name = self._new_name()
        starting = self.opts.starting
        if starting == "earliest":
            return self._out_map({n: self._first(md) for n, md in logs.items()}, logs)
        if starting == "latest":
            return self._out_map({n: self._end_of(md) for n, md in logs.items()}, logs)
        named = mo.parse_starting(starting)
        again = self._again(mo.uids({mo.LOGS_KEY: json.loads(starting)}), logs)
        return self._out_map({n: self._first(md) if n in again else named.get(n, self._first(md))
                              for n, md in logs.items()}, logs)

    def _end_of(self, md: LogMetadata) -> Offset:
        first = self._first(md)
        return advance(first, self._extents(md, first))

    @our_line_first
    def prepareForTriggerAvailableNow(self) -> None:
        self._targets = {n: self._end_of(md) for n, md in self._listed().items()}

    @our_line_first
    def latestOffset(self, start: dict, limit: ReadLimit) -> dict:
        logs = self._listed()
        targets = self._targets
        if targets is not None:                            # AvailableNow: its logs only
            logs = {n: md for n, md in logs.items() if n in targets}
        begins = self._begins(start, logs)
        extents = {n: self._extents(logs[n], b) for n, b in begins.items()}
        averages = {n: _average_entry_bytes(logs[n]) for n in begins}
        latest = {n: advance(b, extents[n]) for n, b in begins.items()}
        if targets is not None:
            latest = {n: max(begins[n], min(latest[n], targets[n])) for n in latest}
        most, nbytes, least = self._budgets(limit)
        now = self._clock()
        available = sum(count(begins[n], latest[n], extents[n]) for n in begins)
        if targets is None and delay_batch(available, least, now - self._last_batch_at,
                                                self.opts.max_trigger_delay_s):
            ends = dict(begins)                                # minEntriesPerTrigger: wait
        else:
            ends = mo.plan_ends(begins, extents, averages, most, nbytes)
            ends = {n: min(e, latest[n]) for n, e in ends.items()}     # AvailableNow's end
        if any(ends[n] > begins[n] for n in ends):
            self._last_batch_at = now
        behind = [lag(ends[n], extents[n], averages[n]) for n in ends]
        self._report = dict(mo.to_dict(latest),
                            entriesBehindLatest=sum(e for e, _ in behind),
                            bytesBehindLatest=-1 if any(b < 0 for _, b in behind)
                            else sum(b for _, b in behind))
        return self._out_map(ends, logs)

    @our_line_first
    def partitions(self, start: dict, end: dict) -> list[InputPartition]:
        bk = self._client()
        starts, finishes = self._in_map(start), self._in_map(end)
        start_uids, end_uids = mo.uids(start), mo.uids(end)
        tagged: list[tuple[str, Slice]] = []
        records: dict[str, dict[int, SegmentOffload]] = {}
        for name in sorted(finishes):
            try:
                md = read_log(bk.metadata_store, name)[0]
            except errors.LogNotFound:
                data_loss.report(self.opts.read.fail_on_data_loss,
                                 "a log the stream was reading was deleted", log=name)
                continue
            if self._again({name: end_uids.get(name)}, {name: md}):
                continue                    # planned in a log since deleted: nothing to read
            begin = self._first(md)
            if name in starts and not self._again({name: start_uids.get(name)}, {name: md}):
                begin = self._clamp(md, starts[name])
            if finishes[name] <= begin:
                continue
            extents = self._extents(md, begin, read_lac=False)
            tagged.extend((name, s) for s in plan_range(bk, md, begin, finishes[name],
                                                        extents, self.opts.read))
            records[name] = offloaded.records_in(md)
        out: list[InputPartition] = []
        for name, s in tagged:          # minPartitions over all logs' slices
            for piece in split_to_min([s], _share(s, tagged, self.opts.read.min_partitions)):
                out.append(LogSlicePartition(name, partition_of(piece, records[name])))
        return out

    @our_line_first
    def commit(self, end: dict) -> None:
        """Record the query's position in every log of ``end`` (CAS, forward only)."""
        offsets = self._in_map(end)
        if self._name is None:
            return
        store = self._client().metadata_store
        recorded = mo.uids(end)
        for name, offset in sorted(offsets.items()):
            if not self._still_there(name, with_uid({}, recorded.get(name))):
                continue
            record(store, RegisteredPosition(name, self._name, offset.index, offset.entry,
                                             "stream", self._wall_clock(),
                                             uid=recorded.get(name)))

    # -- executors ------------------------------------------------------------------------------
    @our_line_first
    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        if not isinstance(partition, LogSlicePartition):
            return
        one = self._one(partition.log)
        for batch in read_partition(partition.part, one, self.table_schema):
            yield add_log_column(batch, partition.log)

    def _one(self, name: str) -> ReadOptions:
        return dataclasses.replace(self.opts.read, log=name, logs=(), log_pattern=None,
                                   min_partitions=None)
