"""One directory, one process: an exclusive ``flock`` on a lock file inside it.

A bookie holds the lock on its data dir, ``pybk standalone`` on its cluster
dir, for their whole life.  The lock is taken before anything else in the
directory is read or written, so a second process on the same directory
refuses to start without touching any other file there.

``flock`` (not ``fcntl``/POSIX record locks) on purpose: a flock belongs to
the open file description, so it is released only when the process exits
(even on SIGKILL: the kernel closes the descriptor) or calls ``release``,
never because some other code in the process opened and closed the same
file.  The descriptor is close-on-exec, so children do not inherit it.

The holder writes ``pid=<pid> host=<host>`` into the file after locking, so
the refusal names it; the file itself is left behind on exit (harmless: an
unlocked lock file is free).
"""
from __future__ import annotations

import fcntl
import os
import socket
from typing import Optional

from pybk_spark import errors


class DirLock:
    """An exclusive lock on ``directory`` (created if missing) via ``name``."""

    def __init__(self, directory: str | os.PathLike, name: str, what: str = "data dir"):
        self.directory = os.fspath(directory)
        self.path = os.path.join(self.directory, name)
        self.what = what
        self._fd: Optional[int] = None

    def acquire(self) -> "DirLock":
        """Lock, or raise ``errors.DataDirInUse`` naming the holder's pid.
        Never blocks."""
        os.makedirs(self.directory, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _read_holder(fd)
            os.close(fd)
            raise errors.DataDirInUse(
                f"{self.what} {self.directory} is in use by {holder} (lock file {self.path}); "
                "stop that process first, or use another directory") from None
        except BaseException:
            os.close(fd)
            raise
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"pid={os.getpid()} host={socket.gethostname()}\n".encode(), 0)
        self._fd = fd
        return self

    @property
    def held(self) -> bool:
        return self._fd is not None

    def release(self) -> None:
        fd, self._fd = self._fd, None
        if fd is not None:
            os.close(fd)          # closing the only descriptor drops the flock

    def __enter__(self) -> "DirLock":
        return self.acquire()

    def __exit__(self, *exc) -> None:
        self.release()


def _read_holder(fd: int) -> str:
    """``pid N on host H`` from the holder's lock file (it writes it right
    after locking: a holder caught in between reads as unknown)."""
    try:
        text = os.pread(fd, 256, 0).decode(errors="replace")
    except OSError:
        text = ""
    fields = dict(part.split("=", 1) for part in text.split() if "=" in part)
    if "pid" not in fields:
        return "another process (pid unknown)"
    host = f" on host {fields['host']}" if fields.get("host") else ""
    return f"pid {fields['pid']}{host}"
