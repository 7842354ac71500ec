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

A log may record its own policy, three properties of its metadata
(``offload.keep_segments``, ``offload.min_age_s``, ``offload.keep_bytes``,
changed by CAS like everything there: ``with_log_policy`` is the
transform, re-run on a fresh read after a conflict, so a rule set
concurrently by another operator is kept unless this change sets it too).
``policy_for`` is the policy a run applies to the log: the log's rules when
it records them, the run's own otherwise; the grace period and the orphan
age are always the run's (they describe the offloader and its location,
not the log).

Pure: no I/O, no clock (times are given in µs).
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Optional

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
        if self.keep_bytes < -1:
            raise errors.IncorrectParameter(
                f"offload keep_bytes {self.keep_bytes}: bytes >= 0, or -1 for no size rule")
        if self.min_age_s < 0 or self.grace_s < 0 or self.orphan_age_s < 0:
            raise errors.IncorrectParameter(
                "offload min_age_s, grace_s and orphan_age_s are seconds >= 0")


POLICY_KEEP_SEGMENTS = "offload.keep_segments"
POLICY_MIN_AGE_S = "offload.min_age_s"
POLICY_KEEP_BYTES = "offload.keep_bytes"
POLICY_PROPERTIES = (POLICY_KEEP_SEGMENTS, POLICY_MIN_AGE_S, POLICY_KEEP_BYTES)


def _rule(md: LogMetadata, key: str, kind: type) -> Any:
    raw = md.properties[key]
    try:
        return kind(raw)
    except ValueError:
        raise errors.IncorrectParameter(
            f"log {md.name!r} property {key!r} = {raw!r}: expected a {kind.__name__}; "
            "set it again with `pybk offload LOG --set-policy`", log=md.name,
            property=key) from None


def log_policy(md: LogMetadata, run: OffloadPolicy) -> Optional[OffloadPolicy]:
    """The policy ``md`` records (with ``run``'s grace period and orphan age),
    or None when it records none."""
    if not any(k in md.properties for k in POLICY_PROPERTIES):
        return None
    rules = OffloadPolicy()
    return replace(
        run,
        keep_segments=_rule(md, POLICY_KEEP_SEGMENTS, int)
        if POLICY_KEEP_SEGMENTS in md.properties else rules.keep_segments,
        min_age_s=_rule(md, POLICY_MIN_AGE_S, float)
        if POLICY_MIN_AGE_S in md.properties else rules.min_age_s,
        keep_bytes=_rule(md, POLICY_KEEP_BYTES, int)
        if POLICY_KEEP_BYTES in md.properties else rules.keep_bytes)


def policy_for(md: LogMetadata, run: OffloadPolicy) -> OffloadPolicy:
    """The policy a run with ``run`` applies to the log ``md``: its own when
    it records one, else ``run``."""
    return log_policy(md, run) or run


def with_log_policy(md: LogMetadata, *, keep_segments: Optional[int] = None,
                    min_age_s: Optional[float] = None, keep_bytes: Optional[int] = None,
                    clear: bool = False) -> LogMetadata:
    """The CAS transform that records the log's policy: the rules given, the
    others as the log records them (the defaults when it records none), all
    three written; ``clear``: the log records none (runs apply their own).
    ``IncorrectParameter`` for a rule ``OffloadPolicy`` refuses."""
    props = {k: v for k, v in md.properties.items() if k not in POLICY_PROPERTIES}
    if not clear:
        rules = OffloadPolicy()

        def recorded(key: str, kind: type, default: Any) -> Any:
            # only the rules not given are read: a bad recorded value is fixed by setting it
            return _rule(md, key, kind) if key in md.properties else default
        new = OffloadPolicy(
            keep_segments=recorded(POLICY_KEEP_SEGMENTS, int, rules.keep_segments)
            if keep_segments is None else keep_segments,
            min_age_s=recorded(POLICY_MIN_AGE_S, float, rules.min_age_s)
            if min_age_s is None else min_age_s,
            keep_bytes=recorded(POLICY_KEEP_BYTES, int, rules.keep_bytes)
            if keep_bytes is None else keep_bytes)
        props.update({POLICY_KEEP_SEGMENTS: str(new.keep_segments),
                      POLICY_MIN_AGE_S: repr(float(new.min_age_s)),
                      POLICY_KEEP_BYTES: str(new.keep_bytes)})
    return replace(md, properties=props)


def policy_dict(policy: OffloadPolicy) -> dict[str, Any]:
    """The rules of ``policy`` a log records, as ``--status`` shows them."""
    return {"keep_segments": policy.keep_segments, "min_age_s": policy.min_age_s,
            "keep_bytes": policy.keep_bytes}


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
