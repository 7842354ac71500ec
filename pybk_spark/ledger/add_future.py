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
waiting is completed by three slot stores (``complete_ids``,
``fail_all``: a whole batch in one loop).

States: an ``AddFuture`` is ``RUNNING`` from the start (the add is queued
and will be sent; it cannot be taken back, so ``cancel()`` is False, as for
an executor job that has started) and ``FINISHED`` once completed.  It has
one completer, the handle's writer, which completes it once.

The handshake between the completer and a late waiter relies on the GIL
(CPython runs one bytecode at a time, so every thread sees the others'
attribute stores in one order):

* completer: store ``_result`` / ``_exception``, then ``_state = FINISHED``,
  then read ``_cond``; if it is set, take it, hand the future to the
  installed ``wait`` / ``as_completed`` waiters, ``notify_all``, release it,
  then run the callbacks added so far;
* waiter: publish the condition (``_cond``, after the two lists, by slot
  stores under a module lock: two late waiters get the same one), take it,
  read ``_state``, and while it holds the condition either
  sees ``FINISHED`` or registers itself (``Condition.wait``, a
  ``wait`` / ``as_completed`` waiter, a callback).

If the completer read no condition, its ``_state`` store came before the
waiter published one, so the waiter reads ``FINISHED`` and does not wait
(and runs its callback itself).  If it read one, it takes it after storing
``_state``: a waiter that read ``RUNNING`` held the condition from that read
until it was registered, so the completer's ``notify_all`` (or its waiter
loop, or its callback loop) finds it.  Each callback therefore runs exactly
once: by the completer if it was added before the completer took the
condition, by ``add_done_callback`` itself otherwise.  A finished future is
never waited on (``result`` reads ``_state`` first).

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
    __slots__ = ("_state", "_result", "_exception", "_cond", "_waiters", "_done_callbacks")

    def __init__(self) -> None:     # noqa: D107 - the condition is made when needed
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
        self._result = result
        self._state = FINISHED
        if self._cond is not None:
            self._wake()

    def set_exception(self, exception: BaseException | None) -> None:
        self._exception = exception
        self._state = FINISHED
        if self._cond is not None:
            self._wake()

    # -- the late-waiter side ----------------------------------------------------------
    def _wait(self, timeout: float | None) -> None:
        cond = self._condition
        with cond:
            if self._state is not FINISHED:
                cond.wait(timeout)
            if self._state is not FINISHED:
                raise TimeoutError()

    def _wake(self) -> None:
        """Completed with a condition made: wake its waiters, run its callbacks."""
        cond = self._condition
        failed = self._exception is not None
        with cond:
            for waiter in self._waiters:
                if failed:
                    waiter.add_exception(self)
                else:
                    waiter.add_result(self)
            cond.notify_all()
        for fn in self._done_callbacks:
            try:
                fn(self)
            except Exception:
                log.exception("exception calling callback for %r", self)


def complete_ids(futures: Sequence[AddFuture], first: int) -> None:
    """Complete ``futures[k]`` with entry id ``first + k``."""
    for f, entry_id in zip(futures, range(first, first + len(futures))):
        f._result = entry_id
        f._state = FINISHED
        if f._cond is not None:
            f._wake()


def fail_all(futures: Sequence[AddFuture], exc: BaseException) -> None:
    """Complete every one of ``futures`` with ``exc``."""
    for f in futures:
        f._exception = exc
        f._state = FINISHED
        if f._cond is not None:
            f._wake()
