"""Pooled memory for a bookie's big transfers: direct I/O on 2 MiB pages where the
kernel has them, and read answers on pages used again from answer to answer.

Theory of operation
-------------------
Why.  A direct read or write moves the bytes between the device and the
process's own pages.  The block layer makes one request of at most
``max_segments`` physically contiguous runs of those pages
(``/sys/block/<dev>/queue/max_segments``, 254 on a virtio disk), so a
buffer of scattered 4 KiB pages goes out as requests of about 1 MiB or
less, whatever the size of the ``pread``.  A transparent huge page is
2 MiB of contiguous memory: a buffer of them goes out as requests of
``max_sectors_kb`` (4 MiB).  Where the device costs about the same per
request whatever its size (a virtual disk's host), that is the
difference between the disk's bandwidth and a fraction of it: on the
machine of docs/performance.md a 4 MiB ``O_DIRECT`` read into 4 KiB pages
goes out as eight 512 KiB requests at 1.2 GB/s, into a huge page as one
4 MiB request at 3.5 GB/s.

What.
  * ``huge_mapping(nbytes)``: a private anonymous mapping advised
    ``MADV_HUGEPAGE`` (``transparent_hugepage/enabled`` is ``madvise`` on
    most distributions, so without the advice it gets 4 KiB pages), and a
    view of ``nbytes`` of it that starts on a 2 MiB boundary.  Python's
    ``mmap.mmap(-1, n)`` is a *shared* anonymous mapping, which is shmem
    and takes no transparent huge pages.  Where the kernel has none to give
    (THP ``never``, no ``madvise``), the view is still page-aligned, which
    is all ``O_DIRECT`` needs.
  * ``BufferPool``: reused buffers whose bytes live on as Arrow data.
    ``take(nbytes)`` returns a view to fill and the ``pa.Buffer`` over the
    same memory; the mapping goes back to the pool when the last Arrow
    object over it is freed, so a steady stream of reads reuses the same
    pages (faulted once) instead of faulting fresh ones per read.  At most
    ``max_idle_bytes`` wait in the pool; past that the ones returned
    longest ago are unmapped, whatever their size, so the pool keeps the
    sizes in use (measured: with the newest refused instead, the 1 MiB
    batches of figure 3 filled the pool and every 4 MiB batch of the Spark
    write after them was mapped afresh and unmapped again).  Four per
    process:

    - ``READ_BUFFERS``, on huge pages: the store's whole-batch direct reads.
    - ``ANSWER_BUFFERS``, on 4 KiB pages: read answers this bookie joins
      from several stored batches to send (``EntryStore`` reads), the
      small answers its pulls receive from a peer (serving/peer_lane.py) and
      the lane's frames of 1 MiB or more that are not received into a
      journal record (serving/lane_server.py).  A
      pull's answer lives until it is journaled; Arrow's jemalloc pool
      gives such multi-MiB blocks fresh pages each time (the kernel
      zero-fills every page: a fifth of a pull's source's CPU), and in
      huge pages a fresh block costs more still wherever the kernel must
      compact memory to find them (measured: the pull 10% slower).  Its
      idle cap covers the answers of four pulls in flight.
    - ``STAGED_RECORDS``, on huge pages: big journal records framed ahead
      for a direct write (journal/direct_write.py ``RecordSpace``), each
      back in the pool once written: a pull's answers are received into
      them, so a pull's reads in flight and its adds outstanding hold
      them; the same idle cap as the answers'.
    - ``LANE_BATCHES``, on huge pages: the add lane's batches of 1 MiB or
      more, received where the journal writes them from (``RecordSpace``,
      serving/lane_server.py); the write cache holds each until the
      checkpoint, so they have a pool of their own: in ``STAGED_RECORDS``
      they took the pages a pull's records reuse (measured: figure 8's
      pull after batched writes 742 / 744 -> 649 / 613 MB/s, its bookies
      1.83 / 1.92 -> 2.17 / 2.26 CPU-s per GB).

Reserved at start.  A mapping's pages cost the most the first time they
are touched: the kernel zero-fills each one, and on a virtual machine
whose host took the memory back (a balloon) the host must back it again,
about 2 ms per MiB.  A pull's source needs a read buffer and a joined
answer per connection it serves, so the first pulls after a start map and
fault in several of each; those pages are on the pull's critical path (a
source answers one connection's reads one after the other).  A pull's
replacement receives its answers into journal records
(``STAGED_RECORDS``), one per answer in flight, and faults those in
the same way during its first pulls.  ``reserve_read_buffers`` maps and
touches ``read_buffers_at_start_mb`` of read buffers and
``pull_buffers_at_start_mb`` of records on a thread of its own when the
bookie starts (``BufferPool.reserve``), and ``take`` hands a reserved
buffer to a request down to half its size.
"""
from __future__ import annotations

import ctypes
import mmap
import threading
from collections import OrderedDict, defaultdict
from typing import Optional

import pyarrow as pa

HUGE_PAGE = 2 << 20


def huge_mapping(nbytes: int, huge: bool = True) -> tuple[mmap.mmap, memoryview]:
    """(the mapping, a view of ``nbytes`` of it starting on a 2 MiB
    boundary); the caller keeps the mapping as long as it uses the view.
    ``huge`` false: advised ``MADV_NOHUGEPAGE`` (4 KiB pages even where THP
    is ``always``)."""
    raw = mmap.mmap(-1, nbytes + HUGE_PAGE, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    try:
        raw.madvise(mmap.MADV_HUGEPAGE if huge else mmap.MADV_NOHUGEPAGE)
    except (AttributeError, OSError):      # no THP in this kernel: 4 KiB pages
        pass
    lead = -ctypes.addressof(ctypes.c_char.from_buffer(raw)) % HUGE_PAGE
    return raw, memoryview(raw)[lead:lead + nbytes]


def _size_class(nbytes: int) -> int:
    """The mapping size that holds ``nbytes``: whole huge pages."""
    return -(-nbytes // HUGE_PAGE) * HUGE_PAGE


class _Lease:
    """Held by the Arrow buffer over a pooled mapping (its ``base``): freed
    with the last Arrow object over it, which puts the mapping back."""

    __slots__ = ("pool", "size", "raw", "view")

    def __init__(self, pool: BufferPool, size: int, raw: mmap.mmap, view: memoryview):
        self.pool, self.size, self.raw, self.view = pool, size, raw, view

    def __del__(self) -> None:
        self.pool._put_back(self.size, self.raw, self.view)


class BufferPool:
    """Reused buffers, on huge pages unless ``huge`` is false (module
    docstring)."""

    def __init__(self, max_idle_bytes: int = 64 << 20, huge: bool = True):
        self.max_idle_bytes = max_idle_bytes
        self.huge = huge
        # size class -> its idle mappings, most recently returned last; and
        # every idle mapping in the order returned, for eviction
        self._idle: defaultdict[int, list[_Idle]] = defaultdict(list)
        self._returned: OrderedDict[int, _Idle] = OrderedDict()
        self._idle_bytes = 0
        # re-entrant: a lease freed by the collector inside ``take`` puts back
        self._lock = threading.RLock()

    def take(self, nbytes: int) -> tuple[memoryview, pa.Buffer]:
        """(a view of ``nbytes`` to read into, the Arrow buffer over it):
        an idle mapping of its size class, else the smallest idle one of
        at most twice that (a reserved one, ``reserve``), else a new one."""
        size = _size_class(nbytes)
        with self._lock:
            idle = self._idle.get(size)
            if not idle:
                larger = [s for s, held in self._idle.items() if held and size < s <= 2 * size]
                if larger:
                    size = min(larger)
                    idle = self._idle[size]
            got = idle.pop() if idle else None
            if got is not None:
                del self._returned[id(got)]
                self._idle_bytes -= size
        raw, view = (got.raw, got.view) if got is not None else huge_mapping(size, self.huge)
        lease = _Lease(self, size, raw, view)
        buf = pa.foreign_buffer(ctypes.addressof(ctypes.c_char.from_buffer(view)), nbytes,
                                base=lease)
        return view[:nbytes], buf

    def idle_bytes(self) -> int:
        return self._idle_bytes

    def reserve(self, nbytes: int, count: int) -> None:
        """Map ``count`` buffers of ``nbytes`` and touch every page of them,
        idle in the pool (within its cap): the first transfers that need
        them find pages the process already has (module docstring,
        "Reserved at start").  The pages are written with the GIL let go."""
        size = _size_class(nbytes)
        for _ in range(min(count, self.max_idle_bytes // size)):
            raw, view = huge_mapping(size, self.huge)
            # ctypes.memset is a foreign function (CFUNCTYPE): called with the
            # GIL let go, so a bookie serves while its reserve is touched
            ctypes.memset(ctypes.addressof(ctypes.c_char.from_buffer(view)), 0, size)
            self._put_back(size, raw, view)

    def _put_back(self, size: int, raw: mmap.mmap, view: memoryview) -> None:
        """Keep the mapping for the next ``take`` of its size; past the cap,
        unmap the mappings returned longest ago, whatever their size: the
        pool follows the sizes in use (a bookie's batched adds of 1 MiB
        then a Spark job's of 16 MiB), where refusing the newest would keep
        a size no longer asked for and map every new one afresh."""
        if size > self.max_idle_bytes:
            _unmap(raw, view)
            return
        evicted = []
        with self._lock:
            entry = _Idle(size, raw, view)
            self._idle[size].append(entry)
            self._returned[id(entry)] = entry
            self._idle_bytes += size
            while self._idle_bytes > self.max_idle_bytes:
                _key, old = self._returned.popitem(last=False)
                self._idle[old.size].remove(old)
                self._idle_bytes -= old.size
                evicted.append(old)
        for old in evicted:
            _unmap(old.raw, old.view)


class _Idle:
    __slots__ = ("size", "raw", "view")

    def __init__(self, size: int, raw: mmap.mmap, view: memoryview) -> None:
        self.size, self.raw, self.view = size, raw, view


def _unmap(raw: mmap.mmap, view: memoryview) -> None:
    try:
        view.release()
        raw.close()
    except BufferError:     # a reader still holds a view of it: unmapped when it lets go
        pass


# one of each per process (module docstring)
READ_BUFFERS = BufferPool()
ANSWER_BUFFERS = BufferPool(256 << 20, huge=False)
STAGED_RECORDS = BufferPool(256 << 20)
LANE_BATCHES = BufferPool(256 << 20)

# the size of a reserved read buffer: a pull asks for at most this much per
# read (serving/pull.py COPY_BATCH_BYTES), so one stored span and one joined
# answer of it each fit in one
RESERVED_READ_BYTES = 8 << 20


def reserve_read_buffers(read_mb: int, pull_mb: int = 0) -> Optional[threading.Thread]:
    """Reserve ``read_mb`` MiB for a bookie's big reads, half for the
    store's direct reads (``READ_BUFFERS``), half for the answers joined
    from them (``ANSWER_BUFFERS``) (``read_buffers_at_start_mb``), and
    ``pull_mb`` MiB for the answers its pulls receive (``STAGED_RECORDS``,
    ``pull_buffers_at_start_mb``), on a daemon thread so the bookie serves
    meanwhile; the thread, None when there is nothing to reserve."""
    count = (read_mb << 20) // 2 // RESERVED_READ_BYTES
    pull_count = (pull_mb << 20) // RESERVED_READ_BYTES
    if count <= 0 and pull_count <= 0:
        return None

    def fill() -> None:
        for pool in (READ_BUFFERS, ANSWER_BUFFERS):
            pool.reserve(RESERVED_READ_BYTES, count)
        STAGED_RECORDS.reserve(RESERVED_READ_BYTES, pull_count)

    thread = threading.Thread(target=fill, name="bookie-read-buffers", daemon=True)
    thread.start()
    return thread
