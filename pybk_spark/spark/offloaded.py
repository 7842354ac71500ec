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

from typing import Iterator, Optional

import pyarrow as pa

from pybk_spark import errors
from pybk_spark.logs import offload_files
from pybk_spark.logs.log import read_log
from pybk_spark.protocol.log_metadata import LogMetadata
from pybk_spark.protocol.offload_record import SegmentOffload
from pybk_spark.spark.planning import LedgerView, Slice


def records_of(bk, log: str | None) -> dict[int, SegmentOffload]:
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


def partition_of(s: Slice, records: dict[int, SegmentOffload]):
    """The slice's partition; an offloaded segment's carries its record
    (``offload``), which sends the executor to the files."""
    from pybk_spark.spark.reader import LedgerSlicePartition
    part = LedgerSlicePartition.of(s)
    part.offload = records.get(s.ledger_id)
    return part


def read_slice(part, record: SegmentOffload, max_entries: int,
               first: Optional[int] = None) -> Iterator[pa.RecordBatch]:
    """The slice's entries (``ledger_id, entry_id, payload, timestamp``),
    from ``first`` (default: the slice's first) on."""
    from pybk_spark.spark.reader import to_raw_batch
    first = part.first if first is None else first
    if first > part.last:
        return
    table = offload_files.as_entries(offload_files.read_segment(record), part.ledger_id)
    table = table.slice(first - record.first_entry, part.last - first + 1)
    for batch in table.to_batches(max_chunksize=max(1, max_entries)):
        yield to_raw_batch(batch)


def ledger_then_files(from_ledger: Iterator[pa.RecordBatch], part, log: Optional[str],
                      bk, max_entries: int) -> Iterator[pa.RecordBatch]:
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
        record = records_of(bk, log).get(part.ledger_id) if log is not None else None
        if record is None:
            raise
        yield from read_slice(part, record, max_entries, next_entry)
