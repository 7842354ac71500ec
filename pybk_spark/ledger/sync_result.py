"""``SyncResult``: what a synchronous ``add_entry`` waits on.

Theory of operation
-------------------
A ``concurrent.futures.Future`` waits in a ``Condition``: its completer
takes the condition's lock, notifies a waiter lock, and the waiter then
takes the condition's lock again on waking.  A sync add has one waiter
(its caller) and one completer (the reader thread that released the
entry), so a plain ``Lock`` held from creation and released by the
completer is enough: the caller's ``result()`` blocks in one ``acquire``
and the completer pays one ``release``.  It has the part of a future's
interface the writer uses (``set_result``, ``set_exception``, ``done``,
``result``); a second completion is ignored, as the writer completes each
waiter once.

The deterministic simulation (tests/sim/loop.py) parks a task only inside
``Condition.wait``, so it swaps :data:`new_sync_result` for ``Future``
while it runs.
"""
from __future__ import annotations

import threading
from concurrent.futures import Future
from typing import Any, Callable, Union


class SyncResult:
    __slots__ = ("_gate", "_result", "_exc", "_done")

    def __init__(self) -> None:
        self._gate = threading.Lock()
        self._gate.acquire()            # released once, by the completer
        self._result: Any = None
        self._exc: BaseException | None = None
        self._done = False

    def done(self) -> bool:
        return self._done

    def set_result(self, result: Any) -> None:
        if not self._done:
            self._result, self._done = result, True
            self._release()

    def set_exception(self, exc: BaseException) -> None:
        if not self._done:
            self._exc, self._done = exc, True
            self._release()

    def _release(self) -> None:
        try:
            self._gate.release()
        except RuntimeError:            # two completers raced: the first one counts
            pass

    def result(self) -> Any:
        """The result, or raises the exception; blocks until completed."""
        if not self._done:
            self._gate.acquire()        # let any other waiter (``wait_idle``) pass too
            self._gate.release()
        if self._exc is not None:
            raise self._exc
        return self._result


Completion = Union[SyncResult, "Future[Any]"]     # what a writer's ``Waiter`` completes

# what ``LedgerHandle.add_entry`` makes to wait on
new_sync_result: Callable[[], Completion] = SyncResult
