"""Batch reads (``format("bookkeeper")`` with option ``log``) of a log's
segments offloaded to Parquet files (logs/offload.py): planned from the
segment's record instead of its ledger (no bookie, no ledger metadata),
read on the executor from the files, checked against the record, as the
entries the ledger held (the same ledger and entry ids), then decoded like
any slice.  The streaming source plans from ledgers only."""
from __future__ import annotations

from typing import Iterator

import pyarrow as pa

from pybk_spark.logs import offload_files
from pybk_spark.logs.log import read_log
from pybk_spark.protocol.offload_record import SegmentOffload
from pybk_spark.spark.planning import LedgerView, Slice


def records_of(bk, log: str | None) -> dict[int, SegmentOffload]:
    """Ledger id -> offload record of each offloaded segment of ``log``."""
    if log is None:
        return {}
    md = read_log(bk.metadata_store, log)[0]
    return {s.ledger_id: s.offload for s in md.segments if s.offload is not None}


def view_of(ledger_id: int, record: SegmentOffload) -> LedgerView:
    """The segment as planning sees a closed ledger: every entry readable,
    one fragment on no bookie."""
    return LedgerView(ledger_id, ((record.first_entry, record.last_entry, ()),),
                      record.last_entry)


def partition_of(s: Slice, records: dict[int, SegmentOffload]):
    """The slice's partition; an offloaded segment's carries its record
    (``offload``), which sends the executor to the files."""
    from pybk_spark.spark.reader import LedgerSlicePartition
    part = LedgerSlicePartition.of(s)
    part.offload = records.get(s.ledger_id)
    return part


def read_slice(part, record: SegmentOffload, max_entries: int) -> Iterator[pa.RecordBatch]:
    """The slice's entries (``ledger_id, entry_id, payload, timestamp``)."""
    from pybk_spark.spark.reader import to_raw_batch
    table = offload_files.as_entries(offload_files.read_segment(record), part.ledger_id)
    table = table.slice(part.first - record.first_entry, part.last - part.first + 1)
    for batch in table.to_batches(max_chunksize=max(1, max_entries)):
        yield to_raw_batch(batch)
