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
``cost[e] - cost[s] <= budget`` where ``cost = cum + per_entry * index``),
found by binary search over cumulative sums: the work is per batch, not
per entry, and a run that fits one batch (the common case) is decided by a
single ``sum``.

Refusal (``first_oversized``): a payload over ``lim.max_entry_bytes`` is
refused before any id is assigned (``add_admission``); the index of the
first such payload names it.  Cutting itself never refuses: the coalescing
queue holds payloads checked when they were queued, and a batch of one
always goes.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np
import numpy.typing as npt

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
        n = len(sizes)
        self.n = n
        self.max_entries = max_entries
        self.max_bytes = max_bytes
        self.budget = lim.request_payload_budget(0)      # payloads + per-entry overhead
        self.cum: npt.NDArray[np.int64] = np.zeros(n + 1, dtype=np.int64)
        np.cumsum(np.asarray(sizes, dtype=np.int64), out=self.cum[1:])
        self.cost: npt.NDArray[np.int64] = self.cum + BATCH_PER_ENTRY_OVERHEAD * np.arange(
            n + 1, dtype=np.int64)

    def end(self, start: int) -> int:
        """Exclusive end of the greedy batch starting at ``start`` (< n)."""
        by_bytes = int(np.searchsorted(self.cum, self.cum[start] + self.max_bytes, side="right")) - 1
        by_budget = int(np.searchsorted(self.cost, self.cost[start] + self.budget, side="right")) - 1
        return max(start + 1, min(self.n, start + self.max_entries, by_bytes, by_budget))
