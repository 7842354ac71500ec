"""The journal records' checksum: crc32c over the type byte and the body.

Computed by the ``crc32c`` package when it is installed (the ``fastcrc``
extra; hardware, three interleaved streams, GIL released for large bodies),
else by ``google_crc32c``.  The values are the same, so either reads what
the other wrote; the first is about twice as fast on 1 MiB records, where
the CRC was the largest user-space item of a bookie taking batches (11% of
samples; docs/performance.md, (2)).  It is an extra because its
licence is LGPL-2.1-or-later.
"""
from __future__ import annotations

from types import ModuleType
from typing import Callable, Optional, Union

import google_crc32c

from pybk_spark.wire import crc_combine

_fast_crc: Optional[ModuleType]
try:                                   # optional, same values: the ``fastcrc`` extra
    import crc32c as _fast_crc
except ImportError:                    # pragma: no cover - depends on the install
    _fast_crc = None

Body = Union[bytes, bytearray, memoryview]

_TYPE_CRC = {t: google_crc32c.value(bytes((t,))) for t in range(256)}


def crc_of_google(rtype: int, body: Body) -> int:
    # google_crc32c takes bytes only (not a memoryview, even a read-only one,
    # nor a bytearray): a record received into a buffer is copied for it
    data = body if type(body) is bytes else bytes(body)
    crc: int = google_crc32c.extend(_TYPE_CRC[rtype], data)
    return crc


if _fast_crc is not None:      # bound once: every journal record passes here
    _fast_crc32c: Callable[..., int] = _fast_crc.crc32c


def crc_of_fast(rtype: int, body: Body) -> int:
    # only chosen as ``crc_of`` when the package imported
    crc: int = _fast_crc32c(body, value=_TYPE_CRC[rtype])
    return crc


def crc_from_body_crc(rtype: int, body_len: int, body_crc: int) -> int:
    """``crc_of(rtype, body)`` from the body's own crc32c, where its
    submitter took that already (a pull's digest check): no pass over
    the body."""
    return crc_combine.concat(_TYPE_CRC[rtype], body_crc, body_len)


FAST_AVAILABLE = _fast_crc is not None
crc_of = crc_of_fast if FAST_AVAILABLE else crc_of_google
CRC_IMPLEMENTATION = "crc32c" if FAST_AVAILABLE else "google_crc32c"
