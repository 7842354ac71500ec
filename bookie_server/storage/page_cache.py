"""How much of the journal the OS page cache keeps: the newest synced bytes.

Theory of operation
-------------------
Big add batches are not copied out of the journal: readers are served from
the journal files (entry_store.py), so recently written journal bytes are
worth keeping in the page cache for tailing and catch-up readers.  Older
ones are not, and letting every byte ever journaled stay cached has a cost:
the page cache grows into memory the kernel must first find (on VMs with
free page reporting, memory that faults in from the host again), and it
pushes out everything else the machine caches.

``SyncedWindow`` is the bookkeeping: the journal reports each range it has
made durable, in write order (file seq, start, end), and the window answers
with the ranges that have fallen more than ``keep_bytes`` behind the newest
synced byte.  Those are dropped with ``posix_fadvise(DONTNEED)``
(``drop``), which is BookKeeper's journalRemoveFromPageCache (which drops
every range at once: ``keep_bytes = 0`` here).  To keep the system calls few,
nothing is dropped until ``slack`` bytes beyond the window have built up;
until then a range that continues the newest one only extends it
(``extend``, the journal's per-group step: no list is built).

Ordering obligations:
  * a range is reported only after its fdatasync returned: dropping pages
    that are not yet durable would only start their writeback, never lose
    them, but it would waste the call;
  * ranges are reported in journal order, so the oldest held range is always
    the first to go.

``SyncedWindow`` is pure (no I/O, no clock, no threads); ``drop`` is the
thin adapter, and advice that fails is ignored: it is only advice.
"""
from __future__ import annotations

import collections
import logging
import os
from typing import Callable, Iterable, Optional

log = logging.getLogger("bookie.page_cache")

PAGE = os.sysconf("SC_PAGE_SIZE")
MAX_SLACK = 16 << 20


class SyncedWindow:
    """The synced journal ranges still held in the page cache, oldest first."""

    def __init__(self, keep_bytes: int, slack: Optional[int] = None):
        if keep_bytes < 0:
            raise ValueError("keep_bytes must be >= 0")
        self.keep_bytes = keep_bytes
        self.slack = min(MAX_SLACK, keep_bytes // 8) if slack is None else slack
        self._ranges: "collections.deque[list[int]]" = collections.deque()   # [seq, start, end]
        self.held = 0

    def extend(self, seq: int, start: int, end: int) -> bool:
        """``synced`` for the common case, without building an answer: the
        range continues the newest one and nothing falls out of the window.
        False (nothing recorded) otherwise: call ``synced``."""
        last = self._ranges[-1] if self._ranges else None
        if (last is None or last[2] != start or last[0] != seq or end <= start
                or self.held + (end - start) > self.keep_bytes + self.slack):
            return False
        last[2] = end
        self.held += end - start
        return True

    def synced(self, seq: int, start: int, end: int) -> list[tuple[int, int, int]]:
        """Record that ``[start, end)`` of journal file ``seq`` is durable;
        return the ranges to drop now, as (seq, start, end) with ``start``
        rounded down to a page (the page it shares with an older range was
        dropped or is being dropped anyway)."""
        if end <= start:
            return []
        last = self._ranges[-1] if self._ranges else None
        if last is not None and last[0] == seq and last[2] == start:
            last[2] = end                       # contiguous: extend the newest range
        else:
            self._ranges.append([seq, start, end])
        self.held += end - start
        if self.held <= self.keep_bytes + self.slack:
            return []
        out = []
        excess = self.held - self.keep_bytes
        while excess > 0:
            seq0, start0, end0 = self._ranges[0]
            cut = min(end0, start0 + excess)
            out.append((seq0, start0 & ~(PAGE - 1), cut))
            excess -= cut - start0
            self.held -= cut - start0
            if cut == end0:
                self._ranges.popleft()
            else:
                self._ranges[0][1] = cut
        return out


def drop(directory: str, ranges: Iterable[tuple[int, int, int]], file_name: Callable[[int], str],
         current_seq: int, current_fd: int) -> None:
    """Advise the kernel to drop each range.  The file being written is
    advised through its own descriptor; older files are opened by path (a
    file already deleted has nothing left to drop)."""
    for seq, start, end in ranges:
        try:
            if seq == current_seq and current_fd >= 0:
                os.posix_fadvise(current_fd, start, end - start, os.POSIX_FADV_DONTNEED)
                continue
            fd = os.open(os.path.join(directory, file_name(seq)), os.O_RDONLY)
            try:
                os.posix_fadvise(fd, start, end - start, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)
        except FileNotFoundError:
            continue
        except (OSError, ValueError) as exc:  # pragma: no cover - e.g. no fadvise here
            log.debug("event=journal_fadvise_failed error=%r", exc)
