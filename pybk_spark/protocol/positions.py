"""Registered read positions of a log (a Pulsar subscription's cursor) and the
retention rule they impose on truncation.

Theory of operation
-------------------
A consumer that must not lose its place (a streaming query reading a log)
records, each time Spark commits a batch, the log position of the next entry
it will read: ``(index, entry)`` with the absolute segment index of
stream_offsets.py.  One value per (log, consumer) under
``positions/<log>/<name>`` in etcd, changed only by CAS (positions.py is the
adapter).  :func:`advance` is the CAS transform: a position only moves
forward, so a late, replayed commit cannot move a cursor back.

Retention: truncation before the segment with absolute index ``first`` drops
segments ``< first``.  A registered position at index ``i`` still needs
segment ``i`` and everything after it, so it blocks a truncation iff
``i < first`` (:func:`blockers`).  The check reads the positions before the
log's CAS; a position registered concurrently with a truncation can still
lose (etcd keys are CASed one at a time), and that stream then meets
``LogTruncated`` / failOnDataLoss, never silent loss.

An exactly-once sink (kind ``sink``) registers a position too, under the
name ``sink-<hash of its sink id>``: the log position just after the
ledgers of its last committed micro-batch, with that ``batch_id`` and the
sink id (its checkpoint location) as ``detail``.  It tells an operator how
far each query's output has got (``pybk positions``) and is dropped like
any other, but it never holds back truncation: a writer needs none of what
it wrote (a Pulsar producer has no cursor either).  :func:`blockers`
counts readers (kind ``stream``) only.

A position records the uid of the log it was taken in (``uid``,
protocol/log_identity.py).  When the log is deleted and a log of the same
name is created, the positions of the old one stay under its name: they
hold nothing back in the new log (:func:`blockers` skips a position of
another uid), and a position of the new log replaces one of the old log
however far that one had got (:func:`advance`).  A position without a uid
(recorded by an older version) counts as before.

Pure: no I/O, no clock (``updated_at`` is given by the caller).
"""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from typing import Iterable, Optional, Sequence

from pybk_spark import errors
from pybk_spark.protocol.log_identity import recreated


STREAM, SINK = "stream", "sink"


@dataclass(frozen=True)
class RegisteredPosition:
    log: str
    name: str
    index: int          # absolute segment index of the next entry to read
    entry: int
    kind: str = "stream"        # STREAM (a reader: holds back truncation) | SINK
    updated_at: float = 0.0     # wall-clock seconds of the last commit (for operators)
    batch_id: Optional[int] = None   # a sink's last committed micro-batch
    detail: str = ""                 # a sink's id (its checkpoint location)
    uid: Optional[str] = None        # uid of the log it was taken in (None: not recorded)

    def to_json(self) -> bytes:
        return json.dumps(asdict(self), sort_keys=True).encode()

    @classmethod
    def from_json(cls, data: bytes) -> "RegisteredPosition":
        try:
            d = json.loads(data)
            batch = d.get("batch_id")
            return cls(str(d["log"]), str(d["name"]), int(d["index"]), int(d["entry"]),
                       str(d.get("kind", STREAM)), float(d.get("updated_at", 0.0)),
                       None if batch is None else int(batch), str(d.get("detail", "")),
                       None if d.get("uid") is None else str(d["uid"]))
        except (ValueError, KeyError, TypeError) as exc:
            raise errors.MetadataError(f"corrupt registered position: {exc}") from None


def check_name(name: str) -> str:
    if not name or "/" in name or len(name) > 200:
        raise errors.IncorrectParameter(
            f"bad position name {name!r}: non-empty, no '/', <= 200 chars")
    return name


def advance(old: Optional[RegisteredPosition], new: RegisteredPosition) -> RegisteredPosition:
    """The value to store: ``new``, unless ``old`` is already further in
    the same log."""
    if old is not None and recreated(old.uid, new.uid):
        return new
    if old is not None and (old.index, old.entry) > (new.index, new.entry):
        return old
    if (old is not None and old.batch_id is not None and new.batch_id is not None
            and old.batch_id > new.batch_id):
        return old
    return new


def blockers(first_kept_index: int, positions: Iterable[RegisteredPosition],
             uid: Optional[str] = None) -> list[RegisteredPosition]:
    """Positions that truncating every segment before ``first_kept_index`` of
    the log with uid ``uid`` would break (positions taken in another log of
    that name break nothing)."""
    return sorted((p for p in positions if p.kind != SINK and p.index < first_kept_index
                   and not recreated(p.uid, uid)),
                  key=lambda p: (p.index, p.entry, p.name))


def after_written(log_ledgers: Sequence[int], truncated: int,
                  written: Iterable[int]) -> Optional[tuple[int, int]]:
    """A sink's position after a commit: (absolute index, entry) just past
    the last ledger it ``written``, or None when it wrote nothing or its
    ledgers are not in the log (a replayed batch, a no-op)."""
    written = set(written)
    if not written or not written <= set(log_ledgers):
        return None
    last = max(i for i, lid in enumerate(log_ledgers) if lid in written)
    return truncated + last + 1, 0
