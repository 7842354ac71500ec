"""The journal's current file: opening, preallocating, writing groups of
records at its end, rolling to the next file, and deleting old files.

Theory of operation
-------------------
Files are ``<seq:016x>.jnl`` in the journal directory (``journal_format``);
writing always starts a fresh file after the last one there, so only tails
can be torn.  A new file is created with ``O_EXCL``, preallocated in
``prealloc_bytes`` steps (``posix_fallocate``; a file system that refuses
stops preallocation for good) and its directory entry fsynced.  A group's
records are framed and written with ``pwritev`` at the file's end (a rare
short write is finished with ``pwrite``); a group of at least
``direct_min_bytes`` goes through ``DirectWriter`` (direct_write.py,
``O_DIRECT`` with PAD records).  The file and offset of a submission's last
record's body go into its ``seq`` and ``body_at`` (the entry store indexes
big batches where the journal wrote them).  Finishing a file truncates the
preallocated tail and fsyncs it, unless the journal failed (a failed file is
left as it is: no retry).  This module does not sync a group or decide when
to roll: that is ``journal.Journal``'s group commit and ``journal_sync``.
"""
from __future__ import annotations

import os
from typing import Callable

from bookie_server.journal.direct_write import DirectWriter, pad_before
from bookie_server.journal.journal_crc import Body
from bookie_server.journal.journal_format import HEADER, Position, file_name, frame, list_files
from bookie_server.journal.records import StagedSubmission, Submission


def _finish_short(fd: int, pieces: list[Body], written: int, size: int, offset: int) -> None:
    """A rare short ``pwritev`` of ``pieces`` (``size`` bytes at ``offset``,
    ``written`` of them written): finish with plain ``pwrite``."""
    rest = memoryview(b"".join(pieces))
    while written < size:
        n = os.pwrite(fd, rest[written:], offset + written)
        if n <= 0:
            raise OSError("short write to journal")
        written += n


class JournalFile:
    """The file the journal appends to (``fd``, ``seq``, ``offset``: its end)."""

    def __init__(self, directory: str, *, max_file_bytes: int, prealloc_bytes: int,
                 headroom_bytes: int, direct_min_bytes: int,
                 pwritev: Callable[[int, list[Body], int], int]) -> None:
        self.dir = directory
        os.makedirs(directory, exist_ok=True)
        self.max_file_bytes = max_file_bytes
        self.prealloc_bytes = prealloc_bytes
        self._headroom = headroom_bytes      # preallocated ahead of the end, at least
        self._pwritev = pwritev
        # groups >= direct_min_bytes: O_DIRECT (0 = off)
        self.direct = DirectWriter(direct_min_bytes, self.write_all, self.preallocate)
        self.fd = -1
        self.seq = 0
        self.offset = 0
        self._allocated = 0
        # the end at which the file is full or its preallocation runs short:
        # below it a group's write needs no roll and no preallocation step
        self.check_at = 0

    def open_after_existing(self) -> None:
        files = list_files(self.dir)
        self.open((files[-1] + 1) if files else 1)

    def open(self, seq: int) -> None:
        path = self.path_of(seq)
        self.fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        self.seq, self.offset, self._allocated = seq, 0, 0
        if self.direct.min_bytes > 0:
            self.direct.open(path)
        self.preallocate()
        dfd = os.open(self.dir, os.O_RDONLY)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)

    def preallocate(self, need: int = 0) -> None:
        try:
            while (self.prealloc_bytes > 0
                   and self._allocated < self.offset + max(need, self._headroom)):
                try:
                    os.posix_fallocate(self.fd, self._allocated, self.prealloc_bytes)
                except OSError:
                    self.prealloc_bytes = 0
                    return
                self._allocated += self.prealloc_bytes
        finally:
            self.check_at = self.max_file_bytes if self.prealloc_bytes <= 0 \
                else min(self.max_file_bytes, self._allocated - self._headroom)

    def write_group(self, group: list[Submission]) -> int:
        """Frame and write ``group``'s records at the end; returns the bytes
        written (PAD records included).  Raises what the write raised."""
        direct = self.direct.wants(group[0].nbytes if len(group) == 1
                                   else sum(sub.nbytes for sub in group))
        lead_pad = pad_before(self.offset) if direct else 0
        pieces: list[Body] = []
        at = self.offset + lead_pad
        only_staged = True          # every record of the group staged ahead
        for sub in group:
            sub.seq = self.seq
            staged = sub.staged if type(sub) is StagedSubmission else None
            records = sub.records if staged is None else sub.records[:-1]
            only_staged = only_staged and staged is not None and not records
            for rtype, body in records:
                pieces.extend(frame(rtype, body))
                sub.body_at = at + HEADER.size
                at += HEADER.size + len(body)
            if staged is not None:
                pieces.append(staged.view)
                sub.body_at = at + HEADER.size
                at += len(staged.view)
        try:
            if direct:
                total = self.direct.write_group(pieces, self.offset, lead_pad, self.fd,
                                                staged=only_staged)
            else:
                total = self.write_all(self.fd, pieces, self.offset)
        finally:
            for sub in group:        # written or failed: the staged buffers go back
                if type(sub) is StagedSubmission:
                    sub.staged = None
        self.offset += total
        return total

    def write_one(self, sub: Submission) -> int:
        """``write_group([sub])`` for a submission of one record (a lone
        add of a ledger after its first) that is not written direct: the
        same frame and offsets, with no lists or loops; the bytes written."""
        if len(sub.records) != 1 or self.direct.wants(sub.nbytes):
            return self.write_group([sub])
        rtype, body = sub.records[0]
        start = self.offset
        sub.seq = self.seq
        sub.body_at = start + HEADER.size
        size = sub.nbytes                     # the header and the body
        pieces = frame(rtype, body)
        written = self._pwritev(self.fd, pieces, start)
        if written < size:
            _finish_short(self.fd, pieces, written, size, start)
        self.offset = start + size
        return size

    def write_all(self, fd: int, pieces: list[Body], start: int) -> int:
        offset = start
        for i in range(0, len(pieces), 512):  # stay under IOV_MAX
            chunk = pieces if len(pieces) <= 512 else pieces[i:i + 512]
            size = sum(map(len, chunk))
            written = self._pwritev(fd, chunk, offset)
            if written < size:
                _finish_short(fd, chunk, written, size, offset)
            offset += size
        return offset - start

    def finish(self, *, durable: bool) -> None:
        """Close the file; ``durable``: truncate the preallocated tail and fsync first."""
        if self.fd >= 0:
            try:
                if durable:
                    os.ftruncate(self.fd, self.offset)
                    os.fsync(self.fd)
            finally:
                os.close(self.fd)
                self.fd = -1
                self.direct.close()

    def delete_before(self, position: Position, keep: frozenset[int] = frozenset()) -> list[int]:
        """Delete journal files whose records all lie before ``position``,
        except the current one and those in ``keep``.  Returns the deleted
        file seqs."""
        removed = []
        for seq in list_files(self.dir):
            if seq < position.seq and seq != self.seq and seq not in keep:
                os.unlink(self.path_of(seq))
                removed.append(seq)
        return removed

    def path_of(self, seq: int) -> str:
        return os.path.join(self.dir, file_name(seq))
