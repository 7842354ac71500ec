"""The journal's sync stage: fdatasync, then apply and answer in order.

Like BookKeeper's force-write thread: the sync thread takes every group the
writer thread has written so far, makes them durable with ONE
``os.fdatasync``, and only then runs the ``on_durable`` hook per group (in
order) and completes the submitters' futures.  So every acknowledged record
is on disk, a record submitted before another is never durable after it,
and writing the next groups overlaps the current fdatasync.  A leader
(journal.py) runs the same ``sync`` step on its own thread for its one
group, with no lists: the group and its position as they are, the
page-cache window extended in place (``SyncedWindow.extend``).  The
answers of what one fdatasync made durable go out together, one send per
connection (``frame_socket.corked``), in the order they were given.  A leader's
submission has no future: it is answered by its ``applied`` hook, right
after it is applied and before the metrics and the page-cache advice, so
that a lone add's answer leaves the bookie first.

A failed fdatasync (or applying after it) poisons the journal
(journal_failure.py) and fails its groups and every later one: they were
written into the same file, whose pages may be gone.

``page_cache_keep_bytes`` (page_cache.py): after the fdatasync and the acks,
synced ranges that fell that far behind leave the page cache (advice, one
``posix_fadvise`` per window slack, not per group).

``fsync`` is injected like the clock: tests pass failing or lying ones
(fault injection, the chaos checker's planted bug); production passes
nothing.
"""
from __future__ import annotations

import logging
import queue
import threading
import time
from typing import Any, Callable, Optional, Sequence

from bookie_server.journal.journal_failure import JournalFailure, fail
from bookie_server.journal.journal_format import Position, file_name
from bookie_server.journal.records import Submission
from bookie_server.serving.metrics import BookieMetrics
from bookie_server.storage import page_cache
from pybk_spark.wire.frame_socket import corked

log = logging.getLogger("bookie.journal")

# a written group, for the sync stage: (its submissions, the position after
# it, the file's descriptor, the bytes written)
WrittenGroup = tuple[list[Submission], Position, int, int]
OnDurable = Callable[[list[Submission], Position], None]

_STOP = object()


def _applied(sub: Submission) -> None:
    """``sub.applied()``: what it runs (answering a client) is not the
    journal's, and never poisons it, as a future's callbacks do not."""
    try:
        sub.applied()
    except Exception:  # noqa: BLE001 - logged, as concurrent.futures logs a callback's
        log.exception("event=journal_applied_callback_error")


class SyncStage:
    """The sync thread and the sync step; ``durable_position``: the
    position after the last group made durable (or the current file's start)."""

    def __init__(self, directory: str, failure: JournalFailure, *, sync_data: bool,
                 fsync: Callable[[int], None], metrics: Optional[BookieMetrics],
                 page_cache_keep_bytes: Optional[int]) -> None:
        self.dir = directory
        self.failure = failure
        self.sync_data = sync_data
        self.metrics = metrics
        self.cache_window = None if page_cache_keep_bytes is None or not sync_data \
            else page_cache.SyncedWindow(page_cache_keep_bytes)
        self._fsync = fsync                  # injected like the clock (fault tests)
        self.durable_position = Position(0, 0)
        self._q: "queue.Queue[Any]" = queue.Queue()
        self._thread: Optional[threading.Thread] = None

    def start(self, on_durable: OnDurable, groups_done: Callable[[int], None]) -> None:
        """Start the sync thread: ``on_durable`` per group once durable,
        ``groups_done(n)`` after each batch of ``n`` handed-over groups."""
        self._on_durable = on_durable
        self._groups_done = groups_done
        self._thread = threading.Thread(target=self._run, name="journal-sync", daemon=True)
        self._thread.start()

    def put(self, written: WrittenGroup) -> None:
        """Hand over a group the writer thread wrote."""
        self._q.put(written)

    def barrier(self) -> None:
        """Wait until the sync stage has finished everything handed to it."""
        done = threading.Event()
        self._q.put(done)
        done.wait()

    def stop(self) -> None:
        """Finish what was handed over, then end the sync thread."""
        self.barrier()
        self._q.put(_STOP)
        if self._thread is not None:
            self._thread.join()

    def _run(self) -> None:
        """ONE fdatasync covers every group written so far, then groups are
        applied and answered in order."""
        while True:
            items = [self._q.get()]
            while True:
                try:
                    items.append(self._q.get_nowait())
                except queue.Empty:
                    break
            groups = []
            for item in items + [None]:
                if isinstance(item, tuple):
                    groups.append(item)
                    continue
                if groups:
                    self._sync_groups(groups)
                    self._groups_done(len(groups))
                    groups = []
                if item is _STOP:
                    return
                if isinstance(item, threading.Event):
                    item.set()
            # let go of the groups before waiting: a group's submissions hold
            # their batches' received buffers (a pull's go back to its pool)
            del items, item

    def _sync_groups(self, groups: list[WrittenGroup]) -> None:
        if len(groups) == 1:
            group, position, fd, nbytes = groups[0]
            self.sync(group, ((group, position),), fd, nbytes)
        else:
            self.sync([sub for g in groups for sub in g[0]], [(g[0], g[1]) for g in groups],
                      groups[-1][2], sum(g[3] for g in groups))

    def sync(self, subs: list[Submission],
             applies: Sequence[tuple[list[Submission], Position]], fd: int, nbytes: int) -> None:
        """ONE fdatasync of ``fd`` for ``subs`` (``nbytes`` written), then each
        group of ``applies`` applied and answered in order at its position;
        a failure poisons the journal and fails ``subs``."""
        if self.failure.error is None:
            op = "fdatasync"
            try:
                synced_s = self._fdatasync(fd)
                op = "apply"
                with corked():                    # one send per connection for all of them
                    for group, position in applies:
                        self.durable_position = position
                        self._on_durable(group, position)
                        for sub in group:
                            fut = sub.future
                            if fut is None:       # led inline: answer before the bookkeeping
                                _applied(sub)
                            elif not fut.done():
                                fut.set_result(position)
                if self.metrics is not None:
                    self.metrics.journal_fsync(synced_s, len(subs), nbytes)
            except BaseException as exc:  # noqa: BLE001 - poison and fail
                # the fdatasync (or applying after it) failed: these groups and
                # every later one - written behind them into the same file,
                # whose pages may be gone - fail; nothing is fsynced again
                self.failure.poison(exc, op, applies[-1][1].seq)
            else:
                self._advise(applies[-1][1], fd, nbytes)
                return
        fail(subs, self.failure.why())

    def sync_one(self, sub: Submission, position: Position, fd: int, nbytes: int) -> None:
        """``sync`` of one submission led inline (no future), with no lists:
        fdatasync, apply, ``applied``, then the metrics and the advice."""
        if self.failure.error is None:
            op = "fdatasync"
            try:
                synced_s = self._fdatasync(fd)
                op = "apply"
                self.durable_position = position
                self._on_durable([sub], position)
                _applied(sub)
                if self.metrics is not None:
                    self.metrics.journal_fsync(synced_s, 1, nbytes)
            except BaseException as exc:  # noqa: BLE001 - poison and fail, as ``sync``
                self.failure.poison(exc, op, position.seq)
            else:
                self._advise(position, fd, nbytes)
                return
        fail((sub,), self.failure.why())

    def _fdatasync(self, fd: int) -> float:
        """fdatasync ``fd`` (unless the journal does not sync data); the
        seconds it took, for the metrics."""
        t0 = time.perf_counter()
        if self.sync_data:
            self._fsync(fd)
        return time.perf_counter() - t0

    def _advise(self, end: Position, fd: int, nbytes: int) -> None:
        """After the acks, only advice: the ``nbytes`` synced up to ``end``
        join the page-cache window."""
        window = self.cache_window
        if window is not None and not window.extend(end.seq, end.offset - nbytes, end.offset):
            self._release_pages(window, end, fd, nbytes)

    def _release_pages(self, window: page_cache.SyncedWindow, end: Position, fd: int,
                       nbytes: int) -> None:
        """The synced range (one file) that ``window.extend`` did not take: to
        the window, and the ranges that fell behind it out of the page cache."""
        try:
            ranges = window.synced(end.seq, end.offset - nbytes, end.offset)
            if ranges:
                page_cache.drop(self.dir, ranges, file_name, end.seq, fd)
        except Exception:  # noqa: BLE001 - advice must never fail the journal
            log.exception("event=journal_page_cache_error")
