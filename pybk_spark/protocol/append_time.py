"""Append times of log entries: where they live and how a time is found.

Theory of operation
-------------------
Every entry a log writer appends carries the time it was appended, in
microseconds since the Unix epoch (UTC):
  * raw log entries (``LogWriter``) carry it in an 8-byte big-endian header
    before the payload.  The ledger says so in its custom metadata
    (``entry_format`` = :data:`TIME_PREFIXED`), so readers strip the header
    only from ledgers written that way; entries of other ledgers (written
    before, or with the ledger API) are payloads as given and have no time;
  * DataFrame log entries (Arrow IPC streams, spark/arrow_codec.py) carry it
    in the stream's schema metadata under :data:`IPC_KEY`; the payload stays
    a plain IPC stream that any Arrow reader decodes.
A writer stamps with :func:`stamp`, which never goes backwards, so within a
ledger (one writer) times are non-decreasing in entry order.

Each log segment also records the first and last append time of its ledger
(``Segment.first_time_us`` / ``last_time_us``, -1 = unknown), written when
the segment is closed (log writer) or committed (Spark writer).

Finding the first entry appended at or after ``t`` (``startingTimestamp``,
``endingTimestamp``) reads no more than it must: :func:`segment_side` decides
per segment from the recorded times alone (all before ``t``: skipped; first
time >= ``t``: entry 0), and only a segment that straddles ``t`` (or whose
times are unknown, e.g. the open tail) is searched, by
:func:`first_at_or_after`: a binary search reading O(log n) single entries.
An entry without a time counts as older than every ``t`` (old data is
skipped by a start time and kept by an end time).

Pure: no I/O, no clock (the caller passes the time and the probe).
"""
from __future__ import annotations

from typing import Any, Callable, Mapping, Optional, Sequence

import numpy as np
import pyarrow as pa

from pybk_spark import errors

ENTRY_FORMAT_KEY = "entry_format"          # ledger custom metadata key
TIME_PREFIXED = "time-prefixed-v1"         # 8-byte big-endian int64 microseconds, then payload
HEADER_BYTES = 8
IPC_KEY = b"pybk.appendTime"               # DataFrame entries: IPC schema metadata, decimal µs
UNKNOWN = -1

BEFORE, AT_START, SEARCH = "before", "at-start", "search"


def stamp(previous_us: int, now_s: float) -> int:
    """The next append time: the clock in µs, never below the previous stamp."""
    return max(previous_us, int(now_s * 1_000_000))


def is_time_prefixed(custom: Mapping[str, Any] | None) -> bool:
    return (custom or {}).get(ENTRY_FORMAT_KEY) == TIME_PREFIXED


def payload_bytes(ledger_length: int, entries: int, custom: Mapping[str, Any] | None) -> int:
    """The callers' payload bytes of a ledger (its length less the headers)."""
    return ledger_length - HEADER_BYTES * max(entries, 0) if is_time_prefixed(custom) \
        else ledger_length


def header(time_us: int) -> bytes:
    return int(time_us).to_bytes(HEADER_BYTES, "big", signed=True)


def frame(payloads: Sequence[bytes], time_us: int) -> list[bytes]:
    """Payloads of one append, each behind the same time header."""
    head = header(time_us)
    return [head + bytes(p) for p in payloads]


def unframe(payload: Any) -> tuple[pa.Array, pa.Array]:
    """Time-prefixed payloads (an Arrow binary array or chunked array) ->
    (times as timestamp[us, UTC], payloads without the header); vectorised."""
    if isinstance(payload, pa.ChunkedArray):
        payload = payload.combine_chunks()
    # pyarrow.compute costs more to import than the rest of pyarrow's use here,
    # and only a read of time-prefixed entries needs it (never load()/schema())
    import pyarrow.compute as pc
    lengths = pc.binary_length(payload)
    if len(payload) and pc.min(lengths).as_py() < HEADER_BYTES:
        raise errors.ReadError("entry of a time-prefixed ledger is shorter than its header")
    longest = pc.max(lengths).as_py() if len(payload) else HEADER_BYTES
    heads = pc.binary_slice(payload, 0, HEADER_BYTES)
    raw = heads.buffers()[2]
    start = heads.offset * HEADER_BYTES
    times = np.frombuffer(raw, dtype=">i8", count=len(heads), offset=start) if len(heads) \
        else np.zeros(0, dtype=">i8")
    return (pa.array(times.astype(np.int64), pa.int64()).cast(pa.timestamp("us", tz="UTC")),
            # an explicit stop: without one pyarrow 26 fails on sliced arrays
            pc.binary_slice(payload, HEADER_BYTES, longest))


def time_of_framed(payload: bytes) -> int:
    if len(payload) < HEADER_BYTES:
        raise errors.ReadError("entry of a time-prefixed ledger is shorter than its header")
    return int.from_bytes(payload[:HEADER_BYTES], "big", signed=True)


def segment_side(first_us: int, last_us: int, t_us: int) -> str:
    """Where ``t`` falls for a segment, from its recorded times: every entry
    before ``t`` (BEFORE), the first entry at or after it (AT_START), or the
    ledger must be searched (SEARCH: straddles ``t``, or times unknown)."""
    if last_us != UNKNOWN and last_us < t_us:
        return BEFORE
    if first_us != UNKNOWN and first_us >= t_us:
        return AT_START
    return SEARCH


def first_at_or_after(lo: int, hi: int, t_us: int,
                      time_of: Callable[[int], Optional[int]]) -> int:
    """The smallest entry id in [lo, hi] whose time is >= ``t_us`` (hi + 1 if
    none), for non-decreasing times; ``time_of(e)`` None = no time (older than
    any ``t``).  Calls ``time_of`` O(log(hi - lo)) times."""
    while lo <= hi:
        mid = (lo + hi) // 2
        got = time_of(mid)
        if got is not None and got >= t_us:
            hi = mid - 1
        else:
            lo = mid + 1
    return lo

