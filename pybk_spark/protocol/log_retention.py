"""A log's retention: which of its oldest segments a time or size limit has
expired (Kafka's ``retention.ms`` / ``retention.bytes``, DistributedLog's
retention period).

Theory of operation
-------------------
Retention is two optional properties of the log, kept in its metadata
(``LogMetadata.properties``, changed by CAS like everything else there):
``retention.ms`` (a segment whose last entry was appended more than this
long ago has expired, as Kafka's: strictly older) and ``retention.bytes``
(while the log without its oldest segment still holds at least this many
bytes, that segment has expired).  Absent or ``-1``: no limit, as in
Kafka.

:func:`expired` says how many of the log's leading segments retention drops:
the longest prefix in which every segment has expired by time or by size,
and in which every segment is

  * closed (an open or recovering segment is never dropped, and nothing
    after it either: the prefix stops there);
  * not the last segment of the log (a log always keeps its newest
    segment, as Kafka keeps its active one);
  * known: a segment without a recorded append time never expires by time,
    one without a recorded size never by size (older logs, or segments a
    writer could not record: retention keeps what it cannot judge);
  * before every registered reader's position (``positions.blockers``: a
    stream's cursor holds back retention as it holds back truncation; a
    sink's position does not).

The caller drops that prefix with ``log_metadata.truncate_before`` in the
same CAS transform, so on a conflict it re-reads and re-decides, and
deletes the dropped ledgers only after the CAS (``logs/truncation.py``).  An
operator sets the limits with :func:`with_retention`, which validates them.

Pure: no I/O, no clock (``now_us`` is given by the caller).
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Iterable, Optional

from pybk_spark import errors
from pybk_spark.protocol.log_metadata import SEGMENT_CLOSED, LogMetadata
from pybk_spark.protocol.positions import RegisteredPosition, blockers

RETENTION_MS = "retention.ms"
RETENTION_BYTES = "retention.bytes"


@dataclass(frozen=True)
class Retention:
    ms: Optional[int] = None          # None: no time limit
    bytes: Optional[int] = None       # None: no size limit

    @property
    def limited(self) -> bool:
        return self.ms is not None or self.bytes is not None


def _limit(name: str, value: object) -> Optional[int]:
    try:
        n = int(str(value))
    except ValueError:
        raise errors.IncorrectParameter(
            f"log property {name!r} must be a whole number (-1: no limit), got {value!r}",
            property=name) from None
    if n < -1:
        raise errors.IncorrectParameter(
            f"log property {name!r} must be >= 0, or -1 for no limit, got {n}", property=name)
    return None if n == -1 else n


def retention_of(md: LogMetadata) -> Retention:
    props = md.properties
    return Retention(_limit(RETENTION_MS, props[RETENTION_MS]) if RETENTION_MS in props else None,
                     _limit(RETENTION_BYTES, props[RETENTION_BYTES])
                     if RETENTION_BYTES in props else None)


def with_retention(md: LogMetadata, *, ms: Optional[int] = None,
                   nbytes: Optional[int] = None) -> LogMetadata:
    """The CAS transform that sets the limits given (``-1`` removes one;
    None leaves it as it is)."""
    props = dict(md.properties)
    for name, value in ((RETENTION_MS, ms), (RETENTION_BYTES, nbytes)):
        if value is None:
            continue
        if _limit(name, value) is None:
            props.pop(name, None)
        else:
            props[name] = str(int(value))
    return replace(md, properties=props)


def expired(md: LogMetadata, now_us: int,
            positions: Iterable[RegisteredPosition] = ()) -> int:
    """How many leading segments of ``md`` retention drops (module docstring)."""
    limits = retention_of(md)
    if not limits.limited:
        return 0
    segments = md.segments
    remaining = sum(max(s.byte_count, 0) for s in segments)
    deadline = None if limits.ms is None else now_us - limits.ms * 1000
    n = 0
    for s in segments[:-1]:
        if s.state != SEGMENT_CLOSED:
            break
        by_time = deadline is not None and 0 <= s.last_time_us < deadline
        by_size = (limits.bytes is not None and s.byte_count >= 0
                   and remaining - s.byte_count >= limits.bytes)
        if not (by_time or by_size):
            break
        remaining -= max(s.byte_count, 0)
        n += 1
    held = list(positions)
    while n and blockers(md.truncated_ledgers + n, held, md.uid):
        n -= 1
    return n
