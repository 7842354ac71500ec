"""The journal: append-only, CRC-framed, group-committed write-ahead log.

This module carries the group commit: the submission queue, the writer
stage, the leader fast path and when to roll.  The sync stage (one
fdatasync, then apply and answer in order) is ``journal_sync.py``, the
journal's failure (poison, fail what is unsynced) ``journal_failure.py``,
the file it appends to (opening, preallocation, framing and writing a
group, rolling's file half, deleting old files) ``journal_file.py``, what a
submission carries ``records.py``.

Theory of operation
-------------------
Record frame: ``[length u32][crc32c u32][type u8][body]`` (little endian);
``length`` is the body length, the CRC covers the type byte and the body.
The CRC's implementation is chosen in ``journal_crc.py``.
Files are ``<seq:016x>.jnl`` in the journal directory; a position is
``(seq, offset)``.

Ordering obligations:
  * Two stages, like BookKeeper's journal + force-write threads.  The writer
    thread owns the file: it takes submissions from a FIFO queue, forms groups
    (bounded by ``max_group_wait_s`` and ``max_group_bytes``), writes them in
    submission order and hands each written group to the sync stage
    (``journal_sync.SyncStage``), which makes every group written so far
    durable with ONE ``os.fdatasync`` and only then applies and answers them
    in order.
  * Who leads a submission is the submitter's choice (``Lead``): it leads
    it itself right after releasing its own locks (``Lead.NOW``), leads it
    later together with more of its own (``Lead.LATER``), or leaves it to
    the writer thread, which ``submit`` wakes for it (``Lead.WRITER``).
  * Leader fast path (leader/follower group commit).  A submitter that asks
    for it (``submit(..., lead=Lead.NOW)`` then ``lead()``, outside its
    own locks) does the work itself when the journal is idle: no group in
    the background pipeline and no other leader.  It takes every queued
    submission (its own and whatever queued behind it) as one group,
    writes, fdatasyncs, runs ``on_durable`` and completes the futures on
    its own thread, which saves the two thread hand-offs that dominate a
    lone add's latency.  Mutual
    exclusion keeps the order: the leader takes a group only while the
    background pipeline holds none, and the writer thread takes one only
    while there is no leader; both take from the one FIFO under one lock.
    The writer thread owns the file from taking a group until its write and
    any roll or preallocation are done (``_writer_busy``), so a leader never
    writes while the file is being rolled.
    Large submissions (> ``lead_max_bytes``) and anything arriving while busy
    go through the pipeline, which groups them.
    A lone add that finds the journal idle does not even queue: ``claim``
    (under the submitter's lock, where ``submit`` would have queued it) makes
    it the next group and its submitter the leader, and ``lead_now`` (after
    that lock) writes, syncs and applies it with no future: the submitter
    answers from the return value.  Both leader paths and the pipeline run
    the same write, sync and poison steps (``_write_group``,
    ``SyncStage.sync``), so a failure fails an inline submission exactly as
    it fails a queued one.  A leader's group of one goes through them
    without the lists a batch of groups needs, and the roll and
    preallocation check is one comparison (``JournalFile.check_at``), made
    once, by the caller of ``_roll_or_grow``.
  * A group of at least ``direct_min_bytes`` is written with ``O_DIRECT``
    (direct_write.py): PAD records align it, no byte already written is
    rewritten, and it is acknowledged after the same fdatasync as any group.
    A big record is framed by its submitter (``stage_ahead``, outside the
    submitter's locks) into a buffer the writer writes as it is: the CRC
    and the copy of a big add are not on the writer thread, which every
    journaled byte waits for.  A staged record is the same frames plus a
    PAD, so replay and the store see nothing new.
  * Rolling to a new file waits (barrier) until the sync stage is done with
    the old file descriptor.
  * A write or fdatasync failure poisons the journal for good
    (``journal_failure.py``): the failed group, every group written after it
    and every later submission fail; nothing is fsynced again.
  * ``fsync`` and ``pwritev`` are the journal's syscalls, injected like the
    clock: tests pass failing or lying ones (fault injection, the chaos
    checker's planted bug); production passes nothing.
  * Replay (``journal_replay.replay``, before ``start``) reads the files back
    from a checkpoint position, checking each CRC; it skips a damaged record
    (resynchronising on the next valid frame) and truncates only a torn
    tail.  Writing always starts a fresh file, so only tails can be torn.
  * Files wholly before a checkpoint are deleted by ``delete_before``, except
    the ones the entry store still reads: big add batches are not copied out
    of the journal, the store indexes them where the journal wrote them
    (``Submission.seq`` / ``body_at``, replay positions).  Only tails after
    the checkpoint position are ever truncated, and every indexed batch lies
    before it, so truncation never cuts an indexed batch.
"""
from __future__ import annotations

import collections
import enum
import os
import threading
import time
from concurrent.futures import Future
from typing import Callable, Iterable, Optional

from bookie_server.journal.journal_failure import JournalFailure, fail
from bookie_server.journal.journal_file import JournalFile
from bookie_server.journal.journal_sync import OnDurable, SyncStage, WrittenGroup
from bookie_server.journal.direct_write import RecordSpace, StagedRecord, stage_record
from bookie_server.journal.records import JournalRecord, StagedSubmission, Submission
from bookie_server.serving.metrics import BookieMetrics
from bookie_server.journal.journal_crc import Body, crc_of  # noqa: F401  (callers import it here)
from bookie_server.journal.journal_format import (HEADER, LEDGER, LEDGER_LAC,  # noqa: F401
                                                  MAX_RECORD, Position, RecordType, file_name,
                                                  frame, list_files)
from pybk_spark import errors


class Lead(enum.Enum):
    """Who writes and syncs a submission once it is queued."""
    # the submitter, with ``lead()`` right after releasing its own locks:
    # inline when the journal is idle, else the writer thread, which
    # ``lead()`` then wakes
    NOW = "now"
    # the submitter, with a later ``lead()``, once the rest of its burst is
    # queued behind it (one group for all of them); ``submit`` wakes nothing
    LATER = "later"
    # the writer thread, which ``submit`` wakes for it: the submitter reads
    # on while the writer thread writes
    WRITER = "writer"


class Journal:
    def __init__(self, directory: str, *, max_group_wait_s: float = 0.002,
                 max_group_bytes: int = 512 * 1024, flush_when_queue_empty: bool = True,
                 sync_data: bool = True, max_file_bytes: int = 256 << 20,
                 prealloc_bytes: int = 64 << 20, lead_max_bytes: int = 64 * 1024,
                 page_cache_keep_bytes: Optional[int] = None, direct_min_bytes: int = 0,
                 clock: Callable[[], float] = time.monotonic,
                 metrics: Optional[BookieMetrics] = None, fsync: Callable[[int], None] = os.fdatasync,
                 pwritev: Callable[[int, list[Body], int], int] = os.pwritev,
                 on_failure: Optional[Callable[[BaseException], None]] = None):
        self.file = JournalFile(directory, max_file_bytes=max_file_bytes,
                                prealloc_bytes=prealloc_bytes, headroom_bytes=max_group_bytes * 2,
                                direct_min_bytes=direct_min_bytes, pwritev=pwritev)
        self.dir = directory
        self.max_group_wait_s = max_group_wait_s
        self.max_group_bytes = max_group_bytes
        self.flush_when_queue_empty = flush_when_queue_empty
        self._failure = JournalFailure(self.file.path_of, on_failure)
        self._syncer = SyncStage(directory, self._failure, sync_data=sync_data, fsync=fsync,
                                 metrics=metrics, page_cache_keep_bytes=page_cache_keep_bytes)
        self.cache_window = self._syncer.cache_window
        # the leader path only where a lone submission would not wait for company anyway
        self.lead_max_bytes = lead_max_bytes if flush_when_queue_empty else -1
        self.clock = clock
        self._lock = threading.Lock()        # guards the fields below; _cv's own lock,
        self._cv = threading.Condition(self._lock)   # entered directly where nothing waits
        self._pending: "collections.deque[Submission]" = collections.deque()
        self._stopping = False               # close() asked the writer thread to finish
        self._closed = False                 # no more submissions
        self._leader = False                 # a submitter is writing a group itself
        self._pipeline_groups = 0            # groups taken by the writer thread, not yet synced
        self._writer_busy = False            # the writer thread owns the file (write, roll)
        self._started = False
        self._thread: Optional[threading.Thread] = None

    @property
    def durable_position(self) -> Position:
        """The position after the last durable group (or the current file's start)."""
        return self._syncer.durable_position

    def _file_started(self) -> None:
        syncer = self._syncer
        syncer.durable_position = max(syncer.durable_position, Position(self.file.seq, 0))

    # -- writing --------------------------------------------------------------
    def start(self, on_durable: OnDurable) -> None:
        """Open a fresh file and start the stages; ``on_durable(group,
        position)`` applies each durable group."""
        self.file.open_after_existing()
        self._file_started()
        self._syncer.start(on_durable, self._pipeline_done)
        self._thread = threading.Thread(target=self._run, name="journal-writer", daemon=True)
        self._thread.start()
        with self._cv:
            self._started = True

    def submit(self, records: list[tuple[int, Body]], payload: Optional[JournalRecord] = None, *,
               lead: Lead = Lead.WRITER, staged: Optional[StagedRecord] = None) -> Future[Position]:
        """Queue records; the future completes with the position after them
        once they are durable.  ``lead``: who writes them (``Lead``).  With
        ``Lead.NOW`` or ``Lead.LATER`` the caller promises to call ``lead()``
        after releasing its own locks, and the writer thread is not woken
        for this submission unless the caller cannot lead (a busy journal,
        a submission past ``lead_max_bytes``); ``Lead.WRITER`` wakes it.
        ``staged``: the last record, from ``stage_ahead``."""
        sub = (Submission(records, payload) if staged is None
               else StagedSubmission(records, payload, staged))
        return self.enqueue(sub, lead=lead)

    def stage_ahead(self, rtype: int, body: Body, body_crc: Optional[int] = None,
                    space: Optional[RecordSpace] = None) -> Optional[StagedRecord]:
        """A record big enough for a direct write, framed on the calling
        thread (``direct_write.stage_record``: its CRC and its copy are
        then not the writer thread's; ``body_crc``, the body's crc32c
        where the caller took it already); None where the journal would
        not write it direct.  ``space``: the ``RecordSpace`` whose body
        ``body`` is, framed where it lies instead of copied.  Pass it to
        ``submit`` as that record's ``staged``."""
        if not self.file.direct.wants(HEADER.size + len(body)):
            return None
        if space is not None and space.holds(body):
            return space.staged(rtype, body_crc)
        return stage_record(rtype, body, body_crc)

    def enqueue(self, sub: Submission, *, lead: Lead = Lead.WRITER) -> Future[Position]:
        """``submit`` for a submission made by the caller (a lone add's
        ``EntryRecord``); it must not be queued or claimed already."""
        future: Future[Position] = Future()
        sub.future = future
        with self._cv:
            if self._failure.error is not None:
                future.set_exception(errors.BookieIOError(self._failure.why()))
                return future
            if self._closed:
                future.set_exception(errors.BookieIOError("journal closed"))
                return future
            self._pending.append(sub)
            if not (lead is not Lead.WRITER and sub.nbytes <= self.lead_max_bytes
                    and self._can_lead_locked()):
                self._cv.notify_all()
        return future

    def claim(self, sub: Submission) -> bool:
        """Take the leader role for one small submission when the journal is
        idle (nothing queued, no group in the pipeline, no other leader):
        the submission is then the next group, in the place of the journal
        order where ``enqueue`` would have queued it, and the caller must
        pass it to ``lead_now`` right after releasing its own locks.  False
        when the journal is busy or the submission is large: ``enqueue`` it
        instead.  ``BookieIOError`` once the journal has failed or closed."""
        with self._lock:
            if self._failure.error is None and not self._closed:
                if self._pending or sub.nbytes > self.lead_max_bytes or not self._can_lead_locked():
                    return False
                self._leader = True
                return True
            if self._failure.error is not None:
                raise errors.BookieIOError(self._failure.why())
        raise errors.BookieIOError("journal closed")

    def lead_now(self, sub: Submission) -> Position:
        """Write, fdatasync and apply a ``claim``ed submission on this thread
        (the leader path with nothing to hand over: ``_lead_group`` of one,
        with no group list); the position after it once durable,
        ``BookieIOError`` when it is not."""
        f = self.file
        try:
            if self._failure.error is not None:
                fail((sub,), self._failure.why())
            else:
                try:
                    nbytes = f.write_one(sub)
                except BaseException as exc:  # noqa: BLE001 - poison and fail, as _write_group
                    self._write_failed(exc, (sub,))
                else:
                    position = Position(f.seq, f.offset)
                    self._syncer.sync_one(sub, position, f.fd, nbytes)
                    if f.offset >= f.check_at:
                        self._roll_or_grow()
        finally:
            self._end_lead()
        if sub.error is not None:
            raise errors.BookieIOError(sub.error)
        return position

    def write(self, records: list[tuple[int, Body]],
              payload: Optional[JournalRecord] = None) -> Future[Position]:
        """``submit`` + ``lead``, for a caller that holds no lock of its own."""
        fut = self.submit(records, payload, lead=Lead.NOW)
        self.lead()
        return fut

    def _can_lead_locked(self) -> bool:
        return self._started and not (self._leader or self._writer_busy or self._pipeline_groups or self._stopping)

    def lead(self) -> None:
        """Write and sync the queued submissions on this thread if the
        journal is idle; otherwise leave them to the writer thread."""
        with self._cv:
            if not self._pending:
                return
            if (not self._can_lead_locked()
                    or self._pending[0].nbytes > self.lead_max_bytes):
                self._cv.notify_all()
                return
            self._leader = True
            group = self._take_locked()
        self._lead_group(group)

    def _lead_group(self, group: list[Submission]) -> Optional[Position]:
        """The leader's turn (``_leader`` is set): write, sync and apply one
        group on this thread, then give the file back.  The position after
        the group, None when it failed."""
        try:
            written = self._write_group(group)
            if written is None:
                return None
            group, position, fd, nbytes = written
            self._syncer.sync(group, ((group, position),), fd, nbytes)
            if self.file.offset >= self.file.check_at:    # full or near the preallocated end
                self._roll_or_grow()
            return position
        finally:
            self._end_lead()

    def _end_lead(self) -> None:
        """A leader gives the file back."""
        with self._lock:
            self._leader = False
            if self._pending or self._stopping:   # only the writer thread waits on it
                self._cv.notify_all()

    def queue_depth(self) -> int:
        return len(self._pending)

    def _take_locked(self) -> list[Submission]:
        """Pop a group off the queue: at least one submission, then up to
        ``max_group_bytes``."""
        group = [self._pending.popleft()]
        nbytes = group[0].nbytes
        while self._pending and nbytes < self.max_group_bytes:
            sub = self._pending.popleft()
            group.append(sub)
            nbytes += sub.nbytes
        return group

    def _next_group(self) -> Optional[list[Submission]]:
        """Writer thread: wait for work (and, unless ``flush_when_queue_empty``,
        up to ``max_group_wait_s`` for company); None once closing and drained."""
        with self._cv:
            while True:
                if self._pending and not self._leader:
                    break
                if self._stopping and not self._pending and not self._leader:
                    return None
                # the timeout is a safety net only: a submitter that said it
                # would lead (Lead.NOW, Lead.LATER) always calls lead(), which
                # wakes us if it cannot; Lead.WRITER woke us at enqueue
                self._cv.wait(0.1)
            if not self.flush_when_queue_empty:
                deadline = self.clock() + self.max_group_wait_s
                while (sum(s.nbytes for s in self._pending) < self.max_group_bytes
                       and not self._stopping):
                    remaining = deadline - self.clock()
                    if remaining <= 0:
                        break
                    self._cv.wait(remaining)
            self._pipeline_groups += 1
            self._writer_busy = True
            return self._take_locked()

    def _run(self) -> None:
        """Writer stage: group, frame, pwritev; hand the group to the sync stage."""
        while True:
            group = self._next_group()
            if group is None:
                break
            self._write_and_hand_over(group)
            # let go before waiting: a group's submissions hold their
            # batches' received buffers (a pull's go back to its pool)
            del group
        self._syncer.stop()
        self._finish_file()

    def _write_and_hand_over(self, group: list[Submission]) -> None:
        try:
            written = self._write_group(group)
            if written is None:
                self._pipeline_done(1)
                return
            self._syncer.put(written)
            if self.file.offset >= self.file.check_at:    # as in _lead_group
                self._roll_or_grow()
        finally:
            with self._cv:          # the file is free again: a leader may take it
                self._writer_busy = False
                self._cv.notify_all()

    def _pipeline_done(self, groups: int) -> None:
        with self._cv:
            self._pipeline_groups -= groups
            self._cv.notify_all()

    def _write_group(self, group: list[Submission]) -> Optional[WrittenGroup]:
        """Write one group at the end of the file; returns what the sync step
        needs, or None if the group failed (its futures are failed)."""
        if self._failure.error is not None:
            fail(group, self._failure.why())
            return None
        f = self.file
        try:
            total = f.write_group(group)
        except BaseException as exc:  # noqa: BLE001 - poison and fail the group
            self._write_failed(exc, group)
            return None
        return group, Position(f.seq, f.offset), f.fd, total

    def _write_failed(self, exc: BaseException, group: Iterable[Submission]) -> None:
        """A write into the file failed: the journal is poisoned (nothing
        written after it is trusted) and ``group`` fails."""
        self._failure.poison(exc, "write", self.file.seq)
        fail(group, f"journal write failed: {exc}")

    def _roll_or_grow(self) -> None:
        """The file is full or near its preallocated end (``check_at``,
        checked by the caller): roll to the next file or preallocate more."""
        f = self.file
        if self._failure.error is not None:    # a failed journal neither rolls nor grows
            return
        try:
            if f.offset >= f.max_file_bytes:      # the file is full
                self._roll()
            elif f.prealloc_bytes:
                f.preallocate()
        except OSError as exc:      # e.g. ENOSPC creating the next file: later adds fail
            self._failure.poison(exc, "roll", self.file.seq)

    @property
    def failed(self) -> Optional[BaseException]:
        """The error that poisoned the journal, or None."""
        return self._failure.error

    def _finish_file(self) -> None:
        self.file.finish(durable=self._failure.error is None)   # a failed file: no retry

    def _roll(self) -> None:
        self._syncer.barrier()      # the sync stage must be done with the old fd
        self._finish_file()
        self.file.open(self.file.seq + 1)
        self._file_started()

    def delete_before(self, position: Position, keep: frozenset[int] = frozenset()) -> list[int]:
        """Delete journal files whose records all lie before ``position``,
        except those in ``keep`` (files the entry store still reads batches
        from).  Returns the deleted file seqs."""
        return self.file.delete_before(position, keep)

    def path_of(self, seq: int) -> str:
        return self.file.path_of(seq)

    def close(self) -> None:
        with self._cv:
            if self._closed:
                return
            self._closed = True
            self._stopping = True
            self._cv.notify_all()
        if self._thread is not None:
            self._thread.join()
        with self._cv:      # never started: fail what was queued
            left, self._pending = list(self._pending), collections.deque()
        fail(left, "journal closed")
