"""``add_entry_async``'s futures (``AddFuture``) against real etcd + real
bookie-server processes (LocalCluster): they work with
``concurrent.futures.wait`` / ``as_completed``, ``result`` / ``exception``
and ``add_done_callback`` whether the waiter comes before or after the
completion, each callback runs once, and errors reach each future with
their types.  No timing thresholds: timeouts only bound a hung test, and a
short ``wait`` is used only while two of three bookies are stopped (Qa=2:
nothing can be acknowledged then)."""
from __future__ import annotations

import concurrent.futures as cf
import signal
import threading
from concurrent.futures import Future, ThreadPoolExecutor

import pytest

from pybk_spark import errors
from pybk_spark.ledger.client import BookKeeper


def _bk(cluster, **conf):
    base = {"explicit_lac_interval_ms": 0}
    base.update(conf)
    return BookKeeper(cluster.metadata_uri, conf=base)


class _Calls:
    """Which futures each callback saw, and how often."""

    def __init__(self) -> None:
        self.seen: list[Future] = []
        self.threads: set[int] = set()

    def __call__(self, f: Future) -> None:
        self.seen.append(f)
        self.threads.add(threading.get_ident())

    def count(self, f: Future) -> int:
        return sum(1 for s in self.seen if s is f)


def test_futures_waited_on_before_and_after_completion(cluster):
    bk = _bk(cluster, add_timeout_s=120.0)
    stopped: list[str] = []
    try:
        lh = bk.create_ledger(3, 3, 2)
        early = [lh.add_entry_async(b"e%d" % i) for i in range(50)]
        assert [f.result(timeout=120) for f in early] == list(range(50))
        assert isinstance(early[0], Future)

        stopped = list(lh.metadata.current_ensemble[:2])
        for b in stopped:
            cluster.stop_bookie(b)
        late = [lh.add_entry_async(b"l%d" % i) for i in range(300)]
        calls = _Calls()
        for f in early + late:
            f.add_done_callback(calls)          # done ones: at once; pending ones: later
        assert all(calls.count(f) == 1 for f in early) and not any(calls.count(f) for f in late)
        waited = cf.wait(late, timeout=0.2)
        assert not waited.done and len(waited.not_done) == len(late)
        assert all(f.running() and not f.done() and not f.cancel() and not f.cancelled()
                   for f in late)
        with pytest.raises(cf.TimeoutError):
            late[0].result(timeout=0.05)
        with pytest.raises(cf.TimeoutError):
            late[1].exception(timeout=0.05)
        first_done = cf.wait(early + late, return_when=cf.FIRST_COMPLETED, timeout=120)
        assert set(early) <= first_done.done

        with ThreadPoolExecutor(4) as pool:
            results = pool.submit(lambda: [f.result(timeout=120) for f in late])
            exceptions = pool.submit(lambda: [f.exception(timeout=120) for f in reversed(late)])
            all_done = pool.submit(cf.wait, late, 120)
            yielded = pool.submit(lambda: list(cf.as_completed(late, timeout=120)))
            for b in stopped:
                cluster.resume_bookie(b)
            stopped = []
            assert results.result(timeout=120) == list(range(50, 350))
            assert exceptions.result(timeout=120) == [None] * len(late)
            assert all_done.result(timeout=120).done == set(late)
            assert sorted(map(id, yielded.result(timeout=120))) == sorted(map(id, late))
        assert all(calls.count(f) == 1 for f in early + late)
        after = _Calls()
        late[-1].add_done_callback(after)       # added once done: runs at once, once
        assert after.seen == [late[-1]] and after.threads == {threading.get_ident()}
        assert list(cf.as_completed(late, timeout=120))[-1].result() in range(50, 350)
        lh.close()
    finally:
        for b in stopped:
            cluster.resume_bookie(b)
        bk.close()


def test_close_completes_every_queued_future_first(cluster):
    bk = _bk(cluster)
    try:
        lh = bk.create_ledger(3, 3, 2)
        futs = [lh.add_entry_async(b"q%d" % i) for i in range(3000)]
        mid = lh.add_entry(b"sync")             # after the queued ones, in call order
        futs += [lh.add_entry_async(bytearray(b"r%d" % i)) for i in range(500)]
        lh.close()
        assert all(f.done() for f in futs)      # close() returned: every one completed
        assert [f.result() for f in futs[:3000]] == list(range(3000)) and mid == 3000
        assert [f.result() for f in futs[3000:]] == list(range(3001, 3501))
        rh = bk.open_ledger(lh.ledger_id, recovery=False)
        assert [e.payload for e in rh.read(2999, 3001)] == [b"q2999", b"sync", b"r0"]
    finally:
        bk.close()


def test_oversized_payload_fails_its_own_future(cluster):
    bk = _bk(cluster, max_entry_size_bytes=4096)
    try:
        lh = bk.create_ledger(3, 3, 2)
        payloads = [b"a", b"z" * 5000, b"b", b"c", b"y" * 4097, b"d"]
        futs = [lh.add_entry_async(p) for p in payloads]
        waited = cf.wait(futs, timeout=120, return_when=cf.ALL_COMPLETED)
        assert waited.done == set(futs)
        for k in (1, 4):
            assert isinstance(futs[k].exception(), errors.TooLarge)
            with pytest.raises(errors.TooLarge):
                futs[k].result()
        assert [futs[k].result() for k in (0, 2, 3, 5)] == [0, 1, 2, 3]   # no id consumed
        lh.close()
    finally:
        bk.close()


def test_fenced_writer_fails_every_pending_future(cluster):
    writer_bk = _bk(cluster)
    reader_bk = _bk(cluster)
    try:
        lh = writer_bk.create_ledger(3, 3, 2)
        assert lh.add_entries([b"x%d" % i for i in range(10)]) == list(range(10))
        reader_bk.open_ledger(lh.ledger_id)          # fencing open: the writer is fenced
        futs = [lh.add_entry_async(b"f%d" % i) for i in range(500)]
        calls = _Calls()
        for f in futs:
            f.add_done_callback(calls)
        stop = cf.wait(futs, timeout=120, return_when=cf.FIRST_EXCEPTION)
        assert stop.done
        failed = list(cf.as_completed(futs, timeout=120))
        assert len(failed) == len(futs)
        for f in failed:
            exc = f.exception()
            assert isinstance(exc, errors.LedgerFenced) and exc.outcome_known is False
            with pytest.raises(errors.LedgerFenced):
                f.result()
        assert all(calls.count(f) == 1 for f in futs)
        lh.close()
        assert reader_bk.get_ledger_metadata(lh.ledger_id).last_entry_id == 9
    finally:
        writer_bk.close()
        reader_bk.close()


def test_a_waiter_on_each_of_many_pipelined_adds_wakes(cluster):
    """Tens of thousands of pipelined adds, each waited on in turn (a waiter
    often arriving as its batch's completer runs), over four clients: every
    waiter wakes.  An alarm turns a waiter left asleep on a completed add
    into a failure instead of a hung test."""
    def stalled(_signum, _frame):
        raise AssertionError("a waiter slept on a completed add")
    previous = signal.signal(signal.SIGALRM, stalled)
    payload = b"x" * 1024
    try:
        for window in (2, 4, 8, 16):
            with _bk(cluster, async_add_window=window) as bk:
                lh = bk.create_ledger(3, 3, 2)
                futs = [lh.add_entry_async(payload) for _ in range(30_000)]
                signal.alarm(300)
                got = [f.result() for f in futs]
                signal.alarm(0)
                assert got == list(range(30_000))
                lh.close()
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)
