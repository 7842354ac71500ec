"""Dropping a log's oldest segments: by an operator (``truncate_log``,
``pybk truncatelog``) or by the log's retention (``apply_retention``,
protocol/log_retention.py).

Theory of operation
-------------------
Both are one CAS of the log's list that re-decides on every conflict, then
the deletion of the ledgers that CAS dropped, and of the files of those
that were offloaded (logs/offload.py), never before (a reader of the
old list may still find them): ``_drop_segments``.  Neither passes a
registered read position (a streaming query's committed cursor,
protocol/positions.py), unless an operator forces a truncation.  Retention
is applied by the log's writers after a roll (``LogWriter``) or a commit
(the Spark writer and sink), and by every autorecovery round; ``retain`` is
that best-effort call, whose failure never fails the roll, commit or round.
"""
from __future__ import annotations

import logging
from typing import Callable, Optional

from pybk_spark import errors
from pybk_spark.ledger.port import LedgerClient
from pybk_spark.logs.log import read_log, update_log
from pybk_spark.logs.positions import list_positions
from pybk_spark.metadata.store import MetadataStore
from pybk_spark.logs.offload_files import delete_record_files
from pybk_spark.protocol import log_metadata as logmd
from pybk_spark.protocol import log_retention
from pybk_spark.protocol.log_metadata import LogMetadata
from pybk_spark.protocol.positions import blockers
from pybk_spark.protocol.offload_record import SegmentOffload

_log = logging.getLogger("pybk_spark.logs")


def truncate_log(bk: LedgerClient, name: str, before_ledger_id: int, *, force: bool = False) -> list[int]:
    """CAS the list first, then delete the dropped ledgers.  Refused
    (``IllegalOp``, nothing changed) when a registered read position
    (``positions/<log>/``, protocol/positions.py) still needs a segment it
    would drop, unless ``force``."""
    registered = [] if force else list_positions(bk.metadata_store, name)

    def transform(m: LogMetadata) -> tuple[LogMetadata, list[int]]:
        first_kept = m.truncated_ledgers + m.segment_index(before_ledger_id)
        stuck = blockers(first_kept, registered, m.uid)
        if stuck:
            raise errors.IllegalOp(
                "truncation would drop segments that registered read positions still need: "
                + ", ".join(f"{p.name} at index {p.index} entry {p.entry}" for p in stuck)
                + f"; drop a stale one with 'pybk dropposition {name} NAME' "
                "or truncate with force=True", log=name, first_kept_index=first_kept)
        return logmd.truncate_before(m, before_ledger_id)
    return _drop_segments(bk, name, transform)


def _drop_segments(bk: LedgerClient, name: str,
                   transform: Callable[[LogMetadata], tuple[LogMetadata, list[int]]]) -> list[int]:
    """Apply a truncation ``transform`` (-> new metadata, dropped ledgers) by
    CAS, re-deciding on every conflict; then delete the ledgers the CAS
    that landed dropped (never before: a reader of the old list may still
    find them).  A crash in between leaves ledgers that no log names (their
    custom metadata ``log`` says which log made them), as ``truncatelog``
    always could; ``pybk deleteledger`` removes them."""
    dropped: list[int] = []
    records: list[SegmentOffload] = []

    def apply(m: LogMetadata) -> LogMetadata:
        new, ids = transform(m)
        dropped[:] = ids
        records[:] = [s.offload for s in m.segments if s.ledger_id in ids and s.offload]
        return new
    update_log(bk.metadata_store, name, apply)
    for ledger_id in dropped:
        try:
            bk.delete_ledger(ledger_id)
        except errors.NoSuchLedger:
            pass
    for record in records:             # offloaded segments: their files too
        try:
            delete_record_files(record)
        except errors.BKError as exc:  # named by no record now: the next offload run's orphans
            _log.warning("event=offloaded_files_not_deleted log=%s error=%r", name, exc)
    return dropped


def set_log_retention(store: MetadataStore, name: str, *, ms: Optional[int] = None,
                      nbytes: Optional[int] = None) -> LogMetadata:
    """Set the log's ``retention.ms`` / ``retention.bytes`` (-1: no limit;
    None: unchanged), by CAS.  Applied (``apply_retention``) when the log
    is next rolled or committed to, and by every autorecovery round."""
    return update_log(store, name, lambda m: log_retention.with_retention(m, ms=ms, nbytes=nbytes))


def apply_retention(bk: LedgerClient, name: str, wall_clock: Callable[[], float],
                    md: Optional[LogMetadata] = None) -> list[int]:
    """Drop and delete the oldest segments the log's retention has expired
    (protocol/log_retention.py); the dropped ledger ids.  ``md``: the
    metadata the caller has just written, so a log with nothing expired
    costs no etcd read.  ``wall_clock`` (seconds) is read only for a log
    with limits.  Registered read positions hold retention back."""
    if md is None:
        md = read_log(bk.metadata_store, name)[0]
    if not log_retention.retention_of(md).limited:
        return []
    now_us = int(wall_clock() * 1_000_000)
    if log_retention.expired(md, now_us) == 0:
        return []
    registered = list_positions(bk.metadata_store, name)

    def transform(m: LogMetadata) -> tuple[LogMetadata, list[int]]:
        n = log_retention.expired(m, now_us, registered)
        if n == 0:
            return m, []
        return logmd.truncate_before(m, m.segments[n].ledger_id)
    dropped = _drop_segments(bk, name, transform)
    if dropped:
        _log.info("event=log_retention log=%s dropped_ledgers=%d first=%d last=%d",
                  name, len(dropped), dropped[0], dropped[-1])
    return dropped


def retain(bk: LedgerClient, name: str, wall_clock: Callable[[], float], md: Optional[LogMetadata] = None,
           *, retry: str) -> Optional[list[int]]:
    """``apply_retention`` where a failure must not fail the caller (after a
    roll, a commit, in an autorecovery round): the dropped ledger ids, or
    None after logging the failure and when it will be ``retry``-ed."""
    try:
        return apply_retention(bk, name, wall_clock, md)
    except errors.BKError as exc:
        _log.warning("event=log_retention_failed log=%s error=%r retry=%r", name, exc, retry)
        return None
