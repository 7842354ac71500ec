"""Child-process bookkeeping for launchers: nothing we start outlives us.

Every subprocess a launcher starts is ``register``-ed; an atexit hook (and a
SIGTERM handler installed by ``install_signal_handlers`` for long-running
entry points) terminates whatever is still alive.  Children are started in
their own session so a terminal's Ctrl-C reaches only us, and we decide the
shutdown order.
"""
from __future__ import annotations

import atexit
import os
import signal
import subprocess
import threading
import time

_LIVE: dict[int, subprocess.Popen] = {}
_LOCK = threading.Lock()


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
