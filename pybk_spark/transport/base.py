"""The bookie transport port.

Every call returns a ``concurrent.futures.Future``; a failed future holds a
``pybk_spark.errors.BKError`` (a timeout is ``Timeout``: outcome unknown).
The one exception is ``send_entry``, a writer's lone add: it calls back
``deliver(result, error)`` instead, because a future per bookie per add
(a condition, a lock and a callback list each) is most of what a lone add
costs the client; a transport that has only futures gets the default,
which adapts one.
``TransportPool`` maps bookie ids to transports (resolving addresses lazily).
"""
from __future__ import annotations

import abc
import functools
from concurrent.futures import Future, InvalidStateError
from dataclasses import dataclass
from typing import Any, Callable, Optional
import numpy as np

from pybk_spark import errors
from pybk_spark.wire.entries import Payload, batch_to_buffer, parse_entry_record, records_to_batch
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


# called once with (result, None) or (None, the typed error)
Deliver = Callable[[Any, Optional[BaseException]], None]


def outcome(convert, resp, **context) -> tuple[Any, Optional[errors.BKError]]:
    """(``convert(resp)``, None), or (None, the error): a typed error it
    raises, anything else raised is a malformed answer (``BadRequest``)."""
    try:
        return convert(resp), None
    except Exception as exc:  # noqa: BLE001 - a typed error, or a malformed answer
        return None, answer_error(exc, **context)


def answer_error(exc: Exception, **context) -> errors.BKError:
    """What converting an answer raised, as the error its caller gets: a
    typed error as is, anything else a malformed answer (``BadRequest``)."""
    if isinstance(exc, errors.BKError):
        return exc
    return errors.BadRequest(f"bad bookie response: {exc}", **context)


def settle(fut: Future, convert, resp, **context) -> None:
    """Complete ``fut`` with ``convert(resp)`` (see :func:`outcome`).  A
    future the caller already cancelled is left alone."""
    deliver_to(fut)(*outcome(convert, resp, **context))


def deliver_to(fut: Future) -> Deliver:
    """A ``Deliver`` that completes ``fut`` (left alone once cancelled)."""
    def deliver(result: Any, exc: Optional[BaseException]) -> None:
        try:
            if exc is None:
                fut.set_result(result)
            else:
                fut.set_exception(exc)
        except InvalidStateError:
            pass
    return deliver


def _deliver_outcome(deliver: Deliver, fut: Future) -> None:
    exc = fut.exception()
    deliver(None if exc is not None else fut.result(), exc)


class LoneEntry:
    """A writer's lone add, sent to each bookie of its write set: the entry
    record (wire/entries.py: ``head`` then ``payload``) and how to add it.
    ``framed`` is for the transport: what it built from the entry for the
    first bookie, reused for the others (a lane frame and its request id)."""

    __slots__ = ("master_key", "head", "payload", "recovery", "framed")

    def __init__(self, master_key: bytes, head: bytes, payload: bytes, recovery: bool):
        self.master_key = master_key
        self.head = head
        self.payload = payload
        self.recovery = recovery
        self.framed: Any = None


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
    def add(self, ledger_id: int, master_key: bytes, entries: Payload,
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

    def send_entry(self, entry: LoneEntry, timeout: float | None, deliver: Deliver) -> None:
        """``add_entry`` with a callback: ``deliver((first, last), None)``
        or ``deliver(None, error)``, once, from whichever thread settles the
        add (this one when it fails before it is sent)."""
        fut = self.add_entry(entry.master_key, entry.head, entry.payload, entry.recovery,
                             timeout)
        fut.add_done_callback(functools.partial(_deliver_outcome, deliver))

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
