"""Partition planning for batch reads: ledgers x offsets -> fragment slices.

Theory of operation
-------------------
The driver describes each ledger it will read by a :class:`LedgerView`: its
fragments (first, last, bookies) from the metadata and the last entry that may
be read (``readable_last``): the ledger's last entry when CLOSED, its LAC when
still OPEN (everything up to the LAC is on Qa bookies, so every reader sees the
same prefix; nothing past it is ever planned).

:func:`plan_slices` intersects every fragment with the requested range
``[start, end)`` and the readable prefix, then cuts what is left into slices
of at most ``max_entries`` entries.  Obligations:
  * slices of one ledger are disjoint, ascending, and their union is exactly
    the requested readable range (no gap, no duplicate);
  * a slice never crosses a fragment boundary, so it is served by one
    ensemble (one partition = one fragment or a piece of a large one);
  * slices come out in (ledger order as requested, entry id) order.

:func:`split_to_min` (option ``minPartitions``, as in Spark's Kafka source)
cuts slices further when there are fewer than asked for: each slice gets a
share of the partitions proportional to its entries (at least one, at most
one per entry), then is cut into that many near-equal consecutive pieces.
Union, order and fragment boundaries are kept, so the obligations above
still hold; the result may exceed the minimum slightly (rounding), and stays
below it only when there are fewer entries than partitions asked for.

Pure: no I/O, no clock.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Optional, Sequence

from pybk_spark.spark.options import EARLIEST, LATEST


@dataclass(frozen=True)
class LedgerView:
    ledger_id: int
    fragments: tuple[tuple[int, int, tuple[str, ...]], ...]   # last = -1: open-ended
    readable_last: int                                         # -1: nothing readable


@dataclass(frozen=True)
class Slice:
    ledger_id: int
    first: int              # inclusive
    last: int               # inclusive
    bookies: tuple[str, ...]

    @property
    def num_entries(self) -> int:
        return self.last - self.first + 1


def resolve_range(view: LedgerView, start: int, end: int) -> tuple[int, int]:
    """Requested (start incl., end excl., with EARLIEST/LATEST) -> inclusive
    [first, last] clipped to the readable prefix; first > last means empty."""
    first = 0 if start == EARLIEST else (view.readable_last + 1 if start == LATEST else start)
    last = view.readable_last if end == LATEST else min(end - 1, view.readable_last)
    return max(first, 0), last


def plan_ledger(view: LedgerView, start: int, end: int, max_entries: int) -> list[Slice]:
    if max_entries <= 0:
        raise ValueError("max_entries must be positive")
    first, last = resolve_range(view, start, end)
    out: list[Slice] = []
    if first > last:
        return out
    for frag_first, frag_last, bookies in view.fragments:
        if frag_last < 0:                       # open-ended: bounded by the readable prefix
            frag_last = view.readable_last
        lo, hi = max(first, frag_first), min(last, frag_last)
        while lo <= hi:
            top = min(hi, lo + max_entries - 1)
            out.append(Slice(view.ledger_id, lo, top, tuple(bookies)))
            lo = top + 1
    return out


def plan_slices(views: Sequence[LedgerView], starts: Iterable[int], ends: Iterable[int],
                max_entries: int) -> list[Slice]:
    out: list[Slice] = []
    for view, start, end in zip(views, starts, ends):
        out.extend(plan_ledger(view, start, end, max_entries))
    return out


def split_to_min(slices: Sequence[Slice], min_partitions: Optional[int]) -> list[Slice]:
    """At least ``min_partitions`` slices when there are that many entries."""
    slices = list(slices)
    if not min_partitions or len(slices) >= min_partitions:
        return slices
    total = sum(s.num_entries for s in slices)
    out: list[Slice] = []
    for s in slices:
        parts = max(1, min(s.num_entries, -(-s.num_entries * min_partitions // total)))
        size, extra = divmod(s.num_entries, parts)
        lo = s.first
        for i in range(parts):
            hi = lo + size + (1 if i < extra else 0) - 1
            out.append(Slice(s.ledger_id, lo, hi, s.bookies))
            lo = hi + 1
    return out
