"""The bookie transport port.

Every call returns a ``concurrent.futures.Future``; a failed future holds a
``pybk_spark.errors.BKError`` (a timeout is ``Timeout``: outcome unknown).
``TransportPool`` maps bookie ids to transports (resolving addresses lazily).
"""
from __future__ import annotations

import abc
from concurrent.futures import Future, InvalidStateError
from dataclasses import dataclass
import numpy as np

from pybk_spark import errors
from pybk_spark.wire.entries import batch_to_buffer, parse_entry_record, records_to_batch
from pybk_spark.wire.results import LacResult, ReadResult


@dataclass(frozen=True)
class PullResult:
    entries: int              # copied, durable on the pulling bookie
    bytes: int
    missing: np.ndarray       # wanted ids it did not copy
    message: str = ""         # why (peer down, ids absent or corrupt there)


@dataclass(frozen=True)
class PullSource:
    bookie_id: str
    address: str              # gRPC
    lane_address: str = ""    # read lane; "" = gRPC reads


def settle(fut: Future, convert, resp, **context) -> None:
    """Complete ``fut`` with ``convert(resp)``: a typed error it raises fails
    ``fut``, anything else raised is a malformed answer (``BadRequest``).  A
    future the caller already cancelled is left alone."""
    try:
        result = convert(resp)
    except errors.BKError as exc:
        fail(fut, exc)
        return
    except Exception as exc:  # noqa: BLE001 - malformed answer
        fail(fut, errors.BadRequest(f"bad bookie response: {exc}", **context))
        return
    try:
        fut.set_result(result)
    except InvalidStateError:
        pass


def fail(fut: Future, exc: BaseException) -> None:
    """Fail ``fut`` unless the caller already cancelled it."""
    try:
        fut.set_exception(exc)
    except InvalidStateError:
        pass


def failed_future(exc: BaseException) -> Future:
    """A future that has already failed with ``exc`` (a call that could not
    even be made)."""
    fut: Future = Future()
    fut.set_exception(exc)
    return fut


class BookieTransport(abc.ABC):
    @abc.abstractmethod
    def add(self, ledger_id: int, master_key: bytes, entries: bytes,
            recovery: bool = False, timeout: float | None = None) -> "Future[tuple[int, int]]":
        """Future of the (first, last) entry ids made durable."""

    def add_entry(self, master_key: bytes, record_head: bytes, payload: bytes,
                  recovery: bool = False, timeout: float | None = None
                  ) -> "Future[tuple[int, int]]":
        """A lone add as its entry record (wire/entries.py: ``record_head``
        then ``payload``).  Transports that carry it as such override this;
        here it goes as a one-row batch through ``add``."""
        record = record_head + payload
        try:
            ledger_id = parse_entry_record(record)[0]
            data = batch_to_buffer(records_to_batch([record]))
        except errors.BKError as exc:
            return failed_future(exc)
        return self.add(ledger_id, master_key, data, recovery, timeout)

    @abc.abstractmethod
    def read(self, ledger_id: int, first: int, last: int, *, max_entries: int = 0,
             max_bytes: int = 0, fence: bool = False, master_key: bytes = b"",
             timeout: float | None = None, sparse: bool = False,
             stripe: tuple[int, int] | None = None) -> "Future[ReadResult]":
        """Contiguous run from ``first``; ``sparse=True``: every stored entry in
        [first, last], gaps skipped, end LIMIT/COMPLETE, empty answer is OK.
        ``stripe=(E, slot)`` (with sparse): only ids e with e % E == slot."""

    @abc.abstractmethod
    def read_lac(self, ledger_id: int, *, fence: bool = False, master_key: bytes = b"",
                 wait_for_lac_above: int = -2, wait_ms: int = 0,
                 timeout: float | None = None) -> "Future[LacResult]": ...

    @abc.abstractmethod
    def write_lac(self, ledger_id: int, master_key: bytes, lac: int,
                  timeout: float | None = None) -> "Future[None]": ...

    def pull(self, ledger_id: int, master_key: bytes, source: PullSource, wanted: np.ndarray,
             digest_type: str, timeout: float | None = None) -> "Future[PullResult]":
        """Ask this bookie to copy ``wanted`` ids of a ledger from ``source``
        (bookie-to-bookie re-replication, wire ``PullEntries``); transports
        without it fail with ``BadRequest`` and callers copy through a client."""
        return failed_future(errors.BadRequest(
            f"{type(self).__name__} cannot ask a bookie to pull entries"))

    def close(self) -> None:
        pass


class TransportPool(abc.ABC):
    @abc.abstractmethod
    def get(self, bookie_id: str) -> BookieTransport: ...

    def invalidate(self, bookie_id: str) -> None:
        pass

    def close(self) -> None:
        pass
