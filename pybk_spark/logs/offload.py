"""Offloading a log's closed segments to Parquet files (tiered storage).

Theory of operation
-------------------
The steps of protocol/offload.py, each a public function so that a run can
stop after any of them and a later run carries on:

  ``stage_segment``    read the ledger, write its table under a temporary name;
  ``verify_staged``    read the file back: size, SHA-256, rows, entry range
                       and every entry's digest against the ledger's;
  ``publish_staged``   rename it to its final name (a function of the log and
                       the ledger only: a second copy can never appear);
  ``commit_staged``    record it in the segment by CAS (``Segment.offload``);
                       readers use the files from then on;
  ``delete_offloaded_ledgers``  after the policy's grace period, delete the
                       ledgers whose files are committed, then record that.

``clean_orphans`` removes what a stopped run left: temporary files, and
final files no committed record names (a stop between publish and commit,
or a truncation that stopped before deleting its files), once they are
older than the policy's ``orphan_age_s``, so that another run's files in
flight are left alone.  ``offload_log`` runs the whole: orphans, then each
candidate segment, oldest first, then the deletions.

Which segments a run offloads is the log's own policy when its metadata
records one (``set_offload_policy``; protocol/offload.py ``policy_for``),
else the run's.

One offloader runs per log at a time (``pybk offload``, ``jobs/offload.py``):
two at once stay safe (a commit that finds the segment committed changes
nothing, and publishing skips a committed segment), but do the work twice.
"""
from __future__ import annotations

import logging
import posixpath
import random
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Optional, Sequence

import pyarrow as pa

from pybk_spark import errors
from pybk_spark.ledger.port import LedgerClient
from pybk_spark.logs import offload_files as files
from pybk_spark.logs.log import read_log, update_log
from pybk_spark.logs.log_reader import _concat, with_append_time
from pybk_spark.protocol import offload as decide
from pybk_spark.protocol.log_metadata import SEGMENT_CLOSED, LogMetadata, Segment
from pybk_spark.protocol.offload import OffloadPolicy
from pybk_spark.protocol.offload_record import SegmentOffload

_log = logging.getLogger("pybk_spark.logs.offload")
READ_WINDOW = 1000          # entries per ledger read


@dataclass(frozen=True)
class Staged:
    """A segment written under a temporary name, with what checks it."""
    log: str
    ledger_id: int
    location: str
    directory: str                      # the log's dataset directory, relative
    files: tuple[files.StagedFile, ...]
    digests: tuple[bytes, ...]          # per entry, from the ledger
    rows: int
    entries: int


@dataclass
class OffloadReport:
    log: str
    location: str
    offloaded: list[int] = field(default_factory=list)       # ledger ids committed
    bytes: int = 0
    rows: int = 0
    ledgers_deleted: list[int] = field(default_factory=list)
    orphans_removed: list[str] = field(default_factory=list)
    skipped: list[int] = field(default_factory=list)         # committed by another run
    policy: str = "run"          # whose rules picked the segments: "log" or "run"

    def to_dict(self) -> dict[str, Any]:
        return {"log": self.log, "location": self.location, "offloaded": self.offloaded,
                "bytes": self.bytes, "rows": self.rows,
                "ledgers_deleted": self.ledgers_deleted,
                "orphans_removed": self.orphans_removed, "skipped": self.skipped,
                "policy": self.policy}


def _segment(bk: LedgerClient, name: str, ledger_id: int) -> tuple[LogMetadata, Segment]:
    md = read_log(bk.metadata_store, name)[0]
    s = decide.segment_of(md, ledger_id)
    if s is None:
        raise errors.LogTruncated(f"ledger {ledger_id} is not a segment of log {name!r}",
                                  log=name, ledger_id=ledger_id)
    if s.state != SEGMENT_CLOSED:
        raise errors.IllegalOp(f"ledger {ledger_id} of log {name!r} is still open: only "
                               "closed segments are offloaded", log=name, ledger_id=ledger_id)
    return md, s


def stage_segment(bk: LedgerClient, name: str, ledger_id: int, location: str, *, password: bytes = b"",
                  other_passwords: Sequence[bytes] = (),
                  row_group_bytes: int = files.ROW_GROUP_BYTES,
                  rng: Optional[random.Random] = None) -> Staged:
    """Step 1: the segment's entries, read from its ledger (no fencing), written
    as a Parquet file under a temporary name in the log's dataset directory."""
    md, segment = _segment(bk, name, ledger_id)
    fs, root = files.filesystem(location)
    extra = {"other_passwords": tuple(other_passwords)} if other_passwords else {}
    rh = bk.open_ledger(ledger_id, password=password, recovery=False, **extra)
    try:
        parts = []
        for first in range(0, segment.entry_count, READ_WINDOW):
            last = min(segment.entry_count - 1, first + READ_WINDOW - 1)
            parts.append(with_append_time(_concat(rh.read_batches(first, last)),
                                          rh.metadata.custom))
    finally:
        rh.close()
    raw = pa.Table.from_batches(parts) if parts else files.RAW_SCHEMA.empty_table()
    if raw.num_rows != segment.entry_count:
        raise errors.ReadError(f"ledger {ledger_id}: read {raw.num_rows} entries, the log "
                               f"records {segment.entry_count}", ledger_id=ledger_id)
    table = files.table_of_entries(md, raw)
    digests = files.entry_digests(table)
    directory = posixpath.join(root, files.dataset_dir(md))
    token = f"{(rng or random.Random()).getrandbits(48):012x}"
    staged = files.write_temp(fs, location, directory, ledger_id, table, token, row_group_bytes)
    return Staged(name, ledger_id, location, files.dataset_dir(md), (staged,),
                  tuple(digests), table.num_rows, raw.num_rows)


def verify_staged(staged: Staged) -> None:
    """Step 2: each temporary file read back and checked (``OffloadCorrupt``
    naming the file when it differs)."""
    fs, _ = files.filesystem(staged.location)
    got: list[bytes] = []
    for f in staged.files:
        table = files.read_checked(fs, staged.location, f.temp_path, f.file)
        got += files.entry_digests(table)
    if got != list(staged.digests):
        raise errors.OffloadCorrupt(
            f"offloaded files of ledger {staged.ledger_id} at {staged.location}: their "
            "entries' digests differ from the ledger's", ledger_id=staged.ledger_id)


def publish_staged(bk: LedgerClient, staged: Staged) -> bool:
    """Step 2's end: the files renamed to their final names.  False (and the
    temporary files deleted) when another run committed the segment
    meanwhile: its files stay as its record names them."""
    fs, _ = files.filesystem(staged.location)
    _, segment = _segment(bk, staged.log, staged.ledger_id)
    if segment.offload is not None:
        files.delete_paths(fs, staged.location, [f.temp_path for f in staged.files])
        return False
    for f in staged.files:
        files.publish(fs, staged.location, f)
    return True


def commit_staged(bk: LedgerClient, staged: Staged, wall_clock: Callable[[], float] = time.time
                  ) -> SegmentOffload:
    """Step 3: the segment's record, committed by CAS; the record the log holds
    (another run's when it committed first).  A segment truncated away
    meanwhile: its files are deleted and ``LogTruncated`` raised."""
    record = SegmentOffload(
        staged.location, staged.directory, tuple(f.file for f in staged.files),
        0, staged.entries - 1, staged.rows, files.segment_digest(staged.digests),
        committed_us=int(wall_clock() * 1_000_000))
    try:
        md = update_log(bk.metadata_store, staged.log,
                        lambda m: decide.commit(m, staged.ledger_id, record))
    except errors.LogTruncated:
        fs, _ = files.filesystem(staged.location)
        files.delete_paths(fs, staged.location, [f.final_path for f in staged.files])
        raise
    segment = decide.segment_of(md, staged.ledger_id)
    assert segment is not None and segment.offload is not None
    return segment.offload


def delete_offloaded_ledgers(bk: LedgerClient, name: str, grace_s: float,
                             wall_clock: Callable[[], float] = time.time) -> list[int]:
    """Step 4: delete from the bookies each ledger whose offload was committed
    at least ``grace_s`` ago, then record it deleted (by CAS); the ids."""
    md = read_log(bk.metadata_store, name)[0]
    done = []
    for ledger_id in decide.deletable(md, grace_s, int(wall_clock() * 1_000_000)):
        try:
            bk.delete_ledger(ledger_id)
        except errors.NoSuchLedger:
            pass
        update_log(bk.metadata_store, name,
                   lambda m: decide.mark_ledger_deleted(m, ledger_id))  # noqa: B023
        done.append(ledger_id)
    return done


def clean_orphans(bk: LedgerClient, name: str, location: str, orphan_age_s: float,
                  wall_clock: Callable[[], float] = time.time) -> list[str]:
    """Delete the files of the log's dataset directory at ``location`` that no
    committed record names and that are older than ``orphan_age_s``; their
    paths."""
    md = read_log(bk.metadata_store, name)[0]
    fs, root = files.filesystem(location)
    directory = posixpath.join(root, files.dataset_dir(md))
    named = {f.path for s in md.segments if s.offload is not None
             for f in s.offload.files}
    now_ns = int(wall_clock() * 1e9)
    stale = [info.path for info in files.listing(fs, location, directory)
             if files.ledger_of(info.base_name) is not None and info.base_name not in named
             and (info.mtime_ns is None or now_ns - info.mtime_ns >= orphan_age_s * 1e9)]
    files.delete_paths(fs, location, stale)
    return stale


def offload_segment(bk: LedgerClient, name: str, ledger_id: int, location: str, *,
                    password: bytes = b"", other_passwords: Sequence[bytes] = (),
                    row_group_bytes: int = files.ROW_GROUP_BYTES,
                    wall_clock: Callable[[], float] = time.time,
                    rng: Optional[random.Random] = None) -> Optional[SegmentOffload]:
    """Steps 1-3 for one segment; its record, or None when another run
    committed it first."""
    staged = stage_segment(bk, name, ledger_id, location, password=password,
                           other_passwords=other_passwords, row_group_bytes=row_group_bytes,
                           rng=rng)
    try:
        verify_staged(staged)
    except errors.BKError:
        fs, _ = files.filesystem(location)
        files.delete_paths(fs, location, [f.temp_path for f in staged.files])
        raise
    if not publish_staged(bk, staged):
        return None
    return commit_staged(bk, staged, wall_clock)


def offload_log(bk: LedgerClient, name: str, location: str, policy: Optional[OffloadPolicy] = None, *,
                password: bytes = b"", other_passwords: Sequence[bytes] = (),
                row_group_bytes: int = files.ROW_GROUP_BYTES,
                wall_clock: Callable[[], float] = time.time,
                rng: Optional[random.Random] = None,
                log_policy_first: bool = True) -> OffloadReport:
    """Clean orphans, offload every segment the log's own policy picks (or
    ``policy``'s rules when the log records none, or ``log_policy_first`` is
    False; oldest first; the first failure stops the run, what was committed
    stays), then delete the ledgers whose grace period is over."""
    policy = policy or OffloadPolicy()
    report = OffloadReport(name, location)
    report.orphans_removed = clean_orphans(bk, name, location, policy.orphan_age_s, wall_clock)
    md = read_log(bk.metadata_store, name)[0]
    own = decide.log_policy(md, policy) if log_policy_first else None
    if own is not None:
        report.policy = "log"
    for ledger_id in decide.candidates(md, own or policy, int(wall_clock() * 1_000_000)):
        record = offload_segment(bk, name, ledger_id, location, password=password,
                                 other_passwords=other_passwords,
                                 row_group_bytes=row_group_bytes, wall_clock=wall_clock, rng=rng)
        if record is None:
            report.skipped.append(ledger_id)
            continue
        report.offloaded.append(ledger_id)
        report.bytes += record.size
        report.rows += record.rows
        _log.info("event=segment_offloaded log=%s ledger=%d rows=%d bytes=%d location=%s",
                  name, ledger_id, record.rows, record.size, location)
    report.ledgers_deleted = delete_offloaded_ledgers(bk, name, policy.grace_s, wall_clock)
    return report


def set_offload_policy(bk: LedgerClient, name: str, *, keep_segments: Optional[int] = None,
                       min_age_s: Optional[float] = None, keep_bytes: Optional[int] = None,
                       clear: bool = False) -> Optional[OffloadPolicy]:
    """Record the log's own offload policy by CAS (protocol/offload.py
    ``with_log_policy``: the rules given, the others as recorded); the
    policy the log now records (None after ``clear``)."""
    md = update_log(bk.metadata_store, name,
                    lambda m: decide.with_log_policy(m, keep_segments=keep_segments,
                                                     min_age_s=min_age_s,
                                                     keep_bytes=keep_bytes, clear=clear))
    return decide.log_policy(md, OffloadPolicy())


def offload_status(bk: LedgerClient, name: str) -> dict[str, Any]:
    """What ``pybk offload --status`` shows of one log: the counts, its own
    policy (None: runs apply theirs) and, per offloaded segment, its record."""
    md = read_log(bk.metadata_store, name)[0]
    own = decide.log_policy(md, OffloadPolicy())
    out: dict = {"log": name, **decide.status(md),
                 "policy": None if own is None else decide.policy_dict(own)}
    out["segments_offloaded"] = [
        {"ledger_id": s.ledger_id, "state": s.offload.state, "rows": s.offload.rows,
         "bytes": s.offload.size, "files": [f.path for f in s.offload.files],
         "location": s.offload.location, "directory": s.offload.directory}
        for s in md.segments if s.offload is not None]
    return out
