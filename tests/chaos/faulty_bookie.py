"""A test-only ``bookie-server`` with a planted storage fault.

    python tests/chaos/faulty_bookie.py --fault FAULT [bookie-server args...]

Runs ``bookie_server.__main__.main`` with ``make_bookie`` building a Bookie
whose journal syscalls (its test seams: ``pwritev``, ``fsync``) misbehave.
Production code has no fault switch; this module is the only way in.

Faults:
  * ``ack_before_fsync``: the journal's pwritev reports every byte written
    but writes nothing, so groups are acknowledged without being on disk
    (data reaches disk only at the next checkpoint; a SIGKILL before it loses
    acknowledged entries: the chaos checker must see I1 violations).  Big
    batches are indexed at journal offsets that hold no bytes; the planted
    bug is meant for small entries.
  * ``eio_fsync_when=PATH``: every journal fdatasync fails with EIO once PATH
    exists (the test creates it when it wants the disk to "fail").
"""
from __future__ import annotations

import argparse
import errno
import functools
import os
import sys


def _lying_pwritev(fd: int, buffers: list, offset: int) -> int:
    return sum(len(b) for b in buffers)


def _eio_fsync_when(trigger: str, fd: int) -> None:
    if os.path.exists(trigger):
        raise OSError(errno.EIO, "injected EIO (faulty_bookie)")
    os.fdatasync(fd)


def seams(fault: str) -> dict:
    """Bookie keyword arguments planting ``fault``."""
    if fault == "ack_before_fsync":
        return {"pwritev": _lying_pwritev}
    if fault.startswith("eio_fsync_when="):
        return {"fsync": functools.partial(_eio_fsync_when, fault.split("=", 1)[1])}
    raise SystemExit(f"faulty_bookie: unknown --fault {fault!r}")


def command(fault: str) -> list[str]:
    """The argv prefix that launches this entry point (instead of
    ``python -m bookie_server``)."""
    return [sys.executable, os.path.abspath(__file__), "--fault", fault]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="faulty_bookie")
    p.add_argument("--fault", required=True)
    args, rest = p.parse_known_args(sys.argv[1:] if argv is None else argv)
    from bookie_server.__main__ import main as bookie_main
    from bookie_server.bookie import Bookie
    return bookie_main(rest, make_bookie=functools.partial(Bookie, **seams(args.fault)))


if __name__ == "__main__":
    sys.exit(main())
