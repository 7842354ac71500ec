"""Child-process bookkeeping for launchers: nothing we start outlives us.

Every subprocess a launcher starts goes through ``spawn`` (``pybk
standalone``, LocalCluster, BookieProcess, EtcdProcess, the chaos harness).
Children are started in their own session so a terminal's Ctrl-C reaches
only us, and we decide the shutdown order.  Two layers make sure they die
with us:

* a clean exit: every child is ``register``-ed and an atexit hook terminates
  whatever is still alive (SIGTERM, then SIGKILL);
* any exit, even SIGKILL of the parent: on Linux the child asks the kernel
  for ``PR_SET_PDEATHSIG`` (SIGKILL by default) in a ``preexec_fn``, so it is
  killed the moment its parent goes away.  A child whose parent died before
  the request took effect (between fork and prctl) kills itself at once.

PDEATHSIG fires when the *thread* that forked the child exits, not the
process.  So ``spawn`` forks on the main thread when called from it, and
from any other thread hands the fork to one long-lived daemon thread
("procs-spawner") that lives as long as the process: a bookie restarted by a
short-lived nemesis or worker thread does not die when that thread ends.
Elsewhere than Linux there is no PDEATHSIG; only the atexit layer remains.
"""
from __future__ import annotations

import atexit
import ctypes
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from typing import Callable

_LIVE: dict[int, subprocess.Popen] = {}
_LOCK = threading.Lock()


PR_SET_PDEATHSIG = 1


def _load_prctl():
    if not sys.platform.startswith("linux"):
        return None
    try:
        return ctypes.CDLL(None, use_errno=True).prctl    # resolved now, not after fork
    except (OSError, AttributeError):
        return None


_PRCTL = _load_prctl()


def die_with_parent(sig: int = signal.SIGKILL) -> Callable[[], None] | None:
    """A ``preexec_fn`` that makes the child get ``sig`` when the calling
    thread (see the module docstring) exits; None where unsupported."""
    if _PRCTL is None:
        return None
    parent = os.getpid()

    def preexec() -> None:
        _PRCTL(PR_SET_PDEATHSIG, int(sig), 0, 0, 0)
        if os.getppid() != parent:         # parent already gone: no signal will come
            os.kill(os.getpid(), sig)
    return preexec


class _Spawner:
    """One long-lived daemon thread that forks for non-main threads."""

    def __init__(self):
        self._lock = threading.Lock()
        self._queue: "queue.SimpleQueue" = queue.SimpleQueue()
        self._thread: threading.Thread | None = None

    def call(self, fn: Callable[[], subprocess.Popen]) -> subprocess.Popen:
        with self._lock:
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._loop, name="procs-spawner",
                                                daemon=True)
                self._thread.start()
        box: "queue.SimpleQueue" = queue.SimpleQueue()
        self._queue.put((fn, box))
        ok, value = box.get()
        if ok:
            return value
        raise value

    def _loop(self) -> None:
        while True:
            fn, box = self._queue.get()
            try:
                box.put((True, fn()))
            except BaseException as exc:  # noqa: BLE001 - handed to the caller
                box.put((False, exc))


_SPAWNER = _Spawner()


def spawn(args, *, death_signal: int = signal.SIGKILL, register_child: bool = True,
          **popen_kwargs) -> subprocess.Popen:
    """``subprocess.Popen(args, start_new_session=True, **popen_kwargs)`` for a
    child that dies with this process, even if it is SIGKILLed."""
    popen_kwargs.setdefault("start_new_session", True)
    preexec = die_with_parent(death_signal)

    def start() -> subprocess.Popen:
        proc = subprocess.Popen(args, preexec_fn=preexec, **popen_kwargs)
        if register_child:
            register(proc)
        return proc
    if preexec is None or threading.current_thread() is threading.main_thread():
        return start()
    return _SPAWNER.call(start)


def register(proc: subprocess.Popen) -> None:
    with _LOCK:
        _LIVE[proc.pid] = proc


def unregister(proc: subprocess.Popen) -> None:
    with _LOCK:
        _LIVE.pop(proc.pid, None)


def terminate(proc: subprocess.Popen, grace: float = 10.0) -> int | None:
    """SIGTERM, wait up to ``grace`` seconds, then SIGKILL; reaps the child.
    If the process is SIGSTOPped, SIGCONT is sent too so SIGTERM is handled."""
    try:
        if proc.poll() is None:
            if grace > 0:
                _signal(proc, signal.SIGTERM)
                _signal(proc, signal.SIGCONT)
                try:
                    proc.wait(grace)
                except subprocess.TimeoutExpired:
                    pass
            if proc.poll() is None:
                _signal(proc, signal.SIGKILL)
                proc.wait()
        return proc.returncode
    finally:
        unregister(proc)


def _signal(proc: subprocess.Popen, sig: int) -> None:
    try:
        proc.send_signal(sig)
    except (ProcessLookupError, OSError):
        pass


def kill_all(grace: float = 5.0) -> None:
    with _LOCK:
        live = list(_LIVE.values())
    for proc in live:
        _signal(proc, signal.SIGTERM)
        _signal(proc, signal.SIGCONT)
    deadline = time.monotonic() + grace
    for proc in live:
        try:
            proc.wait(max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            pass
        if proc.poll() is None:
            _signal(proc, signal.SIGKILL)
            try:
                proc.wait(5)
            except subprocess.TimeoutExpired:
                pass
        unregister(proc)


def pid_alive(pid: int) -> bool:
    """True if ``pid`` exists and is not a zombie (reads /proc)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            state = f.read().rsplit(")", 1)[1].split()[0]
        return state != "Z"
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return False


def children_of(pid: int) -> list[int]:
    """Direct children of ``pid`` found by scanning /proc."""
    out = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            if int(fields[1]) == pid:
                out.append(int(entry))
        except (OSError, IndexError, ValueError):
            continue
    return out


atexit.register(kill_all)
