"""Per-entry digests over (ledger_id, entry_id, lac, length, payload).

Types: ``crc32c`` (default, google_crc32c C implementation), ``hmac``
(HMAC-SHA256 keyed by the ledger's master key), ``none`` (empty digest).
The header is packed big-endian as 4 x int64 (BookKeeper's digest header:
ledger id, entry id, LAC, cumulative ledger length) and fed before the
payload, so a replica that carries the right payload under the wrong id, LAC
or length is detected too.

``compute_digests`` works on whole columns; ``verify_batch`` returns a boolean
mask of rows whose digest matches (a corrupt replica is skipped by the reader,
BadDigest only when no replica is intact).
"""
from __future__ import annotations

import functools
import hashlib
import hmac as _hmac
import struct
from typing import Any, NamedTuple, Optional, Sequence

import google_crc32c
import numpy as np
import pyarrow as pa

from pybk_spark import errors
from pybk_spark.protocol.ledger_metadata import master_key
from pybk_spark.wire import crc_combine
from pybk_spark.wire.entries import (PayloadColumn, binary_buffers, binary_column, make_batch,
                                     one_batch, payload_views, run_batch, value_ends)

_HDR = struct.Struct(">qqqq")
_CRC = struct.Struct(">I")


class Digester:
    def __init__(self, digest_type: str, password: bytes = b""):
        if digest_type not in ("crc32c", "hmac", "none"):
            raise errors.IncorrectParameter(f"unknown digest type {digest_type!r}")
        self.digest_type = digest_type
        self._key = master_key(password)

    @classmethod
    def with_key(cls, digest_type: str, key: bytes) -> "Digester":
        """A digester from the master key itself (a bookie knows the key the
        writer sent, never the password)."""
        d = cls(digest_type)
        d._key = key
        return d

    def one(self, ledger_id: int, entry_id: int, lac: int, length: int, payload: Any) -> bytes:
        """Digest of one entry; ``payload`` is bytes or any read-only buffer
        (a pyarrow Buffer slice is hashed in place)."""
        hdr = _HDR.pack(ledger_id, entry_id, lac, length)
        if self.digest_type == "crc32c":
            return _CRC.pack(google_crc32c.extend(google_crc32c.value(hdr), payload))
        if self.digest_type == "hmac":
            mac = _hmac.new(self._key, hdr, hashlib.sha256)
            mac.update(payload)
            return mac.digest()
        return b""

    def compute(self, ledger_id: int, entry_ids: Sequence[int], lacs: Sequence[int],
                lengths: Sequence[int], payloads: Sequence[bytes]) -> list[bytes]:
        if self.digest_type == "none":
            return [b""] * len(payloads)
        if isinstance(lengths, np.ndarray):
            lengths = lengths.tolist()
        if self.digest_type == "crc32c":        # hot path: no per-entry method call
            value, extend, pack, hdr = google_crc32c.value, google_crc32c.extend, _CRC.pack, _HDR.pack
            return [pack(extend(value(hdr(ledger_id, e, l, n)), p))
                    for e, l, n, p in zip(entry_ids, lacs, lengths, payloads)]
        one = self.one
        return [one(ledger_id, e, l, n, p) for e, l, n, p in zip(entry_ids, lacs, lengths, payloads)]

    def run_batch(self, ledger_id: int, first: int, lac: int, base: int,
                  payloads: Sequence[bytes] | pa.Array | PayloadColumn) -> pa.RecordBatch:
        """The batch a writer sends for ``payloads`` given ids ``first`` on,
        LAC ``lac``, after a ledger length of ``base`` bytes, digests
        computed.  A crc32c run of ``_BATCH_HASH_MIN_ROWS`` or more hashes
        its headers as columns (``header_crcs``), each payload with one
        ``extend``, and keeps the digests as one buffer of big-endian
        uint32s: per entry, one C call and no objects.  ``payloads`` may be
        a binary column (the Spark writer's entries, encoded back to back),
        best as a ``PayloadColumn`` whose ends its caller already has: it
        becomes the batch's payload column as it is, each value hashed
        where it lies."""
        n = len(payloads)
        if isinstance(payloads, pa.Array):
            payloads = PayloadColumn.of(payloads)
        column: pa.Array | None = None
        values: Sequence[Any]
        if isinstance(payloads, PayloadColumn):
            column, ends, values = payloads.values, payloads.ends, payload_views(payloads.values)
        else:
            ends, values = value_ends(payloads), payloads
        lengths = ends + base
        if n == 1 or self.digest_type != "crc32c" or n < _BATCH_HASH_MIN_ROWS:
            ids = range(first, first + n)
            lacs = [lac] * n
            lens = lengths.tolist()
            digs = self.compute(ledger_id, ids, lacs, lens, values)
            if n == 1 and column is None:
                return make_batch(ledger_id, ids, lacs, lens, values, digs)
            return run_batch(ledger_id, first, lac, lengths,
                             values if column is None else column, ends,
                             binary_column(digs, value_ends(digs)))
        hdr = header_crcs(np.full(n, ledger_id, dtype=np.int64),
                          np.arange(first, first + n, dtype=np.int64),
                          np.full(n, lac, dtype=np.int64), lengths)
        crcs = np.fromiter(map(google_crc32c.extend, hdr.tolist(), values),
                           dtype=np.uint32, count=n).astype(">u4")
        offsets = np.arange(0, _CRC.size * (n + 1), _CRC.size, dtype=np.int32)
        digests = pa.Array.from_buffers(pa.binary(), n, [None, pa.py_buffer(offsets),
                                                         pa.py_buffer(crcs)])
        return run_batch(ledger_id, first, lac, lengths,
                         values if column is None else column, ends, digests)

    def check_batch(self, batch: pa.RecordBatch) -> BatchCheck:
        """``verify_batch``, and where one CRC over every payload laid end
        to end agreed with every digest (crc32c, ``_COMBINE_MIN_ROWS`` rows
        and more), that CRC and where those payloads lie: a caller that
        stores the batch's bytes hashes them with it (``crc_combine.around``)
        instead of reading them again."""
        if (self.digest_type == "crc32c" and batch.num_rows >= _BATCH_HASH_MIN_ROWS
                and isinstance(batch, pa.RecordBatch)):
            return _check_crc32c(batch)
        return BatchCheck(self.verify_batch(batch), None, 0, 0)

    def verify_batch(self, batch: pa.RecordBatch | pa.Table) -> np.ndarray:
        """Boolean mask: True where the row's digest is correct.  Payloads are
        hashed where they lie in the batch's data buffer (no per-row copy)."""
        n = batch.num_rows
        if self.digest_type == "none" or n == 0:
            return np.ones(n, dtype=bool)
        if self.digest_type == "crc32c" and n >= _BATCH_HASH_MIN_ROWS:   # reads, pulls, scrubs
            if isinstance(batch, pa.RecordBatch):
                return _check_crc32c(batch).ok
            chunks = batch.to_batches()
            if len(chunks) > 1 and n // len(chunks) >= _BATCH_HASH_MIN_ROWS:
                return np.concatenate([self.verify_batch(c) for c in chunks])
            return _check_crc32c(one_batch(batch)).ok  # many small chunks: one copy, one pass
        lids = batch.column("ledger_id").to_pylist()
        eids = batch.column("entry_id").to_pylist()
        lacs = batch.column("lac").to_pylist()
        lens = batch.column("length").to_pylist()
        digs = batch.column("digest").to_pylist()
        if self.digest_type == "crc32c":        # a small batch: no method call per row
            value, extend, pack, hdr = google_crc32c.value, google_crc32c.extend, _CRC.pack, _HDR.pack
            return np.fromiter((pack(extend(value(hdr(a, b, c, ln)), d)) == g for a, b, c, ln, d, g in
                                zip(lids, eids, lacs, lens, payload_views(batch.column("payload")),
                                    digs)),
                               dtype=bool, count=n)
        one = self.one
        return np.fromiter((one(a, b, c, ln, d) == g for a, b, c, ln, d, g in
                            zip(lids, eids, lacs, lens, payload_views(batch.column("payload")),
                                digs)),
                           dtype=bool, count=n)


# -- crc32c over a whole batch ------------------------------------------------------------
# CRC-32C of a fixed-length message is affine over GF(2): the CRC of a
# 32-byte header is the CRC of 32 zero bytes XOR, for each byte position j,
# a table entry T[j][byte].  So the headers of a whole batch are hashed with
# a numpy gather per byte position that varies within the batch (the rest
# add one constant) instead of a struct.pack and a C call per row; each
# payload is then one ``extend`` from its header's CRC, on a numpy slice of
# the column's data buffer; the stored digests are compared as one array.
# 5000 x 1 KiB rows: 4-5 ms, against 11-12 ms row by row
# (docs/performance.md, (5)).  The gathers cost about
# 70 us whatever the row count, so a small batch (a tailing read, a sync
# read) is hashed row by row, at about 2.5 us a row.
_BATCH_HASH_MIN_ROWS = 64
# From this many rows a batch is first checked with one CRC over all its
# payloads against its digests combined (wire/crc_combine.py), and row by row
# only when that fails: 5,000 x 1 KiB 1.27 -> 0.52 ms; 256 rows is where the
# combine's gathers cost what the calls they replace cost.
_COMBINE_MIN_ROWS = 256


@functools.lru_cache(maxsize=1)
def _header_tables() -> tuple[np.ndarray, int]:
    zero = google_crc32c.value(bytes(_HDR.size))
    tables = np.empty((_HDR.size, 256), dtype=np.uint32)
    msg = bytearray(_HDR.size)
    for j in range(_HDR.size):
        for v in range(256):
            msg[j] = v
            tables[j, v] = google_crc32c.value(bytes(msg)) ^ zero
        msg[j] = 0
    return tables, zero


def header_crcs(ledger_ids: Any, entry_ids: Any, lacs: Any, lengths: Any) -> np.ndarray:
    """``google_crc32c.value`` of every row's packed header (uint32), for
    columns of equal length (numpy arrays or anything ``np.asarray`` takes)."""
    cols = [np.asarray(c, dtype=np.int64) for c in (ledger_ids, entry_ids, lacs, lengths)]
    n = len(cols[1])
    packed = np.empty((n, 4), dtype=">i8")
    for j, col in enumerate(cols):
        packed[:, j] = col
    octets = packed.view(np.uint8).reshape(n, _HDR.size)
    tables, zero = _header_tables()
    # a byte position that holds one value in every row (the ledger id, the
    # high bytes of ids, LACs and lengths within a batch) adds one table
    # entry to all rows: only the others are gathered (a 5,000-row batch
    # then gathers 6-8 positions of 32).  Every value of a column between
    # its min and max shares their common high bits.
    same = np.zeros(_HDR.size, dtype=bool)
    if n:
        for j, col in enumerate(cols):
            lo, hi = int(col.min()), int(col.max())
            if (lo < 0) == (hi < 0):       # same sign: two's complement order holds
                varying = ((lo ^ hi) & (2 ** 64 - 1)).bit_length()   # low bits that may differ
                const_bytes = 8 - (varying + 7) // 8
                same[8 * j:8 * j + const_bytes] = True
    first = octets[0] if n else np.zeros(_HDR.size, dtype=np.uint8)
    base = zero
    for j in np.flatnonzero(same).tolist():
        base ^= int(tables[j][first[j]])
    acc = np.full(n, base, dtype=np.uint32)
    for j in np.flatnonzero(~same).tolist():
        acc ^= tables[j][octets[:, j]]
    return acc


class BatchCheck(NamedTuple):
    """``Digester.check_batch``: ``ok``, True where the row's digest is
    correct; ``payloads_crc`` (None where not taken, or where it did not
    agree with every digest), the crc32c of the ``payloads_len`` payload
    bytes that start at address ``payloads_at``."""
    ok: np.ndarray
    payloads_crc: Optional[int]
    payloads_at: int
    payloads_len: int


def _column_bytes(col: pa.Array) -> tuple[np.ndarray, np.ndarray, int]:
    """(value offsets, data bytes, the data's address) of a binary column,
    the bytes as numpy arrays."""
    offsets, data = binary_buffers(col)
    if data is None:
        return offsets, np.empty(0, np.uint8), 0
    return offsets, np.frombuffer(data, dtype=np.uint8), data.address


def _check_crc32c(batch: pa.RecordBatch) -> BatchCheck:
    n = batch.num_rows
    hdr = header_crcs(batch.column("ledger_id").to_numpy(), batch.column("entry_id").to_numpy(),
                      batch.column("lac").to_numpy(), batch.column("length").to_numpy())
    offsets, data, address = _column_bytes(batch.column("payload"))
    d_offsets, d_data, _ = _column_bytes(batch.column("digest"))
    four_each = bool(n and int(d_offsets[-1]) - int(d_offsets[0]) == 4 * n
                     and (np.diff(d_offsets) == 4).all())   # every digest 4 bytes, back to back
    stored4 = d_data[int(d_offsets[0]):int(d_offsets[-1])].view(">u4") if four_each else None
    if stored4 is not None and n >= _COMBINE_MIN_ROWS:
        start, end = int(offsets[0]), int(offsets[-1])
        whole = google_crc32c.value(data[start:end])
        if crc_combine.digests_agree(whole, stored4.astype(np.uint32), hdr, offsets - start):
            # one CRC over the payloads agrees with every digest
            return BatchCheck(np.ones(n, dtype=bool), whole, address + start, end - start)
    return BatchCheck(_rows_crc32c(n, hdr, offsets, data, d_offsets, d_data, stored4),
                      None, 0, 0)


def _rows_crc32c(n: int, hdr: np.ndarray, offsets: np.ndarray, data: np.ndarray,
                 d_offsets: np.ndarray, d_data: np.ndarray,
                 stored4: Optional[np.ndarray]) -> np.ndarray:
    """Row by row: True where the row's digest is correct."""
    bounds = offsets.tolist()
    extend = google_crc32c.extend
    got = np.fromiter((extend(h, data[a:b]) for h, a, b in zip(hdr.tolist(), bounds[:-1],
                                                               bounds[1:])),
                      dtype=np.uint32, count=n)
    if stored4 is not None:
        ok4: np.ndarray = stored4 == got
        return ok4
    starts = d_offsets[:-1].astype(np.int64)
    four = (d_offsets[1:] - d_offsets[:-1]) == 4      # a digest of another size never matches
    stored = np.zeros(n, dtype=np.uint32)
    if four.any():
        at = starts[four][:, None] + np.arange(4)
        stored[four] = d_data[at].astype(np.uint32) @ np.array([1 << 24, 1 << 16, 1 << 8, 1],
                                                                dtype=np.uint32)
    ok: np.ndarray = four & (stored == got)
    return ok
