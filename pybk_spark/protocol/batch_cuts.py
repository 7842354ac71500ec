"""Where a run of payloads is cut into add requests (batches).  No I/O.

Theory of operation
-------------------
Every add request carries one Arrow batch of consecutive entries, sent to
each bookie of their write sets.  A batch [s, e) of payload sizes ``sizes``
FITS when all of these hold (``fits``):
  * ``e - s <= max_entries``  (client ``add_batch_entries``);
  * its payload bytes ``<= max_bytes``  (client ``add_batch_bytes``);
  * its payload bytes ``<= lim.request_payload_budget(e - s)``: the request
    stays under the bookies' per-request limit (``add_admission.limits``,
    payloads plus ``batch_overhead``);
or it holds a single entry: one entry always goes, alone if need be (an
entry within ``lim.max_entry_bytes`` passes the request check by
construction of ``add_admission.limits``; it may exceed ``max_bytes``,
which is a coalescing target, not a refusal).

Cutting is greedy and in order: each batch takes as many of the next
payloads as fit (``batch_ends`` for a whole run, ``first_batch`` for the head
of the handle's coalescing queue).  Because sizes are non-negative, each
condition is monotone in ``e``, so the greedy end of the batch starting at
``s`` is the smallest of the three separate maxima (entry count; the last
``e`` with ``cum[e] - cum[s] <= max_bytes``; the last ``e`` with
``cost(e) - cost(s) <= budget`` where ``cost(i) = cum[i] + per_entry * i``),
found by binary search (``bisect``) over the cumulative sums, built in C
(``itertools.accumulate``): no Python step per entry, two binary searches
per batch, and a run that fits one batch (the common case) is decided by a
single ``sum``.  (numpy was measured slower here: its per-call overhead
outweighs its vector speed for a few searches per run.)

Refusal (``first_oversized``): a payload over ``lim.max_entry_bytes`` is
refused before any id is assigned (``add_admission``); the index of the
first such payload names it.  Cutting itself never refuses: the coalescing
queue holds payloads checked when they were queued, and a batch of one
always goes.
"""
from __future__ import annotations

from bisect import bisect_right
from itertools import accumulate
from typing import Sequence

from pybk_spark.protocol.add_admission import BATCH_PER_ENTRY_OVERHEAD, AddLimits


def fits(entries: int, size: int, max_entries: int, max_bytes: int, lim: AddLimits) -> bool:
    """Whether ``entries`` payloads of ``size`` bytes in total go in one
    request (a single entry always does: module doc)."""
    return entries <= 1 or (entries <= max_entries and size <= max_bytes
                            and size <= lim.request_payload_budget(entries))


def first_oversized(sizes: Sequence[int], lim: AddLimits) -> int | None:
    """Index of the first payload over the entry limit, or None."""
    if not sizes or max(sizes) <= lim.max_entry_bytes:
        return None
    return next(i for i, s in enumerate(sizes) if s > lim.max_entry_bytes)


def batch_ends(sizes: Sequence[int], max_entries: int, max_bytes: int, lim: AddLimits) -> list[int]:
    """The exclusive end index of each batch, in order: batch k is
    ``sizes[ends[k-1]:ends[k]]`` (``ends[-1] == len(sizes)``; [] for none)."""
    n = len(sizes)
    if n == 0:
        return []
    if fits(n, sum(sizes), max_entries, max_bytes, lim):
        return [n]
    cuts = _Cutter(sizes, max_entries, max_bytes, lim)
    ends: list[int] = []
    start = 0
    while start < n:
        start = cuts.end(start)
        ends.append(start)
    return ends


def first_batch(sizes: Sequence[int], max_entries: int, max_bytes: int, lim: AddLimits) -> int:
    """How many of the leading payloads go in the first batch (0 for none)."""
    n = len(sizes)
    if n == 0 or fits(n, sum(sizes), max_entries, max_bytes, lim):
        return n
    return _Cutter(sizes, max_entries, max_bytes, lim).end(0)


class _Cutter:
    """Cumulative sums of a run, for the greedy end of any batch start."""

    def __init__(self, sizes: Sequence[int], max_entries: int, max_bytes: int, lim: AddLimits):
        self.n = len(sizes)
        self.max_entries = max_entries
        self.max_bytes = max_bytes
        self.budget = lim.request_payload_budget(0)      # payloads + per-entry overhead
        self.cum = list(accumulate(sizes, initial=0))    # cum[i]: bytes of sizes[:i]

    def _cost(self, i: int) -> int:
        """Bytes of sizes[:i] with i entries' request overhead (non-decreasing)."""
        return self.cum[i] + BATCH_PER_ENTRY_OVERHEAD * i

    def end(self, start: int) -> int:
        """Exclusive end of the greedy batch starting at ``start`` (< n)."""
        lo, hi = start + 1, min(self.n, start + self.max_entries)
        if hi <= lo:
            return lo
        # the last e in [lo, hi] within each bound, by binary search
        hi = bisect_right(self.cum, self.cum[start] + self.max_bytes, lo, hi + 1) - 1
        if hi <= lo:
            return lo
        return max(lo, bisect_right(range(hi + 1), self._cost(start) + self.budget, lo, hi + 1,
                                    key=self._cost) - 1)
