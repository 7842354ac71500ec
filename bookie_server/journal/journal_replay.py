"""Journal replay: read the journal files back at start-up; skip damaged
records, truncate only a torn tail.

Theory of operation
-------------------
``replay(directory, start, on_damage)`` walks the journal files
(``journal.list_files``, in sequence order) from a checkpoint position and
yields every record at or after it as ``(position after the record, type,
body)``.  Each record's frame (``journal.HEADER``) is checked before its body
is trusted: a short header, a type that is not a ``RecordType``, a length
running past the end of the file, a short body or a CRC mismatch is a *bad
frame*.  An all-zero header followed by zeros is the unwritten
(preallocated) end of the file, not damage.

Resynchronisation.  At a bad frame replay scans forward (``find_next_frame``)
for the next *valid frame*: a header whose type is a ``RecordType``, whose
body length is at least 8 bytes (every record body starts with a ledger id or
is an Arrow stream) and fits in the file, whose next frame is plausible too
(end of file, zeros, or another header with a valid type and a fitting
length) and whose body's CRC32C matches.  The candidates are found with
numpy over the rest of the file (no per-byte Python loop) and the cheap
checks run before any CRC, so a scan costs about one pass over the damaged
file plus one CRC per surviving candidate.  False positives: a random
9-byte window passes the type and length checks with probability about
5/256 x (remaining / 2^32), then the CRC32C matches with probability 2^-32
(and the chained next-header check again): far below once per exabyte of
scanned damage, accepted and documented in docs/bookie.md.

  * A valid frame found after the bad one: the bytes in between are
    *damage*: ``on_damage(Damage)`` is called (logged as
    ``event=journal_damage file=... offset=... bytes=...``) and replay
    continues with that frame.  Nothing is truncated: records after the
    damage were acknowledged and are kept.
  * No valid frame after it: a torn TAIL (a crash mid-write, or preallocated
    zeros): the file is truncated there and fsync'd before replay moves on
    (``event=journal_tail_truncated`` unless only zeros were dropped), so the
    torn bytes are never found again by a later replay.

Ordering obligations:
  * Replay runs before ``Journal.start`` on the same directory: it may
    truncate files, and nothing may be writing them meanwhile.  Writing always
    starts a fresh file, so only tails can be torn by a crash; damage in the
    middle of a file is media damage.
  * Only files at or after the checkpoint position are read, so only bytes
    after it are ever truncated; every batch the entry store indexes inside a
    journal file lies before it, so truncation never cuts an indexed batch.
    (Damage to an indexed batch before the checkpoint is the scrubber's to
    find: ``scrubber.py``.)
  * ``on_damage`` runs in stream order: every record before the damage has
    been yielded, none after it, so the caller can bound which entries the
    damaged bytes may have held (``damage.py``).
"""
from __future__ import annotations

import logging
import mmap
import os
from dataclasses import dataclass
from typing import Callable, Generator, Iterator, Optional, Union

import numpy as np

from bookie_server.journal.journal_crc import crc_of
from bookie_server.journal.journal_format import (HEADER, MIN_BODY, Position, RecordType, file_name,
                                                  list_files)

log = logging.getLogger("bookie.journal")

_TYPES = np.array(sorted(int(t) for t in RecordType), np.uint8)
_TYPE_SET = frozenset(int(t) for t in RecordType)
UNCHAINED_CRC_BUDGET = 256 << 20   # CRC bytes spent on unchained candidates per scan

Data = Union[bytes, mmap.mmap]      # a journal file's bytes (replay maps the file)
OnDamage = Optional[Callable[["Damage"], None]]


@dataclass(frozen=True)
class Damage:
    file: str           # journal file name
    offset: int         # first damaged byte
    nbytes: int         # bytes skipped up to the next valid frame


def replay(directory: str, start: Position,
           on_damage: Optional[Callable[[Damage], None]] = None
           ) -> Iterator[tuple[Position, int, bytes]]:
    """Yield (position after record, type, body) for records at/after start."""
    for seq in list_files(directory):
        if seq < start.seq:
            continue
        yield from _replay_file(directory, seq, start.offset if seq == start.seq else 0,
                                on_damage)


def scan_file(path: str, seq: int, offset: int = 0,
              on_damage: Optional[Callable[[Damage], None]] = None
              ) -> Iterator[tuple[Position, int, bytes]]:
    """Read-only walk of one journal file, same framing and resynchronisation
    as ``replay`` but never truncating (offline tools: ``pybk readjournal``).
    The torn tail, if any, simply ends the walk."""
    if os.path.getsize(path) <= offset:
        return
    with open(path, "rb") as fh, mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) as data:
        for position, rtype, body in _records(data, seq, offset, on_damage):
            yield position, rtype, bytes(body)


def _read_frame(data: Data, pos: int, size: int) -> tuple[Optional[str], int, Optional[bytes]]:
    """(problem or None, type, body) of the frame at ``pos``; problem "" is
    the zero-filled end of the file."""
    if size - pos < HEADER.size:
        return "torn header", 0, None
    length, crc, rtype = HEADER.unpack_from(data, pos)
    if length == 0 and crc == 0 and rtype == 0:
        return ("" if _zeros_to_end(data, pos) else "zero header"), 0, None
    if rtype not in _TYPE_SET or length > size - pos - HEADER.size:
        return f"bad header (type={rtype} length={length})", rtype, None
    body = data[pos + HEADER.size:pos + HEADER.size + length]
    if crc_of(rtype, body) != crc:
        return "crc mismatch", rtype, None
    return None, rtype, body


def _zeros_to_end(data: Data, pos: int) -> bool:
    view = np.frombuffer(data, np.uint8, offset=pos)
    return not view.any()


def _u32(arr: np.ndarray, idx: np.ndarray) -> np.ndarray:
    """Little-endian u32 at each offset of ``idx`` (unaligned), as int64."""
    out: np.ndarray = (arr[idx].astype(np.int64) | (arr[idx + 1].astype(np.int64) << 8)
                       | (arr[idx + 2].astype(np.int64) << 16)
                       | (arr[idx + 3].astype(np.int64) << 24))
    return out


def _plausible_next(arr: np.ndarray, at: np.ndarray, size: int) -> np.ndarray:
    """Vectorised: is there, at each offset, the end of the file, a zero
    header, or a header with a valid type and a fitting length?"""
    ok: np.ndarray = at == size
    inside = np.flatnonzero(at + HEADER.size <= size)
    idx = at[inside]
    if len(idx):
        lens = _u32(arr, idx)
        types = arr[idx + 8]
        zero = (lens == 0) & (types == 0) & (_u32(arr, idx + 4) == 0)
        good = np.isin(types, _TYPES) & (lens >= MIN_BODY) & (lens <= size - idx - HEADER.size)
        ok[inside] = zero | good
    return ok


def find_next_frame(data: Data, start: int, *, window: int = 4 << 20) -> Optional[int]:
    """Offset of the first valid frame at or after ``start``, or None.

    Candidates (valid type, length >= MIN_BODY that fits) are found with numpy
    window by window.  Those whose next frame is plausible too (*chained*)
    are CRC-checked first, in offset order: the first match F is almost
    always the answer.  A genuine frame directly followed by more damage is
    not chained, so the unchained candidates before F whose frame ends by F
    (or, without an F, by the end of the file) are CRC-checked too, in
    offset order, within ``UNCHAINED_CRC_BUDGET`` bytes of CRC work: random
    bytes mostly read as huge lengths, and checking each of those would cost
    a pass over the file."""
    size = len(data)
    arr = np.frombuffer(data, np.uint8)
    found = None
    unchained: list[np.ndarray] = []
    lo = start
    while found is None and lo + HEADER.size + MIN_BODY <= size:
        hi = min(size - HEADER.size - MIN_BODY, lo + window)     # candidate offsets [lo, hi]
        cand = np.flatnonzero(np.isin(arr[lo + 8:hi + 9], _TYPES)) + lo
        if len(cand):
            lens = _u32(arr, cand)
            fit = (lens >= MIN_BODY) & (lens <= size - cand - HEADER.size)
            cand, lens = cand[fit], lens[fit]
            chained = _plausible_next(arr, cand + HEADER.size + lens, size)
            for pos in cand[chained].tolist():
                if _read_frame(data, pos, size)[0] is None:
                    found = pos
                    break
            unchained.append(np.stack([cand[~chained], lens[~chained]]))
        lo = hi + 1
    limit = size if found is None else found
    budget = UNCHAINED_CRC_BUDGET
    for part in unchained:
        rows: list[list[int]] = part.T.tolist()     # (offset, body length) per candidate
        for pos, length in rows:
            if pos >= limit:
                return found
            if pos + HEADER.size + length > limit or length > budget:
                continue
            budget -= length
            if _read_frame(data, pos, size)[0] is None:
                return pos
    return found


def _replay_file(directory: str, seq: int, offset: int,
                 on_damage: Optional[Callable[[Damage], None]]
                 ) -> Iterator[tuple[Position, int, bytes]]:
    path = os.path.join(directory, file_name(seq))
    if os.path.getsize(path) <= offset:
        return
    with open(path, "rb") as fh, mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) as data:
        cut = yield from _records(data, seq, offset, on_damage)
    if cut is not None:
        _truncate(path, cut)


def _records(data: Data, seq: int, offset: int, on_damage: OnDamage
             ) -> Generator[tuple[Position, int, bytes], None, Optional[int]]:
    """Yield the file's records; returns the offset to truncate at, or None."""
    size = len(data)
    pos = offset
    while pos < size:
        problem, rtype, body = _read_frame(data, pos, size)
        if problem is not None or body is None:     # a body comes with no problem only
            nxt = find_next_frame(data, pos + 1) if problem else None
            if nxt is None:
                if problem:
                    log.warning("event=journal_tail_truncated file=%s offset=%d reason=%r "
                                "dropped_bytes=%d", file_name(seq), pos, problem, size - pos)
                return pos
            damage = Damage(file_name(seq), pos, nxt - pos)
            log.error("event=journal_damage file=%s offset=%d bytes=%d reason=%r",
                      damage.file, damage.offset, damage.nbytes, problem)
            if on_damage is not None:
                on_damage(damage)
            pos = nxt
            continue
        pos += HEADER.size + len(body)
        yield Position(seq, pos), rtype, body
    return None


def _truncate(path: str, offset: int) -> None:
    fd = os.open(path, os.O_WRONLY)
    try:
        os.ftruncate(fd, offset)
        os.fsync(fd)
    finally:
        os.close(fd)
