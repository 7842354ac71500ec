"""Keep a spark-submit job's stdout parsable: progress and diagnostics on stderr.

Theory of operation
-------------------
Under ``spark-submit`` the Python driver is a child of the JVM, which starts
it with its stderr merged into its stdout (PySpark's PythonRunner) and copies
that one stream to spark-submit's stdout.  Whatever the driver writes to
stderr (progress lines, warnings, gRPC's C logging) therefore lands in the
middle of its stdout, and ``--json`` output stops being one JSON document.

:func:`separate_stderr` detects the merge (file descriptors 1 and 2 are the
same pipe) and points descriptor 2 at the JVM's own stderr
(``/proc/<ppid>/fd/2``) when that is a pipe, socket or terminal - so
progress reaches spark-submit's stderr, where Spark's log lines go too.  A
regular file is not reopened (a second writer at another offset would
overwrite the JVM's lines); there, and where ``/proc`` is missing, stderr is
sent to ``/dev/null`` when stdout must stay machine-readable (``--json``).
Outside spark-submit nothing changes.

The JVM, opened as ``proc_root``/``parent_pid``, and the descriptors are
parameters so a test can drive it without Spark.
"""
from __future__ import annotations

import os
import stat
from typing import Optional

SEPARATED = "separated"      # fd 2 now goes to the JVM's stderr
SILENCED = "silenced"        # fd 2 now goes to /dev/null (--json, no usable stderr)
MERGED = "merged"            # left merged (text output: harmless)
UNCHANGED = "unchanged"      # stdout and stderr were already apart


def merged(out_fd: int = 1, err_fd: int = 2) -> bool:
    """True if ``err_fd`` writes into the same pipe/file as ``out_fd``
    (a shared terminal is not a problem: a person reads it)."""
    try:
        out, err = os.fstat(out_fd), os.fstat(err_fd)
    except OSError:
        return False
    if os.isatty(out_fd):
        return False
    return (out.st_dev, out.st_ino) == (err.st_dev, err.st_ino)


def _parent_stderr(proc_root: str, parent_pid: int, out_fd: int) -> Optional[int]:
    path = os.path.join(proc_root, str(parent_pid), "fd", "2")
    try:
        st = os.stat(path)
        out = os.fstat(out_fd)
    except OSError:
        return None
    if (st.st_dev, st.st_ino) == (out.st_dev, out.st_ino):
        return None                   # the JVM's stderr is our stdout too (2>&1)
    if not (stat.S_ISFIFO(st.st_mode) or stat.S_ISSOCK(st.st_mode) or stat.S_ISCHR(st.st_mode)):
        return None
    try:
        return os.open(path, os.O_WRONLY | os.O_APPEND)
    except OSError:
        return None


def separate_stderr(machine_output: bool, *, out_fd: int = 1, err_fd: int = 2,
                    proc_root: str = "/proc", parent_pid: Optional[int] = None) -> str:
    """Make ``err_fd`` stop writing into ``out_fd`` (see module docstring);
    returns what was done."""
    if not merged(out_fd, err_fd):
        return UNCHANGED
    target = _parent_stderr(proc_root, os.getppid() if parent_pid is None else parent_pid,
                            out_fd)
    outcome = SEPARATED
    if target is None:
        if not machine_output:
            return MERGED
        target = os.open(os.devnull, os.O_WRONLY)
        outcome = SILENCED
    try:
        os.dup2(target, err_fd)
    finally:
        os.close(target)
    return outcome
