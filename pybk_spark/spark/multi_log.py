"""Batch reads of several logs in one query: options ``logs`` and ``logPattern``.

Theory of operation
-------------------
``logs`` names the logs (``a,b,c``); ``logPattern`` is a regular expression
that must match a whole log name (``re.fullmatch``) and is resolved against
``logs/`` in etcd on the driver when the read is planned (and when ``load()``
fixes the schema).  Every log read must record the same DataFrame schema, or
all be raw logs: the output is that schema plus a ``_log`` string column
naming the row's log.  Each log is planned exactly as option ``log`` plans
one (reader.py), so its guarantees (readable prefix fixed at planning,
failOnDataLoss, minPartitions over all the slices) hold per log; a partition
remembers its log and its rows get that name as a constant column (no
per-row Python).  Streams over several logs: multi_stream.py.
"""
from __future__ import annotations

import dataclasses
import re
from typing import Iterator, Optional

import numpy as np
import pyarrow as pa
from pyspark.sql.datasource import DataSourceReader, InputPartition

from pybk_spark import errors
from pybk_spark.logs.log import list_logs, read_log
from pybk_spark.metadata.store import MetadataStore
from pybk_spark.spark import data_loss
from pybk_spark.spark.options import ReadOptions
from pybk_spark.spark import offloaded
from pybk_spark.spark.planning import Slice, split_to_min
from pybk_spark.spark.reader import (LedgerSlicePartition, PlanningClient, partition_of, plan,
                                     read_partition, resolve_ledgers)
from pybk_spark.spark.spark_errors import our_line_first

LOG_COLUMN = "_log"
LOG_FIELD = pa.field(LOG_COLUMN, pa.string())


def is_multi(opts: ReadOptions) -> bool:
    return bool(opts.logs) or opts.log_pattern is not None


def log_names(store: MetadataStore, opts: ReadOptions) -> list[str]:
    """The logs to read, in name order (``logs``: as given, each must exist;
    with ``failOnDataLoss=false`` a missing one is skipped with a warning)."""
    if opts.logs:
        out = []
        for name in opts.logs:
            try:
                read_log(store, name)
                out.append(name)
            except errors.LogNotFound:
                if opts.fail_on_data_loss:
                    raise
                data_loss.report(False, "a log named in option 'logs' does not exist",
                                 log=name)
        return out
    if opts.log_pattern is None:               # not a read of several logs
        return []
    pattern = re.compile(opts.log_pattern)
    return sorted(n for n in list_logs(store) if pattern.fullmatch(n))


def common_schema(store: MetadataStore, names: list[str]) -> Optional[str]:
    """The schema all ``names`` record (None: raw logs); SchemaMismatch otherwise."""
    schemas = {name: read_log(store, name)[0].schema for name in names}
    distinct = set(schemas.values())
    if len(distinct) > 1:
        groups: dict[Optional[str], list[str]] = {}
        for name, text in schemas.items():
            groups.setdefault(text, []).append(name)
        raise errors.SchemaMismatch(
            "the logs of one read must record the same schema (or all be raw logs); "
            f"these differ: {sorted(groups.values())}")
    return next(iter(distinct)) if distinct else None


def with_log_column(schema: pa.Schema) -> pa.Schema:
    if LOG_COLUMN in schema.names:
        raise errors.IncorrectParameter(
            f"options 'logs'/'logPattern' add column {LOG_COLUMN!r} that the logs already have")
    return pa.schema(list(schema) + [LOG_FIELD])


def add_log_column(batch: pa.RecordBatch, log: str) -> pa.RecordBatch:
    """Constant ``_log`` column, built columnar (dictionary of one, cast)."""
    indices = pa.array(np.zeros(batch.num_rows, dtype=np.int32))
    column = pa.DictionaryArray.from_arrays(indices, pa.array([log], pa.string()))
    return pa.RecordBatch.from_arrays(list(batch.columns) + [column.cast(pa.string())],
                                      schema=with_log_column(batch.schema))


class LogSlicePartition(InputPartition):
    """A slice of one of the logs read (reader.LedgerSlicePartition + its log)."""

    def __init__(self, log: str, part: LedgerSlicePartition):
        super().__init__((log, part.ledger_id, part.first, part.last))
        self.log, self.part = log, part


class BookKeeperMultiLogReader(DataSourceReader):
    def __init__(self, opts: ReadOptions, table_schema: Optional[str]):
        self.opts, self.table_schema = opts, table_schema

    def _one(self, name: str) -> ReadOptions:
        return dataclasses.replace(self.opts, log=name, logs=(), log_pattern=None,
                                   min_partitions=None)

    @our_line_first
    def partitions(self) -> list[InputPartition]:
        bk = PlanningClient(self.opts.metadata_uri, self.opts.client_conf)
        try:
            names = log_names(bk.metadata_store, self.opts)
            if common_schema(bk.metadata_store, names) != self.table_schema:
                raise errors.SchemaMismatch(
                    "a log's schema changed between load() and planning; load() again",
                    logs=names)
            tagged: list[tuple[str, Slice]] = []
            records = {}
            for name in names:
                one = self._one(name)
                tagged.extend((name, s) for s in plan(bk, one, resolve_ledgers(bk, one)))
                records[name] = offloaded.records_of(bk, name)
        finally:
            bk.close()
        out: list[InputPartition] = []
        for name, s in tagged:      # minPartitions over all logs' slices
            for piece in split_to_min([s], _share(s, tagged, self.opts.min_partitions)):
                out.append(LogSlicePartition(name, partition_of(piece, records[name])))
        return out

    @our_line_first
    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        if not isinstance(partition, LogSlicePartition):
            return iter(())
        return self._read(partition)

    def _read(self, partition: LogSlicePartition) -> Iterator[pa.RecordBatch]:
        for batch in read_partition(partition.part, self._one(partition.log), self.table_schema):
            yield add_log_column(batch, partition.log)


def _share(s: Slice, tagged: list[tuple[str, Slice]], min_partitions: Optional[int]
           ) -> Optional[int]:
    """This slice's share of ``minPartitions`` (split_to_min on one slice)."""
    if not min_partitions or len(tagged) >= min_partitions:
        return None
    total = sum(t.num_entries for _, t in tagged)
    return max(1, -(-s.num_entries * min_partitions // total))
