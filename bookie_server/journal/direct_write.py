"""Large journal groups written with O_DIRECT, around the page cache.

Theory of operation
-------------------
Why.  A buffered write copies every byte into a page-cache page.  Where
those pages are new memory to the kernel (a VM whose balloon hands freed
memory back to its host, as on the machine of docs/performance.md; a host
under memory pressure), that copy costs more CPU than everything else a
journaled byte costs: 70% of a re-replicating bookie's samples, 6-8 s of
kernel CPU per GB.  A direct write goes from the process's buffer to the
device with no copy in the kernel, so the bookie's CPU per byte no longer
depends on the page cache's state (measured on that machine: 0.1 against
0.3-8 s of kernel CPU per GB, at 1.2-1.4 GB/s).  BookKeeper's
``DirectEntryLogger`` writes its entry logs the same way.

What.  ``Journal`` hands a group of at least ``min_bytes`` to
``DirectWriter.write_group`` (the journal's own ``write_all`` and
``preallocate`` are passed in, so its test seams see every write):
its frames are copied into one staging buffer (an anonymous mapping on
huge pages, ``direct_buffers.huge_mapping``: the device gets
requests of 4 MiB, not ~1 MiB; kept and reused, so its pages are touched
once per process) and
written with one ``pwritev`` on a second descriptor of the journal file,
opened with ``O_DIRECT``.  ``O_DIRECT`` needs the file offset, the buffer
address and the length aligned to the device's logical block; ``ALIGN``
(4096) covers every common device.

  * The offset: when the journal's end is not aligned, a PAD record
    (``RecordType.PAD``, written buffered through the journal's own
    descriptor) fills up to the next aligned offset.  A PAD frame is at least
    ``PAD_MIN`` bytes, so the gap may grow by one ``ALIGN``.  Bytes already
    written (and maybe acknowledged) are never rewritten.
  * The length: a PAD record after the group's frames fills it up to the next
    aligned end, so after a direct group the journal's end is aligned again.

A big record can be staged ahead, on its submitter's thread
(``stage_record``, ``Journal.stage_ahead``): framed (its CRC taken there),
copied into a pooled buffer on huge pages and closed with its own PAD, so
its frames are a whole number of ``ALIGN`` blocks that start on a page
boundary.  A group made only of such records is written from their
buffers as they are, one ``pwritev`` of their views, with no staging copy
and no CRC on the writer thread: the writer is the one thread every pulled
or batched byte passes through, and the device waits while it hashes and
copies (measured on a pull, 4 at once: 0.4 ms of copy and about 0.5 ms of
CRC per 5 MiB group beside a 4 ms write; docs/performance.md, (8)).  In a
group with any other record the staged frames are copied like the rest;
their PADs stay valid frames either way.  A record's place can be taken
before its body exists (``RecordSpace``): a pull receives a peer's answer
there, as the add lane does a large batch (``receive_into_space``), and
the record is framed around it where it lies, with no copy at all
(measured, figure 8 in four interleaved pairs: 890-945 -> 973-1,078
MB/s, the bookies 1.20-1.47 -> 1.08-1.30 CPU-s per GB).

Ordering obligations:
  * Durability is unchanged: the group is acknowledged only after the
    journal's ``fdatasync`` (one per inode, whichever descriptor), which also
    commits the allocation of the blocks written.
  * Replay reads PAD records like any other frame and applies nothing.
  * Readers map and read the same file (``segment_files``, the scrubber);
    Linux writes back and invalidates the page cache around a direct write,
    and nothing reads past the journal's durable end, so no reader sees stale
    bytes of a directly written range.
  * Where the file system refuses ``O_DIRECT`` (tmpfs, some FUSE mounts),
    ``open`` returns -1 and the journal writes every group buffered;
    ``event=journal_direct_unavailable`` is logged once per journal.  Where
    it opens the file but refuses a write with ``EINVAL`` (it needs a
    larger alignment than ``ALIGN``), nothing was written: the journal
    writes the same staged bytes buffered at the same offsets, logs
    ``event=journal_direct_refused`` and stays buffered (``refuse``).  Any
    other write error poisons the journal, as a buffered one does.
"""
from __future__ import annotations

import errno
import logging
import mmap
import os
from typing import Any, Callable, Optional, TypeVar

import numpy as np
import pyarrow as pa

from bookie_server.journal.journal_crc import Body, crc_from_body_crc, crc_of
from bookie_server.journal.journal_format import HEADER, MIN_BODY, RecordType, frame
from bookie_server.direct_buffers import HUGE_PAGE, STAGED_RECORDS, BufferPool, huge_mapping
from pybk_spark.wire.frame_socket import fill_by
from pybk_spark.wire.framing import trailing_payload

log = logging.getLogger("bookie.journal")

ALIGN = 4096
PAD_MIN = HEADER.size + MIN_BODY        # the smallest frame replay accepts as valid
_STAGING_STEP = HUGE_PAGE


def pad_before(offset: int) -> int:
    """Bytes of PAD needed at ``offset`` to reach an aligned offset (0 if
    already aligned)."""
    gap = -offset % ALIGN
    return gap + ALIGN if 0 < gap < PAD_MIN else gap


def pad_frame(nbytes: int) -> list[Body]:
    """A PAD record of exactly ``nbytes`` (>= PAD_MIN) bytes, framed."""
    return frame(RecordType.PAD, bytes(nbytes - HEADER.size))


class StagedRecord:
    """One record's frames staged ahead (``stage_record``): ``view`` holds
    its header, its body and a closing PAD, a multiple of ``ALIGN`` bytes
    from a page boundary; the pooled buffer goes back to its pool when
    this is let go."""
    __slots__ = ("view", "owner")

    def __init__(self, view: memoryview, owner: object) -> None:
        self.view, self.owner = view, owner


class RecordSpace:
    """Pooled direct-write memory for one record whose body is put in place
    before it is framed: the body at ``HEADER.size`` from a page boundary
    and room for the closing PAD after it, so ``staged`` frames it where it
    lies.  A pull receives a peer's answer straight into one
    (serving/peer_lane.py), and the add lane a large batch
    (serving/lane_server.py): the record is then written with no copy at
    all, where ``stage_record`` copies its body in.  From ``pool``:
    ``STAGED_RECORDS``, or for the lane's batches, which the write cache
    holds until the checkpoint, ``LANE_BATCHES``."""
    __slots__ = ("view", "buffer", "body_len")

    def __init__(self, body_len: int, pool: BufferPool = STAGED_RECORDS) -> None:
        size = HEADER.size + body_len
        self.view, self.buffer = pool.take(size + pad_before(size))
        self.body_len = body_len

    def body_view(self) -> memoryview:
        """The body's place, writable."""
        return self.view[HEADER.size:HEADER.size + self.body_len]

    def body(self) -> pa.Buffer:
        """The body as an Arrow buffer (it keeps the memory alive)."""
        return self.buffer.slice(HEADER.size, self.body_len)

    def holds(self, body: object) -> bool:
        """Whether ``body`` is this space's body (an Arrow buffer over it)."""
        return (isinstance(body, pa.Buffer) and body.address == self.buffer.address + HEADER.size
                and body.size == self.body_len)

    def staged(self, rtype: int, body_crc: Optional[int] = None) -> StagedRecord:
        """The record framed in place: its header before the body, a PAD
        after it up to the next ``ALIGN`` (module docstring); ``body_crc``:
        the body's crc32c, where the caller has it (``crc_from_body_crc``)."""
        size = HEADER.size + self.body_len
        total = len(self.view)
        crc = (crc_of(rtype, self.body_view()) if body_crc is None
               else crc_from_body_crc(rtype, self.body_len, body_crc))
        HEADER.pack_into(self.view, 0, self.body_len, crc, rtype)
        if total > size:
            self.view[size:total] = b"".join(pad_frame(total - size))
        return StagedRecord(self.view, self.buffer)


_Head = TypeVar("_Head", bytes, memoryview)


def receive_into_space(head: _Head, size: int, readinto: Callable[[memoryview], int],
                       min_bytes: int = 0, pool: BufferPool = STAGED_RECORDS
                       ) -> Optional[tuple[_Head, RecordSpace]]:
    """A frame body of ``size`` bytes, ``head`` its first ones, whose last
    field (its entries: ``framing.trailing_payload``) has its key and
    length within ``head`` and a value of at least ``min_bytes``, received
    with that value in a ``RecordSpace`` from ``pool``: the value's bytes
    in ``head`` copied in, the rest filled by ``readinto`` calls
    (``ValueError`` when the stream ends first).  Returns (the bytes of
    ``head`` before the field's key, the space), or None, with nothing
    read, for any other frame."""
    at = trailing_payload(head, size)
    if at is None or size - at[1] < min_bytes:
        return None
    key_at, value_at = at
    space = RecordSpace(size - value_at, pool)
    into = space.body_view()
    have = len(head) - value_at
    into[:have] = head[value_at:]
    fill_by(readinto, into, have)
    return head[:key_at], space


def stage_record(rtype: int, body: Body, body_crc: Optional[int] = None) -> StagedRecord:
    """``rtype``/``body`` framed into a pooled direct-write buffer, with a
    closing PAD up to the next ``ALIGN`` (module docstring); ``body_crc``:
    the body's crc32c, where the caller has it (``crc_from_body_crc``)."""
    space = RecordSpace(len(body))
    _copy_in(space.view, HEADER.size, body)
    return space.staged(rtype, body_crc)


def _copy_in(dst: memoryview, at: int, piece: Any) -> None:
    """``piece`` (any buffer: bytes, an Arrow buffer, a view) copied into
    ``dst`` from ``at``; numpy lets go of the GIL for the copy, where a
    memoryview assignment holds it."""
    n = len(piece)
    np.frombuffer(dst, dtype=np.uint8)[at:at + n] = np.frombuffer(piece, dtype=np.uint8)


class DirectWriter:
    """The staging buffer and the ``O_DIRECT`` descriptor of one journal file."""

    def __init__(self, min_bytes: int, write_all: Callable[[int, list[Body], int], int],
                 preallocate: Callable[[int], None]):
        self.min_bytes = min_bytes
        self._write_all = write_all          # (fd, pieces, offset) -> bytes written
        self._preallocate = preallocate      # (bytes needed past the journal's end)
        self.fd = -1
        self._mapping: mmap.mmap | None = None
        self._staging: memoryview | None = None      # of ``_mapping``, on a huge page
        self._unavailable_logged = False

    def open(self, path: str) -> None:
        """Open ``path`` (already created) for direct writes; on a file
        system without ``O_DIRECT`` the writer stays off for this file."""
        self.close()
        try:
            self.fd = os.open(path, os.O_WRONLY | getattr(os, "O_DIRECT", 0))
        except OSError as exc:
            if exc.errno not in (errno.EINVAL, errno.EOPNOTSUPP):
                raise
            if not self._unavailable_logged:
                self._unavailable_logged = True
                log.warning("event=journal_direct_unavailable path=%s error=%r "
                            "action=buffered_writes", path, exc)

    def wants(self, nbytes: int) -> bool:
        return self.fd >= 0 and 0 < self.min_bytes <= nbytes

    def write_group(self, pieces: list[Any], offset: int, lead_pad: int, buffered_fd: int,
                    staged: bool = False) -> int:
        """Write a group's frames at the journal's end ``offset``: a PAD of
        ``lead_pad`` (``pad_before(offset)``) up to an aligned offset
        (buffered, through ``buffered_fd``), then the frames and a closing PAD
        from the staging buffer; ``staged``: ``pieces`` are the views of
        staged records (``stage_record``), written as they are.  Returns the
        bytes the journal grew by."""
        start = offset + lead_pad
        view = None if staged else self.stage(pieces, start)
        out = pieces if view is None else [view]
        try:
            self._preallocate(lead_pad + sum(len(p) for p in out))
            if lead_pad:
                self._write_all(buffered_fd, pad_frame(lead_pad), offset)
            try:
                return lead_pad + self._write_all(self.fd, out, start)
            except OSError as exc:
                if exc.errno != errno.EINVAL:
                    raise
                # opened with O_DIRECT, yet this write is refused (an alignment the
                # file system needs beyond ALIGN): the same bytes, buffered, at the
                # same offsets; buffered from here on
                self.refuse(exc)
                return lead_pad + self._write_all(buffered_fd, out, start)
        finally:
            if view is not None:
                view.release()

    def stage(self, pieces: list[Any], offset: int) -> memoryview:
        """Copy ``pieces`` (frames starting at the aligned ``offset``) and a
        closing PAD into the staging buffer; returns the view to write, whose
        length is a multiple of ``ALIGN`` (the caller releases it)."""
        size = sum(len(p) for p in pieces)
        tail = pad_before(offset + size)
        total = size + tail
        buf = self._buffer(total)
        at = 0
        for piece in pieces + (pad_frame(tail) if tail else []):
            _copy_in(buf, at, piece)
            at += len(piece)
        return memoryview(buf)[:total]

    def _buffer(self, nbytes: int) -> memoryview:
        if self._staging is None or len(self._staging) < nbytes:
            self._release_staging()
            self._mapping, self._staging = huge_mapping(-(-nbytes // _STAGING_STEP) * _STAGING_STEP)
        return self._staging

    def _release_staging(self) -> None:
        if self._staging is not None and self._mapping is not None:
            try:
                self._staging.release()
                self._mapping.close()
            except BufferError:        # a view of it still held: unmapped when let go
                pass
        self._mapping = self._staging = None

    def refuse(self, exc: OSError) -> None:
        """A direct write was refused (EINVAL): buffered writes from now on,
        for this file and every later one."""
        log.warning("event=journal_direct_refused error=%r action=buffered_writes", exc)
        self.min_bytes = 0
        self.close()

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1
