"""Journal replay: read the journal files back at start-up, truncate a torn tail.

Theory of operation
-------------------
``replay(directory, start)`` walks the journal files (``journal.list_files``,
in sequence order) from a checkpoint position and yields every record at or
after it as ``(position after the record, type, body)``.  Each record's frame
(``journal.HEADER``) is checked before its body is trusted: a short header, a
type that is not a ``RecordType``, a length running past the end of the file,
a short body or a CRC mismatch ends that file.  An all-zero header followed by
zeros is the unwritten (preallocated) end of the file, not damage.

Ordering obligations:
  * Replay runs before ``Journal.start`` on the same directory: it may
    truncate files, and nothing may be writing them meanwhile.  Writing always
    starts a fresh file, so only tails can be torn.
  * A torn or corrupt record ends its file: the file is truncated there and
    fsync'd before replay moves on (logged as ``event=journal_tail_truncated``
    unless only preallocated zeros were dropped), so damaged bytes are never
    served and never found again by a later replay.
  * Only files at or after the checkpoint position are read, so only bytes
    after it are ever truncated; every batch the entry store indexes inside a
    journal file lies before it, so truncation never cuts an indexed batch.
"""
from __future__ import annotations

import logging
import os
from typing import Iterator

from bookie_server.journal import HEADER, Position, RecordType, crc_of, file_name, list_files

log = logging.getLogger("bookie.journal")


def replay(directory: str, start: Position) -> Iterator[tuple[Position, int, bytes]]:
    """Yield (position after record, type, body) for records at/after start."""
    for seq in list_files(directory):
        if seq < start.seq:
            continue
        yield from _replay_file(directory, seq, start.offset if seq == start.seq else 0)


def _replay_file(directory: str, seq: int, offset: int) -> Iterator[tuple[Position, int, bytes]]:
    path = os.path.join(directory, file_name(seq))
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
                _truncate(path, pos)
                return
            pos += HEADER.size + length
            yield Position(seq, pos), rtype, body


def _truncate(path: str, offset: int) -> None:
    fd = os.open(path, os.O_WRONLY)
    try:
        os.ftruncate(fd, offset)
        os.fsync(fd)
    finally:
        os.close(fd)
