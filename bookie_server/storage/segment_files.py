"""The entry store's files: segment files it appends stored batches to, and
journal files it reads big batches from in place (journal segments, see
``entry_store``), with their sizes and live bytes, the open memory maps and
the cache of decoded batches.

Theory of operation
-------------------
A segment id names one file: ``segments/NNNNNNNN.seg``, or, for ids at or
above ``JOURNAL_SEGMENT_BASE``, the journal file ``id - JOURNAL_SEGMENT_BASE``.
``size`` is each file's length as far as the store knows it (the extent of
the batches it indexes in a journal file); ``live`` is the bytes in it that
an indexed batch still uses (the entry store and compaction keep it).
Appends go to the ``current`` segment, opened by ``open_for_append``, which
moves on to a fresh file when there is none or it has reached
``segment_max_bytes``; ``roll()`` forces that (a sparse current segment
being compacted, or a restart: a file of unknown tail is never appended to).
An appender (``SegmentAppend``) syncs what it wrote every
``sync_every_bytes``, not only when closed: the journal shares the disk, and
its fdatasync waits for whatever the device holds queued (beside one fsync
after 128 MiB of segment writes, a 1 KiB write + fdatasync loop waited up
to 76-82 ms, beside 1 MiB steps up to 24-30 ms; docs/performance.md, (4)).
A stored batch is read through a memory map (``map``) and decoded once into
a small LRU cache (``batch_of``).  A read that takes every stored row of a
span (``batch_whole``: a pull's or a replicas check's sparse read, each
stored batch read once) reads it instead with one ``pread`` around the page
cache (``O_DIRECT``, ``read_direct``) into a buffer of its own, not cached:
most stored bytes are not in the page cache (the journal writes big groups
with ``O_DIRECT`` and ``page_cache`` drops the rest), and faulting them in
through the map costs the kernel a page-cache page per 4 KiB and user space
a fault per page touched (measured: 1.9-2.1 CPU-s per GB through the map,
0.6 with a buffered ``pread``, 0.05 with ``O_DIRECT``; docs/performance.md, (8)).
Stored batches that lie one after the other in a file are read together
(``batches_whole``), into buffers on huge pages from 2 MiB up
(``bookie_server/direct_buffers.py``), so the device gets requests of 4 MiB.
Where the file system refuses ``O_DIRECT`` (tmpfs) or its alignment, those
reads are buffered ``pread``s.

Ordering obligations:
  * Callers hold the entry store's lock while they read or change ``size``,
    ``live`` or ``current``, except the flush and compaction appends, which
    the bookie never runs at once (its checkpoint lock).
  * ``io_lock`` guards the memory maps and the batch cache; it is taken
    after the entry store's lock, never before.
  * ``fsync_dir`` makes new files' names durable before any index that
    references them is persisted.
  * A direct read is coherent with the page cache: Linux writes a range's
    dirty pages back before reading it around them, and only durable,
    indexed bytes are ever asked for (the rest of the aligned blocks read
    around them is ignored).
"""
from __future__ import annotations

import errno
import logging
import os
import threading
from collections import OrderedDict
from typing import TYPE_CHECKING, Any, Callable, cast

import pyarrow as pa

from bookie_server.journal.journal_format import file_name as journal_file_name
from bookie_server.direct_buffers import HUGE_PAGE, READ_BUFFERS
from pybk_spark import errors
from pybk_spark.wire.arrow_memory import wire_pool

if TYPE_CHECKING:
    from bookie_server.storage.write_cache import Ref

log = logging.getLogger("bookie.store")

JOURNAL_SEGMENT_BASE = 1 << 22     # segment ids >= this are journal files (seq = id - base)
# O_DIRECT's alignment of offset, length and buffer address: the logical
# block of every common device (the journal's direct writes use the same)
DIRECT_ALIGN = 4096
# from one huge page up, a direct read goes into a pooled huge-page buffer
# (direct_buffers.py: requests of 4 MiB, not ~1 MiB); below it, the
# wire pool (a small read would pin 2 MiB)
HUGE_READ_MIN = HUGE_PAGE
# stored batches read together by ``batches_whole``: at most this far apart
# (the journal's frame headers and PADs between two adds' batches) and this
# long in all (a pull's answer is at most 8 MiB)
COALESCE_GAP = 64 << 10
COALESCE_MAX = 16 << 20


def journal_segment(seq: int) -> int:
    return JOURNAL_SEGMENT_BASE + seq


def is_journal_segment(seg: int) -> bool:
    return seg >= JOURNAL_SEGMENT_BASE


class SegmentAppend:
    """The current segment opened for appends (module docstring): ``write``
    syncs each time ``step`` more bytes have been written (0: never),
    ``sync`` syncs what is left, ``close`` closes without a sync."""

    def __init__(self, path: str, fsync: Callable[[int], None], step: int):
        self._fh = open(path, "ab")
        self._fh.seek(0, os.SEEK_END)
        self._fsync = fsync
        self._step = step
        self._unsynced = 0

    def tell(self) -> int:
        return self._fh.tell()

    def write(self, data: Any) -> None:
        step = self._step
        if not step:
            self._fh.write(data)
            return
        view = memoryview(data).cast("B")
        at = 0
        while at < len(view):
            take = min(len(view) - at, step - self._unsynced)
            self._fh.write(view[at:at + take])
            at += take
            self._unsynced += take
            if self._unsynced >= step:
                self.sync()

    def sync(self) -> None:
        self._fh.flush()
        self._fsync(self._fh.fileno())
        self._unsynced = 0

    def close(self) -> None:
        self._fh.close()


class SegmentFiles:
    def __init__(self, directory: str, *, segment_max_bytes: int, batch_cache_size: int,
                 mmap_cache_size: int, journal_dir: str | None,
                 fsync: Callable[[int], None], sync_every_bytes: int = 0):
        self.fsync = fsync
        self.sync_every_bytes = sync_every_bytes      # 0: an appender syncs when told only
        self.journal_dir = journal_dir
        self.seg_dir = os.path.join(directory, "segments")
        os.makedirs(self.seg_dir, exist_ok=True)
        self.segment_max_bytes = segment_max_bytes
        self.size: dict[int, int] = {}         # segment -> bytes
        self.live: dict[int, int] = {}         # segment -> live bytes
        self.current = -1                      # the segment appends go to (-1: a fresh one)
        self.io_lock = threading.Lock()
        self._batch_cache: "OrderedDict[int, pa.RecordBatch]" = OrderedDict()
        self._batch_cache_size = batch_cache_size
        self._mmaps: "OrderedDict[int, pa.MemoryMappedFile]" = OrderedDict()
        self._mmap_cache_size = mmap_cache_size
        self.direct = hasattr(os, "O_DIRECT")      # False once the file system refuses it

    def path(self, seg: int) -> str:
        if is_journal_segment(seg):
            if self.journal_dir is None:
                raise ValueError(f"segment {seg} is a journal file, and there is no journal dir")
            return os.path.join(self.journal_dir, journal_file_name(seg - JOURNAL_SEGMENT_BASE))
        return os.path.join(self.seg_dir, f"{seg:08d}.seg")

    def map(self, seg: int, needed: int) -> pa.MemoryMappedFile:
        mm = self._mmaps.get(seg)
        if mm is None or mm.size() < needed:
            mm = pa.memory_map(self.path(seg), "r")
            self._mmaps[seg] = mm
            if len(self._mmaps) > self._mmap_cache_size:
                self._mmaps.popitem(last=False)
        self._mmaps.move_to_end(seg)
        return mm

    def read_bytes(self, seg: int, offset: int, length: int) -> pa.Buffer:
        """``length`` stored bytes at ``offset`` of segment ``seg``."""
        return self.map(seg, offset + length).read_at(length, offset)

    # -- reads of stored batches -----------------------------------------------------
    def will_need(self, refs: list[Ref], budget: int) -> None:
        """Ask the kernel to start reading the stored batches of this read
        that are not in memory, all at once (posix_fadvise WILLNEED), up to
        the read's byte budget: a read from disk then waits for one round of
        I/O instead of faulting its batches in one after the other.  Measured
        on a catch-up read whose older part had left the page cache: +20-25%.
        Only advice."""
        with self.io_lock:
            for ref in refs:
                if ref.in_memory or ref.segment < 0:
                    continue
                if budget <= 0:
                    return
                budget -= ref.length
                if ((ref.segment << 40) | ref.offset) in self._batch_cache:
                    continue
                try:
                    mm = self.map(ref.segment, ref.offset + ref.length)
                    os.posix_fadvise(mm.fileno(), ref.offset, ref.length, os.POSIX_FADV_WILLNEED)
                except (OSError, ValueError):
                    return

    def batch_of(self, ref: "Ref") -> pa.RecordBatch:
        """A stored batch, from memory, the decoded-batch cache or its file
        (then cached); ``ValueError`` for a write-cache run (``_stored_key``)."""
        batch = ref.batch
        if batch is not None:
            return batch
        key = _stored_key(ref)
        with self.io_lock:
            cached = self._batch_cache.get(key)
            if cached is not None:
                self._batch_cache.move_to_end(key)
                return cached
            buf = self.map(ref.segment, ref.offset + ref.length).read_at(ref.length, ref.offset)
            batch = pa.ipc.open_stream(buf).read_next_batch()
            self._batch_cache[key] = batch
            if len(self._batch_cache) > self._batch_cache_size:
                self._batch_cache.popitem(last=False)
            return batch

    def batch_whole(self, ref: "Ref") -> pa.RecordBatch:
        """A stored batch for a read that takes its rows once (module
        docstring): from memory or the decoded-batch cache, else read with
        ``read_direct`` and not cached; ``ValueError`` for a write-cache run
        (``_stored_key``)."""
        return self.batches_whole([ref])[0]

    def batches_whole(self, refs: "list[Ref]") -> "list[pa.RecordBatch]":
        """``batch_whole`` of each of ``refs``, where the stored ones that
        lie one after the other in a file (at most ``COALESCE_GAP`` bytes
        apart: the journal's frame headers and PADs between them) are read
        with one ``read_direct`` of up to ``COALESCE_MAX`` bytes: a huge-page
        buffer then goes out as requests of 4 MiB, not one per batch."""
        out: "list[pa.RecordBatch | None]" = [None] * len(refs)
        todo = []
        for i, ref in enumerate(refs):
            if ref.batch is not None:
                out[i] = ref.batch
                continue
            key = _stored_key(ref)
            with self.io_lock:
                cached = self._batch_cache.get(key)
            if cached is not None:
                out[i] = cached
            else:
                todo.append(i)
        todo.sort(key=lambda i: (refs[i].segment, refs[i].offset))
        k = 0
        while k < len(todo):
            first = refs[todo[k]]
            end, j = first.offset + first.length, k + 1
            while j < len(todo):
                nxt = refs[todo[j]]
                if (nxt.segment != first.segment or nxt.offset < end
                        or nxt.offset - end > COALESCE_GAP
                        or nxt.offset + nxt.length - first.offset > COALESCE_MAX):
                    break
                end, j = nxt.offset + nxt.length, j + 1
            span = self.read_direct(first.segment, first.offset, end - first.offset)
            for i in todo[k:j]:
                ref = refs[i]
                out[i] = pa.ipc.open_stream(span.slice(ref.offset - first.offset, ref.length)
                                            ).read_next_batch()
            k = j
        return cast("list[pa.RecordBatch]", out)

    def read_direct(self, seg: int, offset: int, length: int) -> pa.Buffer:
        """``length`` stored bytes at ``offset`` of segment ``seg``, read
        around the page cache: from ``HUGE_READ_MIN`` up into a pooled
        buffer on huge pages (``direct_buffers.READ_BUFFERS``), below it
        into one of the wire pool (whose freed blocks stay mapped: no page
        is faulted in twice)."""
        start = offset - offset % DIRECT_ALIGN
        span = -(-(offset + length - start) // DIRECT_ALIGN) * DIRECT_ALIGN
        if span >= HUGE_READ_MIN:
            view, buf = READ_BUFFERS.take(span)
            lead = 0
        else:
            buf = pa.allocate_buffer(span + DIRECT_ALIGN, memory_pool=wire_pool())
            lead = -buf.address % DIRECT_ALIGN
            view = memoryview(buf)[lead:lead + span]
        got = self._pread(self.path(seg), view, start) if self.direct else -1
        if got < 0:
            fd = os.open(self.path(seg), os.O_RDONLY)
            try:
                got = os.preadv(fd, [view], start)
            finally:
                os.close(fd)
        if got < offset + length - start:
            raise errors.BookieIOError(f"segment {seg} ends before the {length} stored bytes "
                                       f"at {offset} (read {got} bytes at {start})")
        return buf.slice(lead + offset - start, length)

    def _pread(self, path: str, view: memoryview, start: int) -> int:
        """One O_DIRECT read into ``view``; -1 (and no more direct reads)
        where the file system refuses it."""
        try:
            fd = os.open(path, os.O_RDONLY | os.O_DIRECT)
        except OSError as exc:
            if exc.errno != errno.EINVAL:
                raise
            return self._refused(exc)
        try:
            return os.preadv(fd, [view], start)
        except OSError as exc:
            if exc.errno != errno.EINVAL:
                raise
            return self._refused(exc)
        finally:
            os.close(fd)

    def _refused(self, exc: OSError) -> int:
        if self.direct:
            self.direct = False
            log.info("event=store_direct_read_unavailable error=%r", exc)
        return -1

    def uncache(self, seg: int, offset: int) -> None:
        """Forget the decoded batch stored at (seg, offset) (caller holds ``io_lock``)."""
        self._batch_cache.pop((seg << 40) | offset, None)

    # -- appends ----------------------------------------------------------------------
    def open_for_append(self) -> SegmentAppend:
        if self.current < 0 or self.size.get(self.current, 0) >= self.segment_max_bytes:
            self.current = max((s for s in self.size if not is_journal_segment(s)),
                               default=0) + 1
            self.size[self.current] = 0
            self.live.setdefault(self.current, 0)
        fh = SegmentAppend(self.path(self.current), self.fsync, self.sync_every_bytes)
        self.size[self.current] = fh.tell()
        return fh

    def roll(self) -> None:
        """The next append starts a fresh segment."""
        self.current = -1

    def fsync_dir(self) -> None:
        """Make new segment files' directory entries durable (before any index
        that references them is persisted)."""
        dfd = os.open(self.seg_dir, os.O_RDONLY)
        try:
            self.fsync(dfd)
        finally:
            os.close(dfd)

    # -- removal ------------------------------------------------------------------------
    def forget(self, segs: list[int]) -> None:
        """No longer know these files (caller holds ``io_lock``)."""
        for seg in segs:
            self._mmaps.pop(seg, None)
            self.live.pop(seg, None)
            self.size.pop(seg, None)

    def delete(self, segs: list[int]) -> None:
        """Forget and unlink these segment files (caller holds ``io_lock``)."""
        for s in segs:
            self._mmaps.pop(s, None)
            self.live.pop(s, None)
            self.size.pop(s, None)
            try:
                os.unlink(self.path(s))
            except FileNotFoundError:
                pass
        self._batch_cache.clear()


def _stored_key(ref: "Ref") -> int:
    """The decoded-batch cache key of the batch ``ref`` names in a file.
    A write-cache run of lone adds (``entries`` set) is records, not a
    stored batch, and a memory ref with no segment names no file: reading
    either would decode the wrong bytes or open segment -1, so it is
    refused, naming the ref (its readers take ``Ref.records`` instead)."""
    if ref.entries is not None or ref.segment < 0:
        what = (f"a write-cache run of {len(ref.entries)} lone add(s)" if ref.entries is not None
                else "a memory ref with no batch and no segment")
        raise ValueError(f"segment_files: ref of ledger {ref.ledger} (segment {ref.segment}, "
                         f"offset {ref.offset}) is {what}, not a stored batch; read a run "
                         "through Ref.records")
    return (ref.segment << 40) | ref.offset
