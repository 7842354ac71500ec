"""Batch reads (``format("bookkeeper")`` with option ``log``) of a log's
segments offloaded to Parquet files (logs/offload.py): planned from the
segment's record instead of its ledger (no bookie, no ledger metadata),
read on the executor from the files, checked against the record, as the
entries the ledger held (the same ledger and entry ids), then decoded like
any slice.  The streaming source plans the same way, from the log metadata
it measured (``records_in``).  A slice planned on a ledger that is deleted
before or while it is read (the offload's grace period is over) carries on
from the segment's files at the next entry (``ledger_then_files``)."""
from __future__ import annotations

from typing import Iterator

import pyarrow as pa

from pybk_spark.ledger.port import LedgerClient
from pybk_spark.logs import offload_files
from pybk_spark.logs.log import read_log
from pybk_spark.protocol.log_metadata import LogMetadata
from pybk_spark.protocol.offload_record import SegmentOffload
from pybk_spark.spark.planning import LedgerView


def records_of(bk: LedgerClient, log: str | None) -> dict[int, SegmentOffload]:
    """Ledger id -> offload record of each offloaded segment of ``log``."""
    if log is None:
        return {}
    return records_in(read_log(bk.metadata_store, log)[0])


def records_in(md: LogMetadata) -> dict[int, SegmentOffload]:
    """Ledger id -> offload record of each offloaded segment of ``md``."""
    return {s.ledger_id: s.offload for s in md.segments if s.offload is not None}


def view_of(ledger_id: int, record: SegmentOffload) -> LedgerView:
    """The segment as planning sees a closed ledger: every entry readable,
    one fragment on no bookie."""
    return LedgerView(ledger_id, ((record.first_entry, record.last_entry, ()),),
                      record.last_entry)


def read_slice(ledger_id: int, first: int, last: int, record: SegmentOffload,
               max_entries: int) -> Iterator[pa.RecordBatch]:
    """Entries ``first..last`` of the segment, as the ledger's entry batches."""
    if first > last:
        return
    table = offload_files.as_entries(offload_files.read_segment(record), ledger_id)
    table = table.slice(first - record.first_entry, last - first + 1)
    yield from table.to_batches(max_chunksize=max(1, max_entries))
