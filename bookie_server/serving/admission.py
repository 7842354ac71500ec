"""Add admission: the bookie's bound on adds in progress and on add memory.

Theory of operation
-------------------
``admit(nbytes)`` runs before an add is decided or journaled.  It counts the
add in, or raises ``TooManyRequests`` when one more would pass
``max_adds_in_progress`` (adds accepted and not yet durable, over all
connections) or ``max_add_memory_bytes`` (bytes of the adds in progress plus
the store's write cache).  Nothing of a refused add is journaled or stored:
the client retries it after a backoff (docs/protocol.md).  The caller calls
the returned ``release`` exactly once when the add is answered (durable or
failed); a caller that answers on its own thread pairs ``enter(nbytes)`` and
``leave(nbytes)`` around the add instead, with no closure.  A refusal for
memory also asks for a checkpoint (``on_full``), which drains the write
cache.  0 disables a bound.  The count and the check are one
step under one lock, so concurrent connections cannot overshoot the bounds.
"""
from __future__ import annotations

import threading
from typing import Callable

from pybk_spark import errors


class AddAdmission:
    def __init__(self, max_adds: int, max_bytes: int, write_cache_bytes: Callable[[], int],
                 on_refused: Callable[[], None] = lambda: None,
                 on_full: Callable[[], None] = lambda: None):
        self.max_adds = max_adds
        self.max_bytes = max_bytes
        self._cache = write_cache_bytes
        self._on_refused = on_refused
        self._on_full = on_full
        self._lock = threading.Lock()
        self.adds = 0               # adds in progress
        self.bytes = 0              # their request bytes

    def admit(self, nbytes: int) -> Callable[[], None]:
        self.enter(nbytes)
        return lambda: self.leave(nbytes)

    def enter(self, nbytes: int) -> None:
        """Count one add of ``nbytes`` in (``TooManyRequests`` past a bound)."""
        with self._lock:
            adds, held = self.adds, self.bytes
            if ((not self.max_adds or adds < self.max_adds)
                    and (not self.max_bytes or held + self._cache() + nbytes <= self.max_bytes)):
                self.adds, self.bytes = adds + 1, held + nbytes
                return
            over_count = bool(self.max_adds) and adds >= self.max_adds
            used = held + self._cache() if self.max_bytes else 0
        self._on_refused()
        if over_count:
            raise errors.TooManyRequests(
                f"bookie overloaded: {adds} adds in progress (max_adds_in_progress "
                f"{self.max_adds})")
        self._on_full()
        raise errors.TooManyRequests(
            f"bookie overloaded: {used} bytes of adds in progress and in the write cache "
            f"(max_add_memory_bytes {self.max_bytes})")

    def leave(self, nbytes: int) -> None:
        """Count an add ``enter`` counted in out again (answered)."""
        with self._lock:
            self.adds -= 1
            self.bytes -= nbytes
