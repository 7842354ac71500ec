"""``AddFuture``: what ``add_entry_async`` returns, completed in bulk.

Theory of operation
-------------------
A pipelined add needs a future per call, and a ``concurrent.futures.Future``
builds a ``Condition`` (with its ``RLock``) and two lists when it is made,
and its completer takes that condition and notifies it.  Most pipelined
futures are completed before anyone waits on them, so ``AddFuture`` (a
``Future`` subclass: ``isinstance``, ``concurrent.futures.wait`` and
``as_completed`` keep working) makes its condition, waiter list and callback
list only when a caller first needs them (``result`` / ``exception`` on a
pending future, ``add_done_callback``, ``wait`` / ``as_completed``, which
reach them through the ``_condition`` property).  A future with nobody
waiting is completed by four slot stores (``complete_ids``,
``fail_all``: a whole batch in one loop).

While its add is queued the future also holds the add's payload
(``_payload``, dropped when it completes), so the handle's queue holds one
object per call: the future is the one object a call leaves for the
cyclic garbage collector, whose young collections, and the full ones they
lead to, come at a rate set by such objects.

States: an ``AddFuture`` is ``RUNNING`` from the start (the add is queued
and will be sent; it cannot be taken back, so ``cancel()`` is False, as for
an executor job that has started) and ``FINISHED`` once completed.  It has
one completer, the handle's writer, which completes it once.

The completer and a late waiter meet at one module lock, ``_MAKING``,
which makes every condition:

* completer (``complete_ids`` / ``fail_all``, once per batch): under
  ``_MAKING``, a future with no condition is finished by storing its
  outcome and ``_state = FINISHED``; a future with one is finished after
  ``_MAKING`` is released, under its condition, as ``Future`` does: outcome
  and state stored, the ``wait`` / ``as_completed`` waiters handed the
  future, ``notify_all``, then the callbacks added so far are run;
* waiter (``result`` / ``exception`` on a pending future,
  ``add_done_callback``, ``wait`` / ``as_completed``): makes the condition
  and the two lists under ``_MAKING`` (two late waiters get the same one),
  takes the condition, reads ``_state``, and while it holds the condition
  either sees ``FINISHED`` or registers itself.

A future finished without a condition was finished before any condition
existed, so a waiter that makes one reads ``FINISHED`` and neither waits
nor is handed the future later; a future with a condition changes state
only under it, so a waiter holding it sees the state and its registration
change together (``as_completed`` never gets a future twice, ``wait``
never counts one twice).  Each callback runs exactly once: by the
completer if it was added before the completer took the condition, by
``add_done_callback`` itself otherwise.

The deterministic simulation (tests/sim/loop.py) parks a task only inside
``Condition.wait``: a late waiter here waits in one, so the simulation runs
these futures as they are.
"""
from __future__ import annotations

import logging
import threading
from concurrent.futures import Future
from concurrent.futures._base import FINISHED, RUNNING
from typing import Any, Callable, Sequence

log = logging.getLogger("concurrent.futures")
_MAKING = threading.Lock()         # makes a late waiter's condition


class AddFuture(Future[int]):
    """A ``concurrent.futures.Future`` of an entry id (module doc)."""

    # slots, not the instance dict: a completer's attribute stores and a late
    # waiter's must land in one place (on CPython 3.11 a completer storing
    # ``_state`` into an instance whose dict a waiter has just grown can drop
    # the waiter's ``_cond``, leaving the waiter asleep on a completed add)
    __slots__ = ("_state", "_result", "_exception", "_cond", "_waiters", "_done_callbacks",
                 "_payload")

    def __init__(self, payload: bytes | None = None) -> None:  # noqa: D107 - the condition is made when needed
        self._payload = payload     # the queued add's payload, until it completes
        self._state = RUNNING
        self._result: int | None = None
        self._exception: BaseException | None = None
        self._cond: threading.Condition | None = None

    @property
    def _condition(self) -> threading.Condition:  # type: ignore[override]
        """The condition, made (with the waiter and callback lists) on first use."""
        cond = self._cond
        if cond is None:
            with _MAKING:               # two late waiters get the same one
                cond = self._cond
                if cond is None:
                    self._waiters: list[Any] = []   # concurrent.futures wait() waiters
                    self._done_callbacks: list[Callable[[Future[int]], object]] = []
                    cond = self._cond = threading.Condition()
        return cond

    # -- the Future interface ----------------------------------------------------------
    def cancel(self) -> bool:
        return False                # queued adds are sent: nothing to take back

    def cancelled(self) -> bool:
        return False

    def running(self) -> bool:
        return self._state is not FINISHED

    def done(self) -> bool:
        return self._state is FINISHED

    def result(self, timeout: float | None = None) -> int:
        if self._state is not FINISHED:
            self._wait(timeout)
        exc = self._exception
        if exc is not None:
            try:
                raise exc
            finally:
                del exc, self       # no frame -> exception -> traceback cycle
        result = self._result
        assert result is not None
        return result

    def exception(self, timeout: float | None = None) -> BaseException | None:
        if self._state is not FINISHED:
            self._wait(timeout)
        return self._exception

    def add_done_callback(self, fn: Callable[[Future[int]], object]) -> None:
        if self._state is not FINISHED:
            cond = self._condition
            with cond:
                if self._state is not FINISHED:
                    self._done_callbacks.append(fn)
                    return
        try:
            fn(self)
        except Exception:
            log.exception("exception calling callback for %r", self)

    def set_result(self, result: int) -> None:
        _complete((self,), result, None)

    def set_exception(self, exception: BaseException | None) -> None:
        _complete((self,), None, exception)

    # -- the late-waiter side ----------------------------------------------------------
    def _wait(self, timeout: float | None) -> None:
        cond = self._condition
        with cond:
            if self._state is not FINISHED:
                cond.wait(timeout)
            if self._state is not FINISHED:
                raise TimeoutError()

    def _finish_waited(self, result: int | None, exc: BaseException | None) -> None:
        """Complete a future a waiter made a condition for: as ``Future``
        does, under that condition, so a ``wait`` / ``as_completed`` that
        holds it sees the state and its waiter list change together."""
        cond = self._condition
        with cond:
            self._result, self._exception = result, exc
            self._state = FINISHED
            for waiter in self._waiters:
                if exc is not None:
                    waiter.add_exception(self)
                else:
                    waiter.add_result(self)
            cond.notify_all()
        for fn in self._done_callbacks:
            try:
                fn(self)
            except Exception:
                log.exception("exception calling callback for %r", self)


def _complete(futures: Sequence[AddFuture], first: int | None, exc: BaseException | None) -> None:
    """Complete each of ``futures``: with id ``first + k``, or with ``exc``.
    Under the lock that makes conditions, a future with none is finished by
    slot stores alone (a waiter coming later sees it finished); one with a
    condition is finished under it, after that lock is released."""
    waited: list[tuple[AddFuture, int | None]] = []
    with _MAKING:
        for k, f in enumerate(futures):
            result = None if first is None else first + k
            f._payload = None
            if f._cond is None:
                f._result, f._exception = result, exc
                f._state = FINISHED
            else:
                waited.append((f, result))
    for f, result in waited:
        f._finish_waited(result, exc)


def complete_ids(futures: Sequence[AddFuture], first: int) -> None:
    """Complete ``futures[k]`` with entry id ``first + k``."""
    _complete(futures, first, None)


def fail_all(futures: Sequence[AddFuture], exc: BaseException) -> None:
    """Complete every one of ``futures`` with ``exc``."""
    _complete(futures, None, exc)
