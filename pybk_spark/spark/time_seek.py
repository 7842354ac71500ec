"""Time-based starts and ends -> entry ids, on the driver while planning.

Theory of operation
-------------------
For every ledger of a read that has a start or end time (time_options.py),
find the first entry appended at or after that time
(protocol/append_time.py):
  1. the segment's recorded first/last append time (log metadata) decides
     alone when the time is outside them: no ledger is opened;
  2. otherwise (the time falls inside, or the times are unknown: the open
     tail, a segment closed by recovery) the ledger is searched by a binary
     search over its readable prefix, one single-entry read per step
     (O(log n) entries, never the whole ledger);
  3. a segment offloaded to Parquet files (logs/offload.py) is searched in
     its files instead, whose ledger may be gone: the first row whose
     ``timestamp`` (``_timestamp`` for a DataFrame log) is at or after the
     time gives the entry.
A ledger whose entries carry no time (written before append times were
recorded, or with the ledger API) counts as older than any time, without
being read: a start time skips it, an end time keeps all of it.

The start becomes that ledger's first entry, the end its exclusive end, as
``startingOffsets`` / ``endingOffsets`` would give them.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Optional, Sequence

import numpy as np
import pyarrow as pa

from pybk_spark.logs import offload_files
from pybk_spark.logs.log import read_log
from pybk_spark.protocol import append_time as at
from pybk_spark.protocol.log_metadata import LogMetadata
from pybk_spark.protocol.offload_record import SegmentOffload
from pybk_spark.spark import arrow_codec
from pybk_spark.spark.client_cache import catch_up_lac, close_handle, open_handle
from pybk_spark.spark.options import ReadOptions
from pybk_spark.spark.planning import LedgerView

if TYPE_CHECKING:
    from pybk_spark.ledger.port import LedgerClient


class LogTimes:
    """What the search needs to know about the log being read: each
    segment's recorded (first, last) append time, whether its entries are
    DataFrame rows, and the offload records of its offloaded segments."""

    def __init__(self, times: dict[int, tuple[int, int]], dataframe: bool,
                 offloaded: Optional[dict[int, SegmentOffload]] = None):
        self.times, self.dataframe = times, dataframe
        self.offloaded = offloaded or {}

    @classmethod
    def of(cls, md: LogMetadata) -> LogTimes:
        return cls({s.ledger_id: (s.first_time_us, s.last_time_us) for s in md.segments},
                   md.schema is not None,
                   {s.ledger_id: s.offload for s in md.segments if s.offload is not None})

    @classmethod
    def read(cls, bk: LedgerClient, log: Optional[str]) -> LogTimes:
        if log is None:
            return cls({}, False)                # option 'ledgers': raw ledgers
        return cls.of(read_log(bk.metadata_store, log)[0])


def entry_at_or_after(bk: LedgerClient, view: LedgerView, t_ms: int, log: LogTimes,
                      passwords: Sequence[bytes]) -> int:
    """The first entry of ``view`` appended at or after ``t_ms`` (readable
    last + 1 when there is none)."""
    t_us, none = t_ms * 1000, view.readable_last + 1
    first_us, last_us = log.times.get(view.ledger_id, (at.UNKNOWN, at.UNKNOWN))
    side = at.segment_side(first_us, last_us, t_us)
    if side == at.BEFORE or view.readable_last < 0:
        return none
    if side == at.AT_START:
        return 0
    record = log.offloaded.get(view.ledger_id)
    if record is not None:
        return _in_files(record, t_us, none)
    prefixed = at.is_time_prefixed(bk.get_ledger_metadata(view.ledger_id).custom)
    if not prefixed and not log.dataframe:
        return none                         # no times: older than any time
    handle = open_handle(bk, view.ledger_id, recovery=False, passwords=passwords)
    try:
        catch_up_lac(handle, view.readable_last)

        def time_of(entry_id: int) -> Optional[int]:
            payload = handle.read(entry_id, entry_id)[0].payload
            return at.time_of_framed(payload) if prefixed else arrow_codec.entry_time(payload)
        return at.first_at_or_after(0, view.readable_last, t_us, time_of)
    finally:
        close_handle(handle)


def _in_files(record: SegmentOffload, t_us: int, none: int) -> int:
    """The first entry of an offloaded segment appended at or after ``t_us``
    (``none`` when there is none; rows without a time are older than any)."""
    table = offload_files.read_segment(record)
    time_col = "timestamp" if "timestamp" in table.schema.names else "_timestamp"
    times = table.column(time_col).cast(pa.int64()).fill_null(-1).to_numpy()
    at_or_after = np.flatnonzero(times >= t_us)
    if not len(at_or_after):
        return none
    entry_ids = table.column(offload_files.entry_column(table))
    return int(entry_ids[int(at_or_after[0])].as_py())


def resolve(bk: LedgerClient, opts: ReadOptions, views: list[LedgerView], starts: list[int],
            ends: list[int]) -> tuple[list[int], list[int]]:
    """``starts`` / ``ends`` (per view, as planning takes them) with the
    read's time bounds applied."""
    bounds = opts.times
    if bounds.is_empty:
        return starts, ends
    log = LogTimes.read(bk, opts.log)
    starts, ends = list(starts), list(ends)
    for i, view in enumerate(views):
        t = bounds.start_for(view.ledger_id)
        if t is not None:
            starts[i] = entry_at_or_after(bk, view, t, log, opts.passwords)
        t = bounds.end_for(view.ledger_id)
        if t is not None:
            ends[i] = entry_at_or_after(bk, view, t, log, opts.passwords)
    return starts, ends
