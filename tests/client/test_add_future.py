"""``AddFuture`` (pybk_spark/ledger/add_future.py) on its own: a completer
thread racing late waiters of every kind (``result``, ``exception``,
``add_done_callback``, ``concurrent.futures.wait`` / ``as_completed``).
Every waiter returns, sees the right outcome, and each callback runs once.
No timing thresholds: the timeouts only bound a hung test."""
from __future__ import annotations

import concurrent.futures as cf
import random
import sys
import threading

import pytest

from pybk_spark import errors
from pybk_spark.ledger.add_future import AddFuture, complete_ids, fail_all

N = 4000


def _race(complete) -> tuple[list[AddFuture], dict[int, int], dict[int, int]]:
    """The futures, and per future how many callbacks were added and run."""
    futs = [AddFuture() for _ in range(N)]
    calls: dict[int, int] = {}
    added: dict[int, int] = {}
    lock = threading.Lock()

    def add(f) -> None:
        with lock:
            added[id(f)] = added.get(id(f), 0) + 1
        f.add_done_callback(callback)

    def callback(f) -> None:
        with lock:
            calls[id(f)] = calls.get(id(f), 0) + 1

    failures: list[BaseException] = []

    def waiter(seed: int) -> None:
        try:
            wait_on(random.Random(seed))
        except BaseException as exc:  # noqa: BLE001 - reported by the test
            failures.append(exc)

    def wait_on(rng: random.Random) -> None:
        for k in rng.sample(range(N), 400):
            kind = rng.randrange(4)
            if kind == 0:
                futs[k].exception(timeout=30)
            elif kind == 1:
                add(futs[k])
            elif kind == 2:
                assert not cf.wait(futs[k:k + 3], timeout=30).not_done
            else:
                list(cf.as_completed(futs[k:k + 3], timeout=30))

    threads = [threading.Thread(target=waiter, args=(s,)) for s in range(4)]
    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)                 # switch threads often: interleave the two sides
    try:
        for t in threads:
            t.start()
        for start in range(0, N, 100):
            complete(futs[start:start + 100], start)
        for t in threads:
            t.join(timeout=120)
            assert not t.is_alive()
    finally:
        sys.setswitchinterval(interval)
    assert not failures
    for f in futs:
        add(f)                                  # done: runs at once
    return futs, added, calls


def test_completer_racing_late_waiters_results():
    futs, added, calls = _race(complete_ids)
    assert [f.result(timeout=0) for f in futs] == list(range(N))
    assert all(f.done() and not f.running() and not f.cancel() for f in futs)
    assert calls == added                       # each added callback ran, once


def test_completer_racing_late_waiters_exceptions():
    exc = errors.LedgerFenced("fenced")
    futs, added, calls = _race(lambda chunk, _start: fail_all(chunk, exc))
    assert calls == added
    for f in futs:
        assert f.exception(timeout=0) is exc
        with pytest.raises(errors.LedgerFenced):
            f.result(timeout=0)


def test_callbacks_run_once_each():
    f = AddFuture()
    seen: list[int] = []
    f.add_done_callback(lambda g: seen.append(g.result()))
    f.add_done_callback(lambda g: seen.append(-g.result()))
    complete_ids([f], 7)
    f.add_done_callback(lambda g: seen.append(100))
    assert seen == [7, -7, 100]


def test_pending_future_times_out_and_cannot_be_cancelled():
    f = AddFuture()
    assert f.running() and not f.done() and not f.cancel() and not f.cancelled()
    with pytest.raises(cf.TimeoutError):
        f.result(timeout=0.01)
    assert cf.wait([f], timeout=0.01).not_done == {f}
    f.set_result(3)
    assert f.result() == 3 and cf.wait([f], timeout=0).done == {f}
    assert isinstance(f, cf.Future)
