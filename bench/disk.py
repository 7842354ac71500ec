"""The disk's own limits, measured in the same run as the bookie benchmark.

* ``fsync_rate``: 4 KiB append + fdatasync, one at a time (rate, p50, p99).
* ``seq_bandwidth``: sequential 1 MiB writes with an fdatasync every
  ``sync_every`` bytes (MB/s): 64 MiB = the disk's streaming bandwidth,
  1 MiB = what a journal committing each 1 MiB batch on its own can reach.
  512 MiB of it (``seq_write``) is the *burst* probe: short enough for a
  VM's host cache or a cloud disk's burst allowance to absorb.
* ``seq_sustained``: the same writes for 4x as long, timed over the second
  half only (what the disk keeps up once the burst is spent);
  ``burst_vs_sustained``
  records the spread.
* ``seq_overwrite``: a file written once (every block allocated), then
  overwritten in place with the same writes and fdatasyncs, timed: the
  device's sequential bandwidth where nothing is being allocated.  On this
  VM a block's first write is what is slow and what varies: the
  fresh-file sustained figure moves between 78 and 379 MB/s from one
  probe to the next while this one stays at 2.2-2.6 GB/s, so the ratios
  against the disk divide by it (a denominator that cannot swing
  2x between runs; the stricter one, too).
* ``seq_direct``: the journal's pattern for big groups
  (journal/direct_write.py): a preallocated file (``posix_fallocate``)
  written sequentially with ``O_DIRECT`` from one page-aligned 1 MiB buffer,
  fdatasync every 64 MiB: what the device takes around the page cache.
  ``direct_vs_overwrite`` says how far that is from the overwrite probe
  (whose writes land in cached pages first).  Null, with the reason, where
  the file system refuses ``O_DIRECT``.
"""
from __future__ import annotations

import os
import tempfile
import time
from typing import Any

import numpy as np


def fsync_rate(directory: str, count: int = 2000, size: int = 4096) -> dict:
    path = os.path.join(directory, "fsync.probe")
    buf = os.urandom(size)
    lat = np.empty(count)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        t_start = time.perf_counter()
        for i in range(count):
            t0 = time.perf_counter()
            os.write(fd, buf)
            os.fdatasync(fd)
            lat[i] = time.perf_counter() - t0
        elapsed = time.perf_counter() - t_start
    finally:
        os.close(fd)
        os.unlink(path)
    return {"ops_per_s": count / elapsed, "p50_ms": float(np.percentile(lat, 50) * 1e3),
            "p99_ms": float(np.percentile(lat, 99) * 1e3)}


def seq_bandwidth(directory: str, total: int = 512 << 20, chunk: int = 1 << 20,
                  sync_every: int = 64 << 20) -> dict:
    path = os.path.join(directory, "seq.probe")
    buf = os.urandom(chunk)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        elapsed = _timed_pass(fd, buf, total, sync_every)
    finally:
        os.close(fd)
        os.unlink(path)
    return {"mb_per_s": total / elapsed / 1e6, "bytes": total}


def _timed_pass(fd: int, buf, total: int, sync_every: int) -> float:
    """Seconds to write ``total`` bytes of ``buf`` chunks at ``fd``'s offset,
    with an fdatasync every ``sync_every`` bytes and one at the end."""
    t0 = time.perf_counter()
    written = since_sync = 0
    while written < total:
        n = os.write(fd, buf)
        written += n
        since_sync += n
        if since_sync >= sync_every:
            os.fdatasync(fd)
            since_sync = 0
    os.fdatasync(fd)
    return time.perf_counter() - t0


def seq_sustained(directory: str, total: int, chunk: int = 1 << 20,
                  sync_every: int = 64 << 20) -> dict:
    """Sequential writes of ``total`` bytes, MB/s over the second half only."""
    path = os.path.join(directory, "sustained.probe")
    buf = os.urandom(chunk)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    first = (total // 2 // sync_every) * sync_every or total // 2
    try:
        t_first = _timed_pass(fd, buf, first, sync_every)
        t_second = _timed_pass(fd, buf, total - first, sync_every)
    finally:
        os.close(fd)
        os.unlink(path)
    return {"mb_per_s": (total - first) / t_second / 1e6,
            "whole_mb_per_s": total / (t_first + t_second) / 1e6, "bytes": total}


def seq_overwrite(directory: str, total: int, chunk: int = 1 << 20,
                  sync_every: int = 64 << 20) -> dict:
    """MB/s of sequential overwrites of an allocated ``total``-byte file."""
    path = os.path.join(directory, "overwrite.probe")
    buf = os.urandom(chunk)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        for _ in range(total // chunk):           # allocate every block first
            os.write(fd, buf)
        os.fdatasync(fd)
        os.lseek(fd, 0, os.SEEK_SET)
        elapsed = _timed_pass(fd, buf, (total // chunk) * chunk, sync_every)
    finally:
        os.close(fd)
        os.unlink(path)
    return {"mb_per_s": (total // chunk) * chunk / elapsed / 1e6, "bytes": total}


def seq_direct(directory: str, total: int, chunk: int = 1 << 20,
               sync_every: int = 64 << 20) -> dict:
    """MB/s of sequential ``O_DIRECT`` writes into a preallocated file."""
    import mmap
    path = os.path.join(directory, "direct.probe")
    buf = mmap.mmap(-1, chunk)                  # page-aligned, as O_DIRECT needs
    buf.write(os.urandom(chunk))
    total = (total // chunk) * chunk
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        os.posix_fallocate(fd, 0, total)
        os.fdatasync(fd)
        try:
            dfd = os.open(path, os.O_WRONLY | os.O_DIRECT)
        except OSError as exc:
            return {"mb_per_s": None, "bytes": total, "reason": f"no O_DIRECT here: {exc}"}
        try:
            elapsed = _timed_pass(dfd, buf, total, sync_every)
        finally:
            os.close(dfd)
    finally:
        os.close(fd)
        os.unlink(path)
        buf.close()
    return {"mb_per_s": total / elapsed / 1e6, "bytes": total}


def memory_touch(total: int, chunk: int = 1 << 20) -> dict:
    """GB/s of writing ``total`` bytes into fresh anonymous memory (its
    first touch: the kernel finds and zero-fills each page, and a VM with
    free page reporting also faults it in from the host) and of writing
    them again (pages already there).  Every byte a bookie journals or
    receives into new pages pays the first figure, not the second."""
    import mmap
    buf = os.urandom(chunk)
    m = mmap.mmap(-1, total)
    try:
        view = memoryview(m)
        times = []
        for _ in range(2):
            t0 = time.perf_counter()
            for at in range(0, total - chunk + 1, chunk):
                view[at:at + chunk] = buf
            times.append(time.perf_counter() - t0)
        view.release()
    finally:
        m.close()
    fresh, again = (total / t / 1e9 for t in times)
    return {"fresh_gb_per_s": fresh, "rewrite_gb_per_s": again, "bytes": total,
            "rewrite_vs_fresh": again / fresh}


def measure(directory: str | None = None, quick: bool = False) -> dict:
    with tempfile.TemporaryDirectory(dir=directory) as d:
        total = (128 if quick else 512) << 20
        out: dict[str, Any] = {"fsync_4k": fsync_rate(d, 500 if quick else 2000),
               "seq_write": seq_bandwidth(d, total),
               # journal-shaped: every 1 MiB write followed by its own fdatasync
               "sync_1m_write": seq_bandwidth(d, total // 2, sync_every=1 << 20),
               "seq_sustained": seq_sustained(d, 4 * total),
               "seq_overwrite": seq_overwrite(d, 2 * total),
               "seq_direct": seq_direct(d, 2 * total),
               "memory_touch": memory_touch(total // 2)}
        out["burst_vs_sustained"] = out["seq_write"]["mb_per_s"] / out["seq_sustained"]["mb_per_s"]
        out["overwrite_vs_sustained"] = (out["seq_overwrite"]["mb_per_s"]
                                         / out["seq_sustained"]["mb_per_s"])
        direct = out["seq_direct"]["mb_per_s"]
        out["direct_vs_overwrite"] = (direct / out["seq_overwrite"]["mb_per_s"]
                                      if direct else None)
        return out


if __name__ == "__main__":
    print(measure())
