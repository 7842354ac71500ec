"""Read-ahead: produce the next batches of an iterator on a helper thread.

Theory of operation
-------------------
A Spark read task alternates between waiting for bookies (a read window in
flight) and handing Arrow batches to Spark (IPC to the JVM).  Run in one
thread, the bookies sit idle while Spark takes a batch and the task sits idle
while the bookies answer.  :func:`read_ahead` runs the source iterator on a
daemon thread that keeps at most ``depth`` finished items queued, so the
next window is in flight while the consumer works on this one.

Ordering: items come out in exactly the source's order, each once; an
exception raised by the source is re-raised to the consumer in its place
(after the items before it), and nothing follows it.  Closing the returned
generator (or dropping it: Spark stops reading after a ``LIMIT``) stops the
helper at its next hand-over and closes the source iterator on the helper
thread, so the source's ``finally`` blocks (closing a ledger handle) run.
"""
from __future__ import annotations

import queue
import threading
from typing import Iterator, TypeVar

T = TypeVar("T")

_END = object()
_POLL_S = 0.1


class _Failure:
    __slots__ = ("exc",)

    def __init__(self, exc: BaseException):
        self.exc = exc


def read_ahead(source: Iterator[T], depth: int = 1) -> Iterator[T]:
    """Items of ``source`` in order, produced up to ``depth`` ahead of the
    consumer; ``depth <= 0`` returns ``source`` itself."""
    if depth <= 0:
        return source
    return _consume(source, depth)


def _consume(source: Iterator[T], depth: int) -> Iterator[T]:
    handoff: queue.Queue = queue.Queue(maxsize=depth)
    stop = threading.Event()
    helper = threading.Thread(target=_produce, args=(source, handoff, stop),
                              name="pybk-read-ahead", daemon=True)
    helper.start()
    try:
        while True:
            item = handoff.get()
            if item is _END:
                return
            if isinstance(item, _Failure):
                raise item.exc
            yield item
    finally:
        stop.set()
        while True:               # unblock a helper waiting on a full queue
            try:
                handoff.get_nowait()
            except queue.Empty:
                break
        helper.join()


def _produce(source: Iterator[T], handoff: queue.Queue, stop: threading.Event) -> None:
    try:
        for item in source:
            if not _put(handoff, item, stop):
                return
        _put(handoff, _END, stop)
    except BaseException as exc:  # noqa: BLE001 - handed to the consumer, raised there
        _put(handoff, _Failure(exc), stop)
    finally:
        close = getattr(source, "close", None)
        if close is not None:
            try:
                close()
            except Exception:     # noqa: BLE001 - the consumer already has its answer
                pass


def _put(handoff: queue.Queue[object], item: object, stop: threading.Event) -> bool:
    while not stop.is_set():
        try:
            handoff.put(item, timeout=_POLL_S)
            return True
        except queue.Full:
            continue
    return False
