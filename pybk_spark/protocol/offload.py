"""Tiered storage, the decisions: which closed segments of a log go to
Parquet files, the CAS transforms that record them, and when their ledgers
may leave the bookies.  logs/offload.py runs them; logs/offload_files.py
writes and reads the files.

Theory of operation
-------------------
A segment is offloaded in four steps, each safe to stop after:
  1. its entries are written to files under temporary names (invisible to a
     table reader: their names start with ``_``);
  2. the files are read back and checked (row count, per-entry digests
     against what was read from the ledger), then renamed to their final
     names, which depend only on the log and the ledger: a second run
     overwrites them, never adds a second copy;
  3. ``commit`` records them in the segment (``Segment.offload``) by CAS;
     readers read the segment from the files from then on;
  4. after ``grace_s`` (readers that planned on the ledger finish), the
     ledger is deleted from the bookies, then ``mark_ledger_deleted``.
A stop before 3 leaves the segment readable from its ledger (files that no
record names are orphans, removed by a later run); a stop after 3 leaves it
readable from the files, and from the ledger until 4.

``candidates`` picks what a policy offloads: closed, non-empty segments not
yet offloaded, never the newest ``keep_segments`` (a new leader fences the
last two); among the rest, those older than ``min_age_s`` (by their last
append time; 0: no age rule) or beyond the newest ``keep_bytes`` kept on
bookies (-1: no size rule), or all of them when neither rule is set; the
oldest first.

Pure: no I/O, no clock (times are given in µs).
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Optional

from pybk_spark import errors
from pybk_spark.protocol.log_metadata import SEGMENT_CLOSED, LogMetadata, Segment
from pybk_spark.protocol.offload_record import (STATE_LEDGER_DELETED, STATE_OFFLOADED,
                                                SegmentOffload)


@dataclass(frozen=True)
class OffloadPolicy:
    keep_segments: int = 2         # newest segments always kept on bookies (>= 2)
    min_age_s: float = 0.0         # offload segments whose last entry is older than this
    keep_bytes: int = -1           # or beyond this many newest bytes (-1: no size rule)
    grace_s: float = 3600.0        # between the commit and the ledger's deletion
    orphan_age_s: float = 600.0    # uncommitted files older than this are removed

    def __post_init__(self) -> None:
        if self.keep_segments < 2:
            raise errors.IncorrectParameter(
                f"offload keep_segments {self.keep_segments}: at least 2 (a new leader "
                "fences and recovers a log's last two ledgers)")
        if self.min_age_s < 0 or self.grace_s < 0 or self.orphan_age_s < 0:
            raise errors.IncorrectParameter(
                "offload min_age_s, grace_s and orphan_age_s are seconds >= 0")


def candidates(md: LogMetadata, policy: OffloadPolicy, now_us: int) -> list[int]:
    """Ledger ids of the segments ``policy`` offloads now, oldest first."""
    eligible = md.segments[:max(0, len(md.segments) - policy.keep_segments)]
    newer_bytes = sum(max(s.byte_count, 0) for s in md.segments[len(eligible):])
    out: list[int] = []
    ruled = policy.min_age_s > 0 or policy.keep_bytes >= 0
    for s in reversed(eligible):          # newest first, to count bytes kept
        old = policy.min_age_s > 0 and s.last_time_us >= 0 \
            and now_us - s.last_time_us >= policy.min_age_s * 1e6
        beyond = policy.keep_bytes >= 0 and newer_bytes >= policy.keep_bytes
        if s.state == SEGMENT_CLOSED and s.entry_count > 0 and s.offload is None \
                and (old or beyond or not ruled):
            out.append(s.ledger_id)
        newer_bytes += max(s.byte_count, 0)
    return out[::-1]


def segment_of(md: LogMetadata, ledger_id: int) -> Optional[Segment]:
    for s in md.segments:
        if s.ledger_id == ledger_id:
            return s
    return None


def commit(md: LogMetadata, ledger_id: int, record: SegmentOffload) -> LogMetadata:
    """The CAS transform of step 3: ``record`` in the segment.  Unchanged when
    the segment already has a record (another run committed it: its files
    have the same names); ``LogTruncated`` when the segment is gone, and
    ``IllegalOp`` when it is not closed or its entries are not the record's."""
    s = segment_of(md, ledger_id)
    if s is None:
        raise errors.LogTruncated("the segment was truncated away before its offload "
                                  "was committed", log=md.name, ledger_id=ledger_id)
    if s.offload is not None:
        return md
    if s.state != SEGMENT_CLOSED or (record.first_entry, record.last_entry) != (0, s.entry_count - 1):
        raise errors.IllegalOp(f"offload of ledger {ledger_id} names entries "
                               f"{record.first_entry}..{record.last_entry}, the segment "
                               f"holds {max(s.entry_count, 0)} (state {s.state})",
                               log=md.name, ledger_id=ledger_id)
    return _with(md, ledger_id, replace(record, state=STATE_OFFLOADED))


def deletable(md: LogMetadata, grace_s: float, now_us: int) -> list[int]:
    """Ledger ids whose offload was committed at least ``grace_s`` ago and
    whose ledger is still recorded as on the bookies."""
    return [s.ledger_id for s in md.segments
            if s.offload is not None and s.offload.state == STATE_OFFLOADED
            and now_us - s.offload.committed_us >= grace_s * 1e6]


def mark_ledger_deleted(md: LogMetadata, ledger_id: int) -> LogMetadata:
    """The CAS transform after step 4 (unchanged if the segment is gone)."""
    s = segment_of(md, ledger_id)
    if s is None or s.offload is None or s.offload.state == STATE_LEDGER_DELETED:
        return md
    return _with(md, ledger_id, replace(s.offload, state=STATE_LEDGER_DELETED))


def _with(md: LogMetadata, ledger_id: int, record: SegmentOffload) -> LogMetadata:
    return replace(md, segments=tuple(replace(s, offload=record) if s.ledger_id == ledger_id
                                      else s for s in md.segments))


def status(md: LogMetadata) -> dict[str, int]:
    """Counts for ``pybk offload --status``."""
    offloaded = [s for s in md.segments if s.offload is not None]
    return {"segments": len(md.segments), "offloaded": len(offloaded),
            "ledgers_deleted": sum(1 for s in offloaded
                                   if s.offload is not None
                                   and s.offload.state == STATE_LEDGER_DELETED),
            "offloaded_bytes": sum(s.offload.size for s in offloaded if s.offload is not None),
            "offloaded_rows": sum(s.offload.rows for s in offloaded if s.offload is not None),
            "on_bookies": sum(1 for s in md.segments if s.offload is None
                              or s.offload.state != STATE_LEDGER_DELETED)}
