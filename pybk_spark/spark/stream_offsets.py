"""Streaming offsets over a log: positions, admission control, ranges.

Theory of operation
-------------------
An offset is the log position of the NEXT entry to read:
``{"index": absolute segment index, "entry": entry id}`` (absolute: truncated
segments count, so an offset stays valid across truncation of earlier
segments).  Offsets are normalised: once a CLOSED segment is read to its end
the offset moves to ``(index + 1, 0)``, even before that segment exists.

The driver describes the segments from the start offset on as
:class:`Extent`s: ``end`` = entries readable (last entry + 1 when the ledger
is CLOSED, LAC + 1 while it is OPEN).  Obligations of :func:`advance`:
  * it never passes an OPEN segment (entries beyond its LAC are not readable
    and later segments may only be read after it is closed - log order);
  * it moves at most ``max_entries`` entries (admission control), at least 0;
  * the result is >= start, so micro-batches are disjoint and gap-free.
:func:`ranges` turns (start, end) into per-ledger inclusive entry ranges.

Byte limits (``maxBytesPerTrigger``, a soft limit as for Spark's file
sources): an extent knows its bytes when its segment is closed (recorded in
the log or in the ledger's metadata); its entries are costed at the
segment's average size.  The open tail's size is unknown until it is closed,
so it is costed at ``default_entry_bytes`` (the caller's average over the
log's closed segments) or, when that is unknown too, admitted one entry per
trigger.  A trigger admits at least one entry when one is available, so a
single large entry cannot stall the stream.  :func:`lag` measures what lies
between an offset and the end (entries; bytes when every part is known).

:func:`delay_batch` is ``minEntriesPerTrigger`` / ``maxTriggerDelay``: wait
(return the start offset) while fewer entries are available than asked and
the last batch (or the query's start) is more recent than the delay.

An offset also names the log it was taken in: ``"uid"``, the log's uid
(protocol/log_identity.py), next to ``index`` and ``entry`` (:func:`uid_of`,
:func:`with_uid`).  A position means something only in its own log: a log
deleted and created again under the same name starts at index 0 again.
An offset without one (a checkpoint written before logs had a uid, or a
log that has none) is taken as it is.

Pure: no I/O, no clock.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional, Sequence

from pybk_spark import errors


@dataclass(frozen=True, order=True)
class Offset:
    index: int
    entry: int

    def to_dict(self) -> dict:
        return {"index": self.index, "entry": self.entry}

    @classmethod
    def from_dict(cls, d: Any) -> "Offset":
        try:
            index, entry = int(d["index"]), int(d["entry"])
        except (KeyError, TypeError, ValueError):
            raise errors.IncorrectParameter(f"not a bookkeeper stream offset: {d!r}") from None
        if index < 0 or entry < 0:
            raise errors.IncorrectParameter(f"not a bookkeeper stream offset: {d!r}")
        return cls(index, entry)


UID_KEY = "uid"


def uid_of(d: Any) -> Optional[str]:
    """The uid of the log an offset dict was taken in (None: not recorded)."""
    uid = d.get(UID_KEY) if isinstance(d, dict) else None
    return None if uid is None else str(uid)


def with_uid(d: dict, uid: Optional[str]) -> dict:
    """``d`` naming the log with uid ``uid`` (unchanged when it has none)."""
    return dict(d, **{UID_KEY: uid}) if uid is not None else d


@dataclass(frozen=True)
class Extent:
    index: int          # absolute segment index
    ledger_id: int
    end: int            # readable entries: last + 1 (closed) or LAC + 1 (open)
    closed: bool
    nbytes: int = -1    # payload bytes of entries [0, end), when known (closed segments)

    def entry_bytes(self) -> Optional[float]:
        if self.nbytes < 0 or self.end <= 0:
            return None
        return self.nbytes / self.end


def advance(start: Offset, extents: Sequence[Extent], max_entries: Optional[int] = None,
            max_bytes: Optional[int] = None,
            default_entry_bytes: Optional[float] = None) -> Offset:
    """The furthest offset reachable from ``start`` within the budgets."""
    bytes_left: Optional[float] = max_bytes           # costs may be averages
    pos, entries_left, taken = start, max_entries, 0
    for ext in extents:
        if ext.index < pos.index:
            continue
        if ext.index > pos.index:
            break                                  # a segment is missing: stop at the gap
        take = max(0, ext.end - pos.entry)
        if entries_left is not None:
            take = min(take, entries_left)
        if bytes_left is not None and take:
            size = ext.entry_bytes()
            size = default_entry_bytes if size is None else size
            if size is None:                       # unknown: one entry, and only as the first
                afford = 0 if taken else 1
                cost: float = bytes_left
            elif size <= 0:
                afford, cost = take, 0.0
            else:
                afford = int(bytes_left // size) or (0 if taken else 1)
                cost = size
            take = min(take, afford)
            bytes_left = max(0, bytes_left - (cost if size is None else take * cost))
        if entries_left is not None:
            entries_left -= take
        taken += take
        pos = Offset(pos.index, pos.entry + take)
        if ext.closed and pos.entry >= ext.end:
            pos = Offset(pos.index + 1, 0)
            if entries_left == 0 or (bytes_left is not None and bytes_left <= 0):
                break
            continue
        break
    return pos


def count(start: Offset, end: Offset, extents: Sequence[Extent]) -> int:
    """Entries in [start, end)."""
    return sum(last - first + 1 for _, first, last in ranges(start, end, extents))


def lag(start: Offset, extents: Sequence[Extent],
        default_entry_bytes: Optional[float] = None) -> tuple[int, int]:
    """(entries, bytes) between ``start`` and the end of what is readable;
    bytes is -1 when some of it has no known size."""
    end = advance(start, extents)
    entries, nbytes = 0, 0.0
    for ext in extents:
        if ext.index < start.index or ext.index > end.index:
            continue
        first = start.entry if ext.index == start.index else 0
        stop = end.entry if ext.index == end.index else ext.end
        n = max(0, stop - first)
        if not n:
            continue
        entries += n
        size = ext.entry_bytes()
        size = default_entry_bytes if size is None else size
        nbytes = -1 if (size is None or nbytes < 0) else nbytes + n * size
    return entries, int(round(nbytes)) if nbytes >= 0 else -1


def delay_batch(available: int, min_entries: Optional[int], since_last_s: float,
                max_delay_s: float) -> bool:
    """True: hold the batch back (fewer than ``min_entries`` available and the
    last batch is more recent than ``max_delay_s``)."""
    return min_entries is not None and 0 < min_entries and available < min_entries \
        and since_last_s < max_delay_s


def ranges(start: Offset, end: Offset, extents: Sequence[Extent]) -> list[tuple[int, int, int]]:
    """-> [(ledger_id, first, last)] (inclusive, non-empty) covering [start, end)."""
    out: list = []
    if end <= start:
        return out
    by_index = {e.index: e for e in extents}
    for index in range(start.index, end.index + 1):
        first = start.entry if index == start.index else 0
        if index == end.index:
            last = end.entry - 1
            if index not in by_index:
                if last >= first:
                    raise errors.IllegalOp("stream offset beyond the log's segments",
                                           index=index)
                continue
        else:
            ext = by_index.get(index)
            if ext is None:
                raise errors.IllegalOp("stream offset range covers an unknown segment", index=index)
            last = ext.end - 1
        if last >= first:
            out.append((by_index[index].ledger_id, first, last))
    return out
