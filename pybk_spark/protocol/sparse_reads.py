"""Windowed sparse reads of a set of ids from one bookie: the plan, no I/O.

Theory of operation
-------------------
A sparse read (``ReadRequest.sparse``) returns every entry a bookie stores
in [a, b], gaps skipped, so a striped slot (E > Qw: runs of Qw ids) costs one
read per ``max_entries`` ids, not one per run.  ``SparseReadWindow`` cuts the
span of the wanted ids (ascending) into reads of ``max_entries`` ids, keeps
at most ``window`` of them in flight, and for each answer:

* a LIMIT answer (the bookie stopped at its entry or byte cap) is resumed
  after its last row, for the rest of its span;
* its wanted rows are ``wanted_rows`` (a stored id may not be wanted: other
  ids of the span, or ids already copied from another replica).

What an error means (NoSuchLedger: none of them; others: the bookie failed)
is the caller's: the client's re-replication reads (``admin/operations/replica_reads``)
and a bookie's pull from a peer (``bookie_server/serving/pull``) drive the
same window with their own I/O.

Pure: numpy only; no I/O, no clock, no threads.
"""
from __future__ import annotations

from collections import deque
from typing import Callable, Generic, Hashable, TypeVar

import numpy as np

LIMIT = "LIMIT"

R = TypeVar("R", bound=Hashable)


def wanted_rows(eids: np.ndarray, wanted: np.ndarray) -> np.ndarray:
    """Mask: which of ``eids`` are in ``wanted`` (ascending)."""
    if len(wanted) == 0:
        return np.zeros(len(eids), dtype=bool)
    pos = np.searchsorted(wanted, eids)
    mask: np.ndarray = (pos < len(wanted)) & (wanted[np.minimum(pos, len(wanted) - 1)] == eids)
    return mask


class SparseReadWindow(Generic[R]):
    """The reads covering ``wanted`` (ascending ids); ``R`` is the caller's
    request handle (a future)."""

    def __init__(self, wanted: np.ndarray, max_entries: int, window: int):
        self.wanted = np.asarray(wanted, dtype=np.int64)
        self.window = window
        self.inflight: dict[R, tuple[int, int]] = {}
        self._todo: deque[tuple[int, int]] = deque()
        if len(self.wanted):
            lo, hi = int(self.wanted[0]), int(self.wanted[-1])
            self._todo.extend((a, min(hi, a + max_entries - 1))
                              for a in range(lo, hi + 1, max_entries))

    @property
    def busy(self) -> bool:
        """Reads remain to be sent or answered."""
        return bool(self._todo or self.inflight)

    def fill(self, send: Callable[[int, int], R]) -> None:
        """Send (``send(a, b)`` -> request) until ``window`` are in flight."""
        while self._todo and len(self.inflight) < self.window:
            a, b = self._todo.popleft()
            self.inflight[send(a, b)] = (a, b)

    def finished(self, request: R) -> tuple[int, int]:
        """``request`` is answered (or failed): its span, now out of flight."""
        return self.inflight.pop(request)

    def answered(self, span: tuple[int, int], eids: np.ndarray, end: str) -> np.ndarray:
        """Rows ``eids`` (ascending, at least one) answered the read of
        ``span`` with ``end``: resumes a LIMIT answer; returns the mask of
        the wanted rows."""
        if end == LIMIT and int(eids[-1]) < span[1]:
            self._todo.append((int(eids[-1]) + 1, span[1]))
        return wanted_rows(eids, self.wanted)

    def abandon(self) -> list[R]:
        """Stop: the requests still in flight (for the caller to cancel)."""
        out = list(self.inflight)
        self.inflight.clear()
        return out
