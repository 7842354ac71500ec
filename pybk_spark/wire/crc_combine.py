"""CRC-32C algebra over numpy arrays: many CRCs moved along a message at once.

Theory of operation
-------------------
CRC-32C (reflected, init and final XOR 0xFFFFFFFF, as ``google_crc32c``)
of a concatenation is the CRC of its head moved past the tail, XOR the
tail's CRC:

    crc(A || B) = Z(|B|)(crc(A)) ^ crc(B)

where ``Z(n)`` feeds ``n`` zero bytes through the CRC register.  ``Z(n)``
is linear over GF(2) (the init and final XOR cancel out of the identity),
and ``Z(m + n) = Z(m) Z(n)``.  So a byte count ``n < 2**32`` written in
base 256 as ``d0 + 256 d1 + 65536 d2 + 2**24 d3`` gives
``Z(n) = Z(d0) Z(256 d1) Z(65536 d2) Z(2**24 d3)``: four linear maps, each
picked by one digit from 256.  A linear map of a 32-bit value is four
lookups, one per byte of the value, XORed together.  ``shift(values,
counts)`` moves every value of an array by its own count with those
lookups: 4 digit levels x 4 gathers, no Python per value.

Why: a batch of entries is checked against its stored digests with ONE
CRC over the whole payload buffer.  With ``D[i]`` the stored digest of row
``i`` (the CRC of its 32-byte header, then its payload), ``h[i]`` its
header's CRC, ``L[i]`` its payload's length and ``S[i]`` the bytes of
payload after it,

    crc(payload[0] || ... || payload[n-1])
        = XOR over i of  shift(D[i], S[i]) ^ shift(h[i], S[i] + L[i])

since ``crc(payload[i]) = D[i] ^ Z(L[i])(h[i])``.  When the two sides agree
every row is taken as correct; when they differ the caller checks row by
row, which also names the bad rows.  A corrupted batch passes the one check
with probability 2**-32, as one corrupted row passes its own CRC.

The same algebra gives the CRC of a whole buffer from the CRC of a span
inside it and the bytes around the span (``around``): a pulled answer's
journal record is hashed once, by the digest check's CRC over its
payloads, and the bytes around them.

The tables (4 levels x 256 digits x 4 byte lanes x 256 values, 4 MiB) are
built on first use, in about 20 ms.
"""
from __future__ import annotations

import functools
from typing import Any

import google_crc32c
import numpy as np

POLY = 0x82F63B78          # CRC-32C, reflected


def _zero_byte_columns() -> np.ndarray:
    """The images of the 32 unit vectors under ``Z(1)``."""
    out = np.empty(32, dtype=np.uint32)
    for bit in range(32):
        r = 1 << bit
        for _ in range(8):
            r = (r >> 1) ^ (POLY if r & 1 else 0)
        out[bit] = r
    return out


_BITS = ((np.arange(256)[:, None] >> np.arange(8)) & 1).astype(bool)    # (value, bit)


def _byte_tables(columns: np.ndarray) -> np.ndarray:
    """(..., 4, 256) lookup tables of linear maps given by their images of
    the 32 unit vectors (``columns``: (..., 32)): entry ``value`` of a
    lane is the XOR of the images of its set bits."""
    lead = columns.shape[:-1]
    tables = np.zeros(lead + (4, 256), dtype=np.uint32)
    for lane in range(4):
        for bit in range(8):
            tables[..., lane, :] ^= np.where(_BITS[:, bit],
                                             columns[..., 8 * lane + bit, None], np.uint32(0))
    return tables


def _apply(tables: np.ndarray, values: np.ndarray) -> np.ndarray:
    """One linear map (its (4, 256) tables) applied to every value."""
    out: np.ndarray = (tables[0][values & 0xFF] ^ tables[1][(values >> 8) & 0xFF]
                       ^ tables[2][(values >> 16) & 0xFF] ^ tables[3][values >> 24])
    return out


@functools.lru_cache(maxsize=1)
def _levels() -> np.ndarray:
    """(4, 256, 4, 256): level ``p``, digit ``d`` -> the tables of
    ``Z(d * 256**p)``."""
    unit = np.uint32(1) << np.arange(32, dtype=np.uint32)
    base = _byte_tables(_zero_byte_columns())          # Z(1)
    levels = np.empty((4, 256, 4, 256), dtype=np.uint32)
    for p in range(4):
        columns = np.empty((256, 32), dtype=np.uint32)
        columns[0] = unit                              # Z(0): the identity
        columns[1] = _apply(base, unit)
        k = 1
        while k < 255:       # Z((k + j) s) = Z(k s) Z(j s): up to k digits at once
            j = min(k, 255 - k)
            columns[k + 1:k + j + 1] = _apply(_byte_tables(columns[k]), columns[1:j + 1])
            k += j
        levels[p] = _byte_tables(columns)
        # the next level's step, Z(256**(p+1)) = Z(256**p) applied 256 times
        base = _byte_tables(_apply(base, columns[255]))
    return levels


@functools.lru_cache(maxsize=1)
def _flat_levels() -> np.ndarray:
    """``_levels`` with each level's tables as one row: index
    ``digit * 1024 + lane * 256 + byte``."""
    return _levels().reshape(4, -1)


def shift(values: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """``Z(n)(crc)`` for each CRC of ``values`` (uint32) and its count ``n``
    of ``counts`` (< 2**32): what makes ``crc(A || B)`` of ``crc(A)`` and
    ``crc(B)``, for any ``B`` of ``n`` bytes."""
    levels = _flat_levels()
    out = np.asarray(values, dtype=np.uint32)
    counts = np.asarray(counts, dtype=np.int64)
    for p in range(4):
        digits = (counts >> (8 * p)) & 0xFF
        if not digits.any():
            continue
        # one flat ``take`` per byte lane: indexing the (256, 4, 256) tables
        # with two index arrays walks numpy's general multi-index path,
        # about twice as slow
        tables = levels[p]
        row = (digits << 10).astype(np.intp)
        out = (tables.take(row + (out & 0xFF)) ^ tables.take(row + (256 + ((out >> 8) & 0xFF)))
               ^ tables.take(row + (512 + ((out >> 16) & 0xFF)))
               ^ tables.take(row + (768 + (out >> 24))))
    return out


def concat(head_crc: int, tail_crc: int, tail_len: int) -> int:
    """``crc(A || B)`` from ``crc(A)``, ``crc(B)`` and ``|B|``."""
    moved = shift(np.array([head_crc], dtype=np.uint32), np.array([tail_len], dtype=np.int64))
    return int(moved[0]) ^ tail_crc


def around(data: Any, start: int, length: int, inner_crc: int) -> int:
    """The CRC of all of ``data`` (any buffer ``google_crc32c`` takes: bytes,
    a pyarrow Buffer, a numpy array) given ``inner_crc``, the CRC of its
    ``length`` bytes from ``start``: only the bytes around them are read."""
    end = start + length
    head = google_crc32c.value(data[:start])
    tail = google_crc32c.value(data[end:])
    return concat(concat(head, inner_crc, length), tail, len(data) - end)


def digests_agree(whole_crc: int, digests: np.ndarray, header_crcs: np.ndarray,
                  ends: np.ndarray) -> bool:
    """Whether ``whole_crc``, the CRC of the payloads laid end to end, is
    what rows with these stored ``digests`` (each the CRC of the row's
    header then its payload), header CRCs and payload ``ends`` (n + 1
    offsets, from the first payload's start) make together."""
    ends = np.asarray(ends, dtype=np.int64)
    total = ends[-1]
    after = total - ends[1:]                   # payload bytes after row i
    with_own = total - ends[:-1]               # ... and row i's own
    moved = shift(np.concatenate((digests, header_crcs)), np.concatenate((after, with_own)))
    return int(np.bitwise_xor.reduce(moved)) == whole_crc     # no rows: XOR of none is 0
