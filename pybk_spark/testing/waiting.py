"""Polling a condition with a bound: the one readiness wait the tests share.

``wait_until(predicate, what, timeout)`` calls ``predicate`` until it returns
something truthy and returns that value; past ``timeout`` seconds it raises
``TimeoutError`` naming ``what``.  The sleep between calls is a poll
interval (growing from 50 ms to 0.5 s), never a synchronisation: nothing
depends on how long it sleeps.
"""
from __future__ import annotations

import time
from typing import Callable, TypeVar

T = TypeVar("T")


def wait_until(predicate: Callable[[], T], what: str = "condition",
               timeout: float = 60.0) -> T:
    deadline = time.monotonic() + timeout
    delay = 0.05
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout:g}s waiting for {what}")
        time.sleep(delay)
        delay = min(delay * 2, 0.5)
