"""The journal: append-only, CRC-framed, group-committed write-ahead log.

Theory of operation
-------------------
Record frame: ``[length u32][crc32c u32][type u8][body]`` (little endian);
``length`` is the body length, the CRC covers the type byte and the body.
Files are ``<seq:016x>.jnl`` in the journal directory; a position is
``(seq, offset)``.

Ordering obligations:
  * Two stages, like BookKeeper's journal + force-write threads.  The writer
    thread owns the file: it takes submissions from a FIFO queue, forms groups
    (bounded by ``max_group_wait_s`` and ``max_group_bytes``), writes them in
    submission order and hands each written group to the sync thread.  The
    sync thread takes every group written so far, makes them durable with ONE
    ``os.fdatasync``, and only then runs the ``on_durable`` hook per group (in
    order) and completes the submitters' futures.  So every acknowledged
    record is on disk, a record submitted before another is never durable
    after it, and writing the next groups overlaps the current fdatasync.
  * Rolling to a new file waits (barrier) until the sync thread is done with
    the old file descriptor.
  * A write or fsync failure poisons the journal: that group and every later
    submission fail with BookieIOError (after a failed fsync the page cache
    can no longer be trusted).
  * ``replay`` (before ``start``) yields records after a checkpoint position,
    verifying each CRC.  A torn or corrupt record ends its file: the file is
    truncated there (logged), so damaged bytes are never served.  Writing
    always starts a fresh file, so only tails can be torn.
  * Files wholly before a checkpoint are deleted by ``delete_before``.
"""
from __future__ import annotations

import enum
import logging
import os
import queue
import struct
import threading
import time
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Optional

import google_crc32c

from pybk_spark import errors

log = logging.getLogger("bookie.journal")

HEADER = struct.Struct("<IIB")
MAX_RECORD = 1 << 31
# chaos-test fault flag (tests/chaos): acknowledge groups without writing them
_FAULT_ACK_BEFORE_FSYNC = os.environ.get("PYBK_FAULT") == "ack_before_fsync"


class RecordType(enum.IntEnum):
    ADD_BATCH = 1       # body: Arrow IPC stream bytes as received
    FENCE = 2           # body: ledger u64
    MASTER_KEY = 3      # body: ledger u64 + key bytes
    EXPLICIT_LAC = 4    # body: ledger u64 + lac i64
    LEDGER_DELETED = 5  # body: ledger u64 (written by GC)


LEDGER = struct.Struct("<Q")
LEDGER_LAC = struct.Struct("<Qq")


def crc_of(rtype: int, body: bytes) -> int:
    return google_crc32c.extend(google_crc32c.value(bytes((rtype,))), body)


def frame(rtype: int, body: bytes) -> list[bytes]:
    return [HEADER.pack(len(body), crc_of(rtype, body), rtype), body]


@dataclass(order=True, frozen=True)
class Position:
    seq: int
    offset: int


@dataclass
class Submission:
    records: list[tuple[int, bytes]]
    payload: Any = None
    future: Future = field(default_factory=Future)
    nbytes: int = 0
    enqueued_at: float = 0.0


_STOP = object()


def file_name(seq: int) -> str:
    return f"{seq:016x}.jnl"


def list_files(directory: str) -> list[int]:
    out = []
    for name in os.listdir(directory):
        if name.endswith(".jnl"):
            try:
                out.append(int(name[:-4], 16))
            except ValueError:
                continue
    return sorted(out)


class Journal:
    def __init__(self, directory: str, *, max_group_wait_s: float = 0.002,
                 max_group_bytes: int = 512 * 1024, flush_when_queue_empty: bool = True,
                 sync_data: bool = True, max_file_bytes: int = 256 << 20,
                 prealloc_bytes: int = 64 << 20, clock: Callable[[], float] = time.monotonic,
                 metrics: Any = None, fsync: Callable[[int], None] = os.fdatasync,
                 on_failure: Optional[Callable[[BaseException], None]] = None):
        self.dir = directory
        os.makedirs(directory, exist_ok=True)
        self.max_group_wait_s = max_group_wait_s
        self.max_group_bytes = max_group_bytes
        self.flush_when_queue_empty = flush_when_queue_empty
        self.sync_data = sync_data
        self.max_file_bytes = max_file_bytes
        self.prealloc_bytes = prealloc_bytes
        self.clock = clock
        self.metrics = metrics
        self._fsync = fsync                  # injected like the clock (fault tests)
        self._on_failure = on_failure        # called once, on the failing journal thread
        self._q: "queue.Queue[Any]" = queue.Queue()
        self._thread: Optional[threading.Thread] = None
        self._failed: Optional[BaseException] = None
        self._fd = -1
        self._seq = 0
        self._offset = 0
        self._allocated = 0
        self.durable_position = Position(0, 0)
        self._submit_lock = threading.Lock()
        self._closed = False
        self._sync_q: "queue.Queue[Any]" = queue.Queue()
        self._syncer: Optional[threading.Thread] = None

    # -- replay ---------------------------------------------------------------
    def replay(self, start: Position) -> Iterator[tuple[Position, int, bytes]]:
        """Yield (position after record, type, body) for records at/after start."""
        for seq in list_files(self.dir):
            if seq < start.seq:
                continue
            yield from self._replay_file(seq, start.offset if seq == start.seq else 0)

    def _replay_file(self, seq: int, offset: int) -> Iterator[tuple[Position, int, bytes]]:
        path = os.path.join(self.dir, file_name(seq))
        size = os.path.getsize(path)
        with open(path, "rb") as fh:
            fh.seek(offset)
            pos = offset
            while True:
                head = fh.read(HEADER.size)
                if len(head) == 0:
                    return
                problem = None
                if len(head) < HEADER.size:
                    problem = "torn header"
                else:
                    length, crc, rtype = HEADER.unpack(head)
                    if length == 0 and crc == 0 and rtype == 0:
                        problem = "" if not any(fh.read(1 << 16)) else "zero header"
                    elif rtype not in RecordType.__members__.values() or length > size - pos:
                        problem = f"bad header (type={rtype} length={length})"
                    else:
                        body = fh.read(length)
                        if len(body) < length:
                            problem = "torn body"
                        elif crc_of(rtype, body) != crc:
                            problem = "crc mismatch"
                if problem is not None:
                    if problem:
                        log.warning("event=journal_tail_truncated file=%s offset=%d reason=%r "
                                    "dropped_bytes=%d", file_name(seq), pos, problem, size - pos)
                    fh.close()
                    self._truncate(path, pos)
                    return
                pos += HEADER.size + length
                yield Position(seq, pos), rtype, body

    @staticmethod
    def _truncate(path: str, offset: int) -> None:
        fd = os.open(path, os.O_WRONLY)
        try:
            os.ftruncate(fd, offset)
            os.fsync(fd)
        finally:
            os.close(fd)

    # -- writing --------------------------------------------------------------
    def start(self, on_durable: Callable[[list[Submission], Position], None]) -> None:
        files = list_files(self.dir)
        self._open_file((files[-1] + 1) if files else 1)
        self._on_durable = on_durable
        self._syncer = threading.Thread(target=self._sync_run, name="journal-sync", daemon=True)
        self._syncer.start()
        self._thread = threading.Thread(target=self._run, name="journal-writer", daemon=True)
        self._thread.start()

    def _open_file(self, seq: int) -> None:
        path = os.path.join(self.dir, file_name(seq))
        self._fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        self._seq, self._offset, self._allocated = seq, 0, 0
        self._preallocate()
        dfd = os.open(self.dir, os.O_RDONLY)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)
        self.durable_position = max(self.durable_position, Position(seq, 0))

    def _preallocate(self) -> None:
        if self.prealloc_bytes <= 0:
            return
        while self._allocated < self._offset + self.max_group_bytes * 2:
            try:
                os.posix_fallocate(self._fd, self._allocated, self.prealloc_bytes)
            except OSError:
                self.prealloc_bytes = 0
                return
            self._allocated += self.prealloc_bytes

    def submit(self, records: list[tuple[int, bytes]], payload: Any = None) -> Future:
        sub = Submission(records, payload, nbytes=sum(HEADER.size + len(b) for _, b in records),
                         enqueued_at=self.clock())
        if self._failed is not None:
            sub.future.set_exception(errors.BookieIOError(f"journal failed: {self._failed}"))
            return sub.future
        if self._closed:
            sub.future.set_exception(errors.BookieIOError("journal closed"))
            return sub.future
        self._q.put(sub)
        return sub.future

    def queue_depth(self) -> int:
        return self._q.qsize()

    def _collect(self, first: Submission) -> tuple[list[Submission], bool]:
        group, nbytes, stop = [first], first.nbytes, False
        deadline = self.clock() + self.max_group_wait_s
        while nbytes < self.max_group_bytes:
            try:
                item = self._q.get_nowait()
            except queue.Empty:
                remaining = deadline - self.clock()
                if self.flush_when_queue_empty or remaining <= 0:
                    break
                try:
                    item = self._q.get(timeout=remaining)
                except queue.Empty:
                    break
            if item is _STOP:
                stop = True
                break
            group.append(item)
            nbytes += item.nbytes
        return group, stop

    def _run(self) -> None:
        """Writer stage: group, frame, pwritev; hand the group to the sync stage."""
        stop = False
        while not stop:
            item = self._q.get()
            if item is _STOP:
                break
            group, stop = self._collect(item)
            self._write_group(group)
        self._sync_barrier()
        self._sync_q.put(_STOP)
        self._syncer.join()
        self._finish_file()

    def _fail(self, group: list[Submission], why: str) -> None:
        for sub in group:
            if not sub.future.done():
                sub.future.set_exception(errors.BookieIOError(why))

    def _write_group(self, group: list[Submission]) -> None:
        if self._failed is not None:
            self._fail(group, f"journal failed: {self._failed}")
            return
        pieces: list[bytes] = []
        for sub in group:
            for rtype, body in sub.records:
                pieces.extend(frame(rtype, body))
        if _FAULT_ACK_BEFORE_FSYNC:
            pieces = []
        try:
            total = self._write_all(pieces)
        except BaseException as exc:  # noqa: BLE001 - poison and fail the group
            self._poison(exc)
            self._fail(group, f"journal write failed: {exc}")
            return
        self._offset += total
        self._sync_q.put((group, Position(self._seq, self._offset), self._fd, total))
        if self._offset >= self.max_file_bytes:
            self._roll()
        elif self.prealloc_bytes:
            self._preallocate()

    def _poison(self, exc: BaseException) -> None:
        if self._failed is None:
            self._failed = exc
            log.error("event=journal_failed error=%r", exc)
            if self._on_failure is not None:
                try:
                    self._on_failure(exc)
                except Exception:  # noqa: BLE001 - the journal stays failed regardless
                    log.exception("event=journal_failure_hook_error")

    def _sync_barrier(self) -> None:
        """Wait until the sync stage has finished everything handed to it."""
        done = threading.Event()
        self._sync_q.put(done)
        done.wait()

    def _sync_run(self) -> None:
        """Sync stage (BookKeeper's force-write thread): ONE fdatasync covers
        every group written so far, then groups are applied and answered in
        order.  Writing the next groups overlaps with this fdatasync."""
        while True:
            items = [self._sync_q.get()]
            while True:
                try:
                    items.append(self._sync_q.get_nowait())
                except queue.Empty:
                    break
            groups = []
            for item in items + [None]:
                if isinstance(item, tuple):
                    groups.append(item)
                    continue
                if groups:
                    self._sync_groups(groups)
                    groups = []
                if item is _STOP:
                    return
                if isinstance(item, threading.Event):
                    item.set()

    def _sync_groups(self, groups: list) -> None:
        subs = [sub for g in groups for sub in g[0]]
        if self._failed is None:
            try:
                t0 = time.perf_counter()
                if self.sync_data:
                    self._fsync(groups[-1][2])
                if self.metrics is not None:
                    self.metrics.journal_fsync(time.perf_counter() - t0, len(subs),
                                               sum(g[3] for g in groups))
                for group, position, _, _ in groups:
                    self.durable_position = position
                    self._on_durable(group, position)
                    for sub in group:
                        if not sub.future.done():
                            sub.future.set_result(position)
                return
            except BaseException as exc:  # noqa: BLE001 - poison and fail
                self._poison(exc)
        self._fail(subs, f"journal failed: {self._failed}")

    def _write_all(self, pieces: list[bytes]) -> int:
        offset = self._offset
        for i in range(0, len(pieces), 512):  # stay under IOV_MAX
            chunk = pieces[i:i + 512]
            size = sum(len(p) for p in chunk)
            written = os.pwritev(self._fd, chunk, offset)
            if written < size:  # rare short write: finish with plain pwrite
                rest = memoryview(b"".join(chunk))
                while written < size:
                    n = os.pwrite(self._fd, rest[written:], offset + written)
                    if n <= 0:
                        raise OSError("short write to journal")
                    written += n
            offset += size
        return offset - self._offset

    def _finish_file(self) -> None:
        if self._fd >= 0:
            try:
                os.ftruncate(self._fd, self._offset)
                os.fsync(self._fd)
            finally:
                os.close(self._fd)
                self._fd = -1

    def _roll(self) -> None:
        self._sync_barrier()        # the sync stage must be done with the old fd
        self._finish_file()
        self._open_file(self._seq + 1)

    def delete_before(self, position: Position) -> int:
        """Delete journal files whose records all lie before ``position``."""
        removed = 0
        for seq in list_files(self.dir):
            if seq < position.seq and seq != self._seq:
                os.unlink(os.path.join(self.dir, file_name(seq)))
                removed += 1
        return removed

    def close(self) -> None:
        with self._submit_lock:
            if self._closed:
                return
            self._closed = True
        if self._thread is not None:
            self._q.put(_STOP)
            self._thread.join()
        # fail anything that raced in after STOP
        while True:
            try:
                item = self._q.get_nowait()
            except queue.Empty:
                break
            if item is not _STOP:
                item.future.set_exception(errors.BookieIOError("journal closed"))
