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

Pure: no I/O, no clock.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Sequence

from pybk_spark import errors


@dataclass(frozen=True, order=True)
class Offset:
    index: int
    entry: int

    def to_dict(self) -> dict:
        return {"index": self.index, "entry": self.entry}

    @classmethod
    def from_dict(cls, d) -> "Offset":
        try:
            index, entry = int(d["index"]), int(d["entry"])
        except (KeyError, TypeError, ValueError):
            raise errors.IncorrectParameter(f"not a bookkeeper stream offset: {d!r}") from None
        if index < 0 or entry < 0:
            raise errors.IncorrectParameter(f"not a bookkeeper stream offset: {d!r}")
        return cls(index, entry)


@dataclass(frozen=True)
class Extent:
    index: int          # absolute segment index
    ledger_id: int
    end: int            # readable entries: last + 1 (closed) or LAC + 1 (open)
    closed: bool


def advance(start: Offset, extents: Sequence[Extent], max_entries: Optional[int] = None) -> Offset:
    """The furthest offset reachable from ``start`` within the budget."""
    pos, budget = start, max_entries
    for ext in extents:
        if ext.index < pos.index:
            continue
        if ext.index > pos.index:
            break                                  # a segment is missing: stop at the gap
        take = max(0, ext.end - pos.entry)
        if budget is not None:
            take = min(take, budget)
            budget -= take
        pos = Offset(pos.index, pos.entry + take)
        if ext.closed and pos.entry >= ext.end:
            pos = Offset(pos.index + 1, 0)
            if budget == 0:
                break
            continue
        break
    return pos


def ranges(start: Offset, end: Offset, extents: Sequence[Extent]) -> list[tuple[int, int, int]]:
    """-> [(ledger_id, first, last)] (inclusive, non-empty) covering [start, end)."""
    out = []
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
