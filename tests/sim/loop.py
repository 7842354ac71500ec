"""One seeded event loop that runs the production client deterministically.

Theory of operation
-------------------
Everything that happens in a simulation is an event in one heap ordered by
(simulated time, sequence number): a message reaching a bookie, a reply
reaching a client, a timer, a task being resumed.  Time is ``loop.now``
(the clients' injected clock); randomness is ``loop.rng`` (seeded).

Code that blocks (``add_entry``, a fencing open, a read) runs in a *task*, a
greenlet: one OS thread, one task running at a time, and a task gives the
loop back only where the production code would block.  Those places are
found without changing the client: while a loop is active,
``threading.Condition.wait`` (under ``Future.result``, ``Event.wait``,
``Semaphore.acquire``, ``Condition.wait_for``) and ``concurrent.futures.
wait`` / ``as_completed`` are replaced, for tasks only, by versions that
park the task and resume it from the heap when notified, when a future
completes, or when the timeout passes in simulated time.  ``cf.wait`` and
``as_completed`` hand finished futures out in the caller's order (the
stdlib iterates a set of futures, whose order depends on memory addresses),
so a seed replays the same schedule exactly.  A sync ``add_entry`` waits on
a plain ``Lock`` (pybk_spark/ledger/sync_result.py), which no task could
park in: the loop makes it wait on a ``Future`` instead
(``sync_result.new_sync_result``), whose ``result`` parks in a condition.  The client's executor and
``call_later`` are injected (``SimExecutor``, ``loop.call_later``) and start
tasks, each after a small seeded delay.

Tasks belong to an *owner* (one simulated process: a client); ``kill(owner)``
throws ``SimCrash`` into each of its tasks at the point where it is parked
(a process crash: messages it already sent are still delivered).

Limits: a task must not park while holding a plain ``threading.Lock`` or
``RLock`` that another task wants (all tasks share one OS thread: a second
``acquire`` of a Lock would hang, of an RLock would succeed).  The client
parks only in conditions it releases, except for the in-flight add
bound (waited for under the handle's submit lock), so the simulation
configures ``max_inflight_adds`` high enough never to block.
"""
from __future__ import annotations

import concurrent.futures as cf
import contextlib
import heapq
import random
import threading
from concurrent.futures import Future

from greenlet import GreenletExit, getcurrent, greenlet

from pybk_spark.ledger import sync_result

_ACTIVE: "SimLoop | None" = None
_orig_wait = threading.Condition.wait
_orig_notify = threading.Condition.notify
_orig_notify_all = threading.Condition.notify_all
_orig_cf_wait = cf.wait
_orig_as_completed = cf.as_completed


class SimCrash(GreenletExit):
    """Thrown into the tasks of a killed owner."""


class SimError(AssertionError):
    """The simulation itself broke (a wait outside a task, no progress)."""


class Task:
    __slots__ = ("g", "owner", "name", "token", "done")

    def __init__(self, g, owner: str, name: str):
        self.g, self.owner, self.name = g, owner, name
        self.token = None         # what the task is parked on (None: runnable / running)
        self.done = False


class SimLoop:
    def __init__(self, seed: int, *, jitter: float = 0.002):
        self.seed = seed
        self.rng = random.Random(seed)
        self.now = 0.0
        self.jitter = jitter
        self._q: list = []
        self.thread_id: int | None = None     # the OS thread running run()
        self._seq = 0
        self._tokens = 0
        self.tasks: dict = {}            # greenlet -> Task
        self.dead: set[str] = set()
        self.cond_waiters: dict = {}     # Condition -> [(task, token)]
        self.events = 0
        self.trace: list[str] = []       # tags of the decisions taken (replay check)
        self.hub = None

    # -- time and events -----------------------------------------------------------------
    def clock(self) -> float:
        return self.now

    def at(self, delay: float, fn, *args) -> None:
        self._seq += 1
        heapq.heappush(self._q, (self.now + max(0.0, delay), self._seq, fn, args))

    def note(self, tag: str) -> None:
        self.trace.append(f"{self.now:.6f} {tag}")

    def run(self, until: float | None = None, max_events: int = 500000) -> None:
        """Process events (in the caller, the hub) until none is left or the
        next one is after ``until``."""
        global _ACTIVE
        prev, _ACTIVE = _ACTIVE, self
        self.hub = getcurrent()
        self.thread_id = threading.get_ident()
        try:
            while self._q:
                if until is not None and self._q[0][0] > until:
                    self.now = until
                    return
                self.now, _, fn, args = heapq.heappop(self._q)
                fn(*args)
                self.events += 1
                if self.events > max_events:
                    raise SimError(f"no end after {max_events} events (t={self.now:.1f})")
        finally:
            _ACTIVE = prev

    # -- tasks ---------------------------------------------------------------------------
    def current(self) -> Task | None:
        return self.tasks.get(getcurrent())

    def spawn(self, fn, *args, owner: str = "", name: str = "", delay: float = 0.0) -> Task | None:
        """Start ``fn(*args)`` as a task of ``owner`` after ``delay`` (plus a
        seeded jitter).  Nothing starts for a dead owner."""
        if owner in self.dead:
            return None
        g = greenlet(lambda _value=None: self._body(task, fn, args))
        task = Task(g, owner, name or getattr(fn, "__name__", "task"))
        self.tasks[g] = task
        task.token = self._new_token()
        self.at(delay + self.rng.uniform(0, self.jitter), self._resume, task, task.token, None)
        return task

    def _body(self, task: Task, fn, args):
        try:
            return fn(*args)
        except GreenletExit:
            return None
        finally:
            task.done = True
            self.tasks.pop(task.g, None)

    def _new_token(self) -> int:
        self._tokens += 1
        return self._tokens

    def _resume(self, task: Task, token, value) -> None:
        if task.done or task.token != token:
            return                           # woken otherwise meanwhile, or finished
        task.token = None
        task.g.parent = getcurrent()         # the hub gets control back
        task.g.switch(value)

    def wake(self, task: Task, token, value=True, delay: float = 0.0) -> None:
        """Resume ``task`` if it is still parked on ``token`` (after a seeded jitter)."""
        self.at(delay + self.rng.uniform(0, self.jitter), self._resume, task, token, value)

    def park(self, timeout: float | None = None, on_park=None):
        """Called by a task: give the loop back until woken (returns the wake
        value) or until ``timeout`` simulated seconds pass (returns False)."""
        task = self.current()
        if task is None:
            raise SimError("blocking wait outside a simulated task")
        token = task.token = self._new_token()
        if on_park is not None:
            on_park(task, token)
        if timeout is not None:
            self.at(timeout, self._resume, task, token, False)
        return self.hub.switch()

    def sleep(self, seconds: float) -> None:
        self.park(seconds)

    def kill(self, owner: str) -> None:
        """The process ``owner`` crashes: its tasks stop where they are parked."""
        self.dead.add(owner)
        self.note(f"kill {owner}")
        for task in [t for t in self.tasks.values() if t.owner == owner]:
            if not task.done and task.g:
                task.token = None
                task.g.parent = getcurrent()
                task.g.throw(SimCrash())
            elif not task.done:              # never started
                task.done = True
                self.tasks.pop(task.g, None)

    def crash_here(self) -> None:
        """Called by a task: its process crashes at this very point (nothing
        after it runs, not even a send), and its other tasks where parked."""
        task = self.current()
        if task is None:
            raise SimError("crash_here outside a simulated task")
        self.dead.add(task.owner)
        self.note(f"kill {task.owner} here")
        for other in [t for t in self.tasks.values() if t.owner == task.owner and t is not task]:
            if not other.done and other.g:
                other.token = None
                other.g.parent = getcurrent()
                other.g.throw(SimCrash())
            elif not other.done:
                other.done = True
                self.tasks.pop(other.g, None)
        raise SimCrash()

    def call_later_for(self, owner: str):
        """A client's injected ``call_later``."""
        def call_later(delay_s: float, fn) -> None:
            self.spawn(fn, owner=owner, name="timer", delay=delay_s)
        return call_later

    # -- the blocking primitives, for tasks ------------------------------------------------
    def cond_wait(self, cond, timeout):
        def register(task, token):
            self.cond_waiters.setdefault(cond, []).append((task, token))
        saved = cond._release_save()
        try:
            return bool(self.park(timeout, register))
        finally:
            cond._acquire_restore(saved)
            waiting = self.cond_waiters.get(cond)
            if waiting is not None:
                waiting[:] = [w for w in waiting if w[0] is not self.current()]
                if not waiting:
                    del self.cond_waiters[cond]

    def cond_notify(self, cond, n: int) -> None:
        waiting = self.cond_waiters.get(cond)
        if not waiting:
            return
        woken, waiting[:] = waiting[:n], waiting[n:]
        for task, token in woken:
            self.wake(task, token, True)

    def wait_any(self, futs: list, timeout: float | None) -> None:
        """Park until one of ``futs`` is done or ``timeout`` passes."""
        def register(task, token):
            for f in futs:
                f.add_done_callback(lambda _f: self.wake(task, token, True))
        if any(f.done() for f in futs):
            return
        self.park(timeout, register)


class SimExecutor:
    """A client's injected executor: every job is a task of ``owner``."""

    def __init__(self, loop: SimLoop, owner: str):
        self.loop, self.owner = loop, owner
        self._shut = False

    def submit(self, fn, *args, **kwargs) -> Future:
        if self._shut:
            raise RuntimeError("cannot schedule new futures after shutdown")
        fut: Future = Future()

        def job():
            try:
                fut.set_result(fn(*args, **kwargs))
            except GreenletExit:
                raise
            except BaseException as exc:  # noqa: BLE001 - the future carries it, as in a pool
                fut.set_exception(exc)
        self.loop.spawn(job, owner=self.owner, name=getattr(fn, "__name__", "job"))
        return fut

    def shutdown(self, wait: bool = True, **_kw) -> None:
        self._shut = True


class _OrderedSet(set):
    """A set that iterates in insertion order (cf.wait's result, replayable)."""

    def __init__(self, items=()):
        items = list(items)
        super().__init__(items)
        self._order = items

    def __iter__(self):
        return iter([x for x in self._order if x in self])


def _loop_here():
    """The active loop if this OS thread runs it.  Other threads (a daemon
    left running by an earlier test, say) keep the real primitives: they are
    not the simulation's, and must not touch its state."""
    loop = _ACTIVE
    if loop is None or loop.thread_id != threading.get_ident():
        return None
    return loop


def _task_loop():
    loop = _loop_here()
    if loop is None or loop.current() is None:
        return None
    return loop


def _patched_wait(self, timeout=None):
    loop = _loop_here()
    if loop is None:
        return _orig_wait(self, timeout)
    if loop.current() is None:
        raise SimError("blocking wait on the simulation loop (outside a task)")
    return loop.cond_wait(self, timeout)


def _patched_notify(self, n=1):
    _orig_notify(self, n)
    loop = _loop_here()
    if loop is not None:
        loop.cond_notify(self, n)


def _patched_notify_all(self):
    _orig_notify_all(self)
    loop = _loop_here()
    if loop is not None:
        loop.cond_notify(self, 1 << 30)


def _patched_cf_wait(fs, timeout=None, return_when=cf.ALL_COMPLETED):
    loop = _task_loop()
    if loop is None:
        return _orig_cf_wait(fs, timeout, return_when)
    fs = list(dict.fromkeys(fs))
    deadline = None if timeout is None else loop.now + timeout
    while True:
        done = [f for f in fs if f.done()]
        if return_when == cf.FIRST_COMPLETED and done:
            break
        if return_when == cf.FIRST_EXCEPTION and any(
                not f.cancelled() and f.exception() is not None for f in done):
            break
        if len(done) == len(fs):
            break
        remaining = None if deadline is None else deadline - loop.now
        if remaining is not None and remaining <= 0:
            break
        loop.wait_any([f for f in fs if not f.done()], remaining)
    return cf._base.DoneAndNotDoneFutures(_OrderedSet(done),
                                          _OrderedSet(f for f in fs if f not in done))


def _patched_as_completed(fs, timeout=None):
    loop = _task_loop()
    if loop is None:
        yield from _orig_as_completed(fs, timeout)
        return
    pending = list(dict.fromkeys(fs))
    deadline = None if timeout is None else loop.now + timeout
    while pending:
        done = [f for f in pending if f.done()]
        if done:
            for f in done:
                pending.remove(f)
                yield f
            continue
        remaining = None if deadline is None else deadline - loop.now
        if remaining is not None and remaining <= 0:
            raise cf.TimeoutError(f"{len(pending)} (of {len(fs)}) futures unfinished")
        loop.wait_any(pending, remaining)


@contextlib.contextmanager
def patched_primitives():
    """Install the task-aware blocking primitives for the duration (they
    behave as the originals outside a running ``SimLoop``)."""
    saved = (threading.Condition.wait, threading.Condition.notify,
             threading.Condition.notify_all, cf.wait, cf.as_completed)
    saved_sync_result = sync_result.new_sync_result
    sync_result.new_sync_result = Future
    threading.Condition.wait = _patched_wait
    threading.Condition.notify = _patched_notify
    threading.Condition.notify_all = _patched_notify_all
    cf.wait = _patched_cf_wait
    cf.as_completed = _patched_as_completed
    try:
        yield
    finally:
        (threading.Condition.wait, threading.Condition.notify,
         threading.Condition.notify_all, cf.wait, cf.as_completed) = saved
        sync_result.new_sync_result = saved_sync_result
