"""Log metadata: the ordered ledger list of a named log ("Ledgers to logs").

Theory of operation
-------------------
A log is an ordered list of segments, one ledger each, stored as one JSON
value in etcd and changed only by compare-and-swap.  Every change below is a
pure transform ``old -> new`` that the adapter re-runs on a fresh read after a
CAS conflict, so each decides from the value it is given.

Ordering obligations (docs/protocol.md):
  * open as leader: read list -> fence+recover the LAST TWO ledgers -> create a
    ledger -> append it -> CAS.  ``open_as_leader`` is the step-4 transform; it
    refuses (``LeaderConflict``) if the tail it fenced is no longer the tail,
    which sends the caller back to step 1.
  * roll: create ledger -> ``roll`` (CAS-add) -> close previous.  The previous
    segment stays ``open`` in the list until a later CAS records its count.
  * truncate: CAS the list first (``truncate_before``), then delete ledgers.
  * Spark commits: all task ledgers of one write are appended in ONE CAS, with
    the (query, batch) id recorded in that same CAS for exactly-once sinks.

Positions are (ledger_id, entry_id); they order by the ledger's index in the
list, then by entry id.  ``start_offset`` of a segment is the number of
entries in the log before it when that is known (all earlier segments
closed); it lets readers seek without opening every ledger.
``uid`` names this log among every log that ever had its name: drawn when
the log is created, never changed, absent in logs created by older
versions; positions record it (protocol/log_identity.py).
``first_time_us`` / ``last_time_us`` of a segment are the append times of its
first and last entry when known (-1 otherwise; older metadata has neither),
recorded with its size; a time-based start skips segments by them
(protocol/append_time.py).

One password per log: ``password_check`` is the check of the password its
ledgers are written with, the value a ledger's metadata records
(``ledger_metadata.key_check``; never the password or the key itself).
The first writer sets it in the CAS that creates the log or in the first
change it makes (``claim_password``); a writer with another password is
refused before it creates a ledger, and every writer's CAS re-checks it.
A log that has none (written before it was recorded) takes the first
writer's whose password opens the log's newest ledger: the caller checks
that against the ledger's metadata before it claims.

Chunks: a log's list is one value only while it is short.  etcd refuses a
request over ``--max-request-bytes`` (1.5 MiB by default), about 8,000
segments at ~190 bytes each, which a streaming sink reaches in hours.  So
the log's key (the *head*) holds the log's fields and the newest segments
(the *tail*), and names, in order, the *chunks* before them: immutable
values of ``CHUNK_SEGMENTS`` closed segments each (``ChunkRef``).  The list
is the chunks' segments then the tail's.  Every transform above still maps
the whole list to the whole list; ``plan_chunks`` then lays the new list
out: the old chunks that are still its prefix, unchanged, are kept; chunks
truncated away are dropped, and what a truncation leaves of the first one
is sealed anew, and so is a chunk whose segments changed in place (an
offload record added, protocol/offload.py); a chunk that changed otherwise
(an overwrite) is dropped with every later one, and their segments go back
to the tail; a tail longer than ``SEAL_AFTER`` seals its oldest ``CHUNK_SEGMENTS`` segments into a new
chunk while they are all closed, at most ``MAX_SEALS_PER_CHANGE`` a change.
The adapter writes new chunks and the head in one transaction on the head's
version, so a reader never sees a head naming a chunk that is not there,
and deletes the chunks it stops naming in that transaction or right after
(``logs/log.py``).  A head without chunks is byte for byte the one-value
layout, so short logs are stored as before.

This module imports no I/O, no clock and no threads.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field, replace
from typing import Any, Iterable, Mapping, Optional, Sequence, Union

from pybk_spark import errors
from pybk_spark.protocol.offload_record import SegmentOffload

SEGMENT_OPEN = "open"
SEGMENT_CLOSED = "closed"


class LeaderConflict(errors.MetadataVersion):
    """Another writer changed the log's tail since we fenced it: restart at step 1."""


@dataclass(frozen=True, order=True)
class Position:
    ledger_index: int      # index of the segment in the log's list (for ordering)
    ledger_id: int
    entry_id: int

    def as_tuple(self) -> tuple[int, int]:
        return (self.ledger_id, self.entry_id)


@dataclass(frozen=True)
class Segment:
    ledger_id: int
    state: str = SEGMENT_OPEN
    entry_count: int = -1          # known once closed
    byte_count: int = -1
    start_offset: int = -1         # log offset of this segment's first entry, if known
    rows: int = -1                 # rows in the segment (Arrow-table logs), if known
    first_time_us: int = -1        # append time of its first / last entry (protocol/append_time.py)
    last_time_us: int = -1
    offload: Optional[SegmentOffload] = None   # its Parquet copy (protocol/offload.py)

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {"ledger_id": self.ledger_id, "state": self.state,
                            "entry_count": self.entry_count, "byte_count": self.byte_count,
                            "start_offset": self.start_offset, "rows": self.rows}
        if self.first_time_us >= 0 or self.last_time_us >= 0:
            d.update(first_time_us=self.first_time_us, last_time_us=self.last_time_us)
        if self.offload is not None:
            d["offload"] = self.offload.to_dict()
        return d

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "Segment":
        return cls(int(d["ledger_id"]), d.get("state", SEGMENT_OPEN),
                   int(d.get("entry_count", -1)), int(d.get("byte_count", -1)),
                   int(d.get("start_offset", -1)), int(d.get("rows", -1)),
                   int(d.get("first_time_us", -1)), int(d.get("last_time_us", -1)),
                   None if d.get("offload") is None else SegmentOffload.from_dict(d["offload"]))


@dataclass(frozen=True)
class LogMetadata:
    name: str
    segments: tuple[Segment, ...] = ()
    schema: Optional[str] = None                 # base64 Arrow IPC schema, Arrow-table logs
    truncated_offset: int = 0                    # entries before this log offset are gone
    truncated_ledgers: int = 0                   # how many segments truncation removed
    epoch: int = 0                               # bumped by every leader open
    sink_commits: Mapping[str, int] = field(default_factory=dict)   # query id -> last batch id
    properties: Mapping[str, str] = field(default_factory=dict)
    password_check: str = ""                     # key_check of the log's password; "" = none yet
    uid: Optional[str] = None                    # identity of this incarnation of the name
                                                 # (protocol/log_identity.py); None: older log

    @property
    def ledger_ids(self) -> list[int]:
        return [s.ledger_id for s in self.segments]

    def segment_index(self, ledger_id: int) -> int:
        for i, s in enumerate(self.segments):
            if s.ledger_id == ledger_id:
                return i
        raise errors.LogTruncated("ledger not in log (truncated or never part of it)",
                                  log=self.name, ledger_id=ledger_id)

    def position(self, ledger_id: int, entry_id: int) -> Position:
        return Position(self.truncated_ledgers + self.segment_index(ledger_id), ledger_id, entry_id)

    def to_json(self) -> bytes:
        d: dict[str, Any] = {
            "name": self.name, "segments": [s.to_dict() for s in self.segments],
            "schema": self.schema, "truncated_offset": self.truncated_offset,
            "truncated_ledgers": self.truncated_ledgers, "epoch": self.epoch,
            "sink_commits": dict(self.sink_commits), "properties": dict(self.properties),
        }
        if self.password_check:            # optional: a log without one reads as before
            d["password_check"] = self.password_check
        if self.uid is not None:          # absent for a log without one: stored as before
            d["uid"] = self.uid
        return json.dumps(d, sort_keys=True).encode()

    @classmethod
    def from_json(cls, data: bytes) -> "LogMetadata":
        try:
            return cls.from_dict(json.loads(data))
        except ValueError as exc:
            raise errors.MetadataError(f"corrupt log metadata: {exc}") from None

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "LogMetadata":
        try:
            return cls(
                name=d["name"], segments=tuple(Segment.from_dict(s) for s in d["segments"]),
                schema=d.get("schema"), truncated_offset=int(d.get("truncated_offset", 0)),
                truncated_ledgers=int(d.get("truncated_ledgers", 0)),
                epoch=int(d.get("epoch", 0)),
                sink_commits={k: int(v) for k, v in d.get("sink_commits", {}).items()},
                properties=dict(d.get("properties", {})),
                password_check=str(d.get("password_check") or ""),
                uid=None if d.get("uid") is None else str(d["uid"]))
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            raise errors.MetadataError(f"corrupt log metadata: {exc}") from None


def _with_offsets(segments: Iterable[Segment], first_offset: int) -> tuple[Segment, ...]:
    """Fill start_offset for every segment whose predecessors are all closed."""
    out, offset = [], first_offset
    for s in segments:
        out.append(replace(s, start_offset=offset) if offset >= 0 else replace(s, start_offset=-1))
        offset = offset + s.entry_count if (offset >= 0 and s.state == SEGMENT_CLOSED) else -1
    return tuple(out)


def new_log(name: str, uid: Optional[str] = None, password_check: str = "") -> LogMetadata:
    """An empty log; ``uid`` identifies it among the logs that ever had this
    name (protocol/log_identity.py, ``new_uid``), ``password_check`` is its
    creating writer's password check."""
    if not name or "/" in name or len(name) > 200:
        raise errors.IncorrectParameter(f"bad log name {name!r}: non-empty, no '/', <= 200 chars")
    return LogMetadata(name=name, uid=uid, password_check=password_check)


def check_writer_password(md: LogMetadata, password_check: str) -> None:
    """``Unauthorized`` naming the log when it records another password."""
    if md.password_check and md.password_check != password_check:
        raise errors.Unauthorized(
            f"wrong password for log {md.name!r}: a log has one password, the one its first "
            "writer used; write with that password, or to another log", log=md.name)


def claim_password(md: LogMetadata, password_check: str) -> LogMetadata:
    """The log with its password recorded: unchanged when it records this
    one, ``Unauthorized`` when it records another."""
    check_writer_password(md, password_check)
    return md if md.password_check else replace(md, password_check=password_check)


def tail_ids(md: LogMetadata, n: int = 2) -> tuple[int, ...]:
    """The ledgers a new leader must fence and recover (the last two)."""
    return tuple(md.ledger_ids[-n:])


def record_closed(md: LogMetadata, closed: Mapping[int, tuple[int, int]],
                  times: Mapping[int, tuple[int, int]] = {}) -> LogMetadata:
    """Record (last_entry_id, byte_count) of closed ledgers still marked open,
    and ``times``: their (first, last) append time in µs, when known."""
    segs = []
    for s in md.segments:
        if s.ledger_id in closed and s.state == SEGMENT_OPEN:
            last, nbytes = closed[s.ledger_id]
            first_us, last_us = times.get(s.ledger_id, (-1, -1))
            s = replace(s, state=SEGMENT_CLOSED, entry_count=last + 1, byte_count=nbytes,
                        first_time_us=first_us, last_time_us=last_us)
        segs.append(s)
    return replace(md, segments=_with_offsets(segs, md.truncated_offset))


def open_as_leader(md: LogMetadata, fenced_tail: tuple[int, ...],
                   closed: Mapping[int, tuple[int, int]], new_ledger_id: int) -> LogMetadata:
    """Seed step 4: append the new ledger, provided the tail we fenced is still
    the tail.  Also records the recovered ledgers' final sizes."""
    if tail_ids(md, len(fenced_tail) or 2) != tuple(fenced_tail):
        raise LeaderConflict("log tail changed since it was fenced", log=md.name)
    md = record_closed(md, closed)
    segs = md.segments + (Segment(new_ledger_id),)
    return replace(md, segments=_with_offsets(segs, md.truncated_offset), epoch=md.epoch + 1)


def roll(md: LogMetadata, current_ledger_id: int, new_ledger_id: int) -> LogMetadata:
    """Seed roll step 2-3: append the new ledger; only the current tail's owner may."""
    if not md.segments or md.segments[-1].ledger_id != current_ledger_id:
        raise errors.LedgerFenced("log tail is no longer ours: another leader took over",
                                  log=md.name, ledger_id=current_ledger_id)
    return replace(md, segments=_with_offsets(md.segments + (Segment(new_ledger_id),),
                                              md.truncated_offset))


def truncate_before(md: LogMetadata, ledger_id: int) -> tuple[LogMetadata, list[int]]:
    """Drop every whole segment before ``ledger_id``; returns (new, dropped ids).
    Only closed segments can be dropped."""
    idx = md.segment_index(ledger_id)
    dropped = md.segments[:idx]
    if any(s.state != SEGMENT_CLOSED for s in dropped):
        raise errors.IllegalOp("cannot truncate an open segment", log=md.name)
    offset = md.truncated_offset + sum(s.entry_count for s in dropped)
    new = replace(md, segments=_with_offsets(md.segments[idx:], offset),
                  truncated_offset=offset, truncated_ledgers=md.truncated_ledgers + len(dropped))
    return new, [s.ledger_id for s in dropped]


def append_closed(md: LogMetadata, ledgers: Iterable[tuple[int, int, int, int]], *,
                  schema: Optional[str] = None, sink: Optional[tuple[str, int]] = None,
                  overwrite: bool = False,
                  base_schema: Optional[str] = None,
                  times: Mapping[int, tuple[int, int]] = {}) -> tuple[LogMetadata, list[int]]:
    """Atomic batch commit (Spark writer/sink): append closed ledgers given as
    (ledger_id, entry_count, byte_count, rows) in one step; ``times`` gives
    a ledger's (first, last) append time in µs (protocol/append_time.py).

    ``sink=(query_id, batch_id)``: if that batch (or a later one) is already
    recorded, the commit is a no-op (exactly-once replay); returns ([], ...).
    ``overwrite``: replace the whole list; returns the ids that were replaced,
    for the caller to delete AFTER the CAS.
    ``schema``: recorded if the log has none; must match if it has one,
    unless ``base_schema`` (schema evolution, ``mergeSchema``) is given: the
    writer checked that ``schema`` extends ``base_schema``, so a log still
    recording ``base_schema`` now records ``schema``; one that records a
    third schema (changed concurrently) refuses.
    """
    if sink is not None:
        query_id, batch_id = sink
        if md.sink_commits.get(query_id, -1) >= batch_id:
            return md, []
    if schema is not None and md.schema is not None and md.schema != schema and not overwrite:
        if base_schema is None or md.schema != base_schema:
            raise errors.SchemaMismatch("DataFrame schema differs from the log's schema "
                                        "(changed since the write was planned?)", log=md.name)
        md = replace(md, schema=schema)
    new_segs = tuple(Segment(lid, SEGMENT_CLOSED, count, nbytes, rows=rows,
                             first_time_us=times.get(lid, (-1, -1))[0],
                             last_time_us=times.get(lid, (-1, -1))[1])
                     for lid, count, nbytes, rows in ledgers)
    replaced: list[int] = []
    if overwrite:
        replaced = md.ledger_ids
        segs, offset = new_segs, md.truncated_offset + sum(
            max(s.entry_count, 0) for s in md.segments)
        truncated = md.truncated_ledgers + len(md.segments)
        md = replace(md, truncated_offset=offset, truncated_ledgers=truncated,
                     schema=schema if schema is not None else md.schema)
    else:
        # Always at the end: if a leader's ledger is still open, batch ledgers
        # follow it and readers reach them once that ledger is closed.
        segs = md.segments + new_segs
    if md.schema is None and schema is not None:
        md = replace(md, schema=schema)
    commits = dict(md.sink_commits)
    if sink is not None:
        commits[sink[0]] = sink[1]
    return replace(md, segments=_with_offsets(segs, md.truncated_offset),
                   sink_commits=commits), replaced


# -- chunks: a long log's list over several values -------------------------------------
CHUNK_SEGMENTS = 1000          # segments in a sealed chunk (~190 KB)
SEAL_AFTER = 2000              # a tail longer than this seals its oldest segments
MAX_SEALS_PER_CHANGE = 2       # so one change's request stays the size of the value it
                               # replaces (a one-value log of 8,000 segments shrinks over
                               # its next changes, not in one request etcd would refuse)


@dataclass(frozen=True)
class ChunkRef:
    key: str                   # metadata key holding the chunk's segments
    count: int
    first_ledger: int
    last_ledger: int

    def to_dict(self) -> dict[str, Any]:
        return {"key": self.key, "count": self.count, "first_ledger": self.first_ledger,
                "last_ledger": self.last_ledger}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "ChunkRef":
        return cls(str(d["key"]), int(d["count"]), int(d["first_ledger"]), int(d["last_ledger"]))


@dataclass(frozen=True)
class ChunkPlan:
    chunks: tuple[Union[ChunkRef, tuple[Segment, ...]], ...]   # in order: kept (a ref) or new
    dropped: tuple[ChunkRef, ...]                 # old chunks no longer named
    tail: tuple[Segment, ...]                     # the segments the head holds

    @property
    def changed(self) -> bool:
        return bool(self.dropped) or any(not isinstance(c, ChunkRef) for c in self.chunks)


def plan_chunks(segments: Sequence[Segment],
                old: Sequence[tuple[ChunkRef, Sequence[Segment]]]) -> ChunkPlan:
    """Lay ``segments`` (a whole new list) out over the ``old`` chunks (each
    with its segments) and new ones; see the module docstring.  A truncation
    inside the first remaining chunk re-seals what is left of it as a new
    chunk and keeps every later one."""
    segments = tuple(segments)
    present = {s.ledger_id for s in segments}
    out: list[Union[ChunkRef, tuple[Segment, ...]]] = []
    dropped: list[ChunkRef] = []
    i, changed = 0, False
    for ref, segs in old:
        segs = tuple(segs)
        if not changed and segments[i:i + len(segs)] == segs:
            out.append(ref)
            i += len(segs)
            continue
        dropped.append(ref)
        mine = segments[i:i + len(segs)]
        if not changed and [s.ledger_id for s in mine] == [s.ledger_id for s in segs]:
            out.append(mine)                      # changed in place (an offload): sealed anew
            i += len(segs)
            continue
        if changed or out:
            changed = True                        # this one and every later one: re-laid
            continue
        cut = sum(1 for s in segs if s.ledger_id not in present)
        if cut == len(segs):
            continue                              # truncated away whole
        if segs[:cut] == tuple(s for s in segs if s.ledger_id not in present) \
                and segments[:len(segs) - cut] == segs[cut:]:
            out.append(segs[cut:])                # truncated inside: the rest, sealed anew
            i = len(segs) - cut
        else:
            changed = True
    tail = segments[i:]
    for _ in range(MAX_SEALS_PER_CHANGE):
        if len(tail) <= SEAL_AFTER or any(s.state != SEGMENT_CLOSED
                                          for s in tail[:CHUNK_SEGMENTS]):
            break
        out.append(tail[:CHUNK_SEGMENTS])
        tail = tail[CHUNK_SEGMENTS:]
    return ChunkPlan(tuple(out), tuple(dropped), tail)


def head_to_json(md: LogMetadata, tail: Sequence[Segment], chunks: Sequence[ChunkRef]) -> bytes:
    """The head value: ``md``'s fields, ``tail`` and the chunks it names;
    without chunks exactly ``md.to_json()`` of the tail.  With chunks the
    tail is under ``"tail"``, not ``"segments"``: code that predates chunks
    then finds the log corrupt instead of reading its newest segments as
    the whole log."""
    head = replace(md, segments=tuple(tail))
    if not chunks:
        return head.to_json()
    d = json.loads(head.to_json())
    d["tail"] = d.pop("segments")
    d["chunks"] = [c.to_dict() for c in chunks]
    return json.dumps(d, sort_keys=True).encode()


def head_from_json(data: bytes) -> tuple[LogMetadata, tuple[ChunkRef, ...]]:
    """(the head's metadata, with only the tail as segments; the chunks it names)."""
    try:
        d = json.loads(data)
        if "chunks" not in d:
            return LogMetadata.from_dict(d), ()
        refs = tuple(ChunkRef.from_dict(c) for c in d["chunks"])
        d["segments"] = d.pop("tail")
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise errors.MetadataError(f"corrupt log metadata: {exc}") from None
    return LogMetadata.from_dict(d), refs


def chunk_to_json(segments: Sequence[Segment]) -> bytes:
    return json.dumps({"segments": [s.to_dict() for s in segments]}, sort_keys=True).encode()


def chunk_from_json(data: bytes) -> tuple[Segment, ...]:
    try:
        return tuple(Segment.from_dict(s) for s in json.loads(data)["segments"])
    except (ValueError, KeyError, TypeError) as exc:
        raise errors.MetadataError(f"corrupt log metadata chunk: {exc}") from None
