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

Pure: no I/O, no clock (``updated_at`` is given by the caller).
"""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from typing import Iterable, Optional

from pybk_spark import errors


@dataclass(frozen=True)
class RegisteredPosition:
    log: str
    name: str
    index: int          # absolute segment index of the next entry to read
    entry: int
    kind: str = "stream"
    updated_at: float = 0.0     # wall-clock seconds of the last commit (for operators)

    def to_json(self) -> bytes:
        return json.dumps(asdict(self), sort_keys=True).encode()

    @classmethod
    def from_json(cls, data: bytes) -> "RegisteredPosition":
        try:
            d = json.loads(data)
            return cls(str(d["log"]), str(d["name"]), int(d["index"]), int(d["entry"]),
                       str(d.get("kind", "stream")), float(d.get("updated_at", 0.0)))
        except (ValueError, KeyError, TypeError) as exc:
            raise errors.MetadataError(f"corrupt registered position: {exc}") from None


def check_name(name: str) -> str:
    if not name or "/" in name or len(name) > 200:
        raise errors.IncorrectParameter(
            f"bad position name {name!r}: non-empty, no '/', <= 200 chars")
    return name


def advance(old: Optional[RegisteredPosition], new: RegisteredPosition) -> RegisteredPosition:
    """The value to store: ``new``, unless ``old`` is already further."""
    if old is not None and (old.index, old.entry) > (new.index, new.entry):
        return old
    return new


def blockers(first_kept_index: int,
             positions: Iterable[RegisteredPosition]) -> list[RegisteredPosition]:
    """Positions that truncating every segment before ``first_kept_index`` would break."""
    return sorted((p for p in positions if p.index < first_kept_index),
                  key=lambda p: (p.index, p.entry, p.name))
