"""The disk's own limits, measured in the same run as the bookie benchmark.

* ``fsync_rate``: 4 KiB append + fdatasync, one at a time (rate, p50, p99).
* ``seq_bandwidth``: sequential 1 MiB writes with an fdatasync every
  ``sync_every`` bytes (MB/s): 64 MiB = the disk's streaming bandwidth,
  1 MiB = what a journal committing each 1 MiB batch on its own can reach.
"""
from __future__ import annotations

import os
import tempfile
import time

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
        t0 = time.perf_counter()
        written = since_sync = 0
        while written < total:
            written += os.write(fd, buf)
            since_sync += chunk
            if since_sync >= sync_every:
                os.fdatasync(fd)
                since_sync = 0
        os.fdatasync(fd)
        elapsed = time.perf_counter() - t0
    finally:
        os.close(fd)
        os.unlink(path)
    return {"mb_per_s": total / elapsed / 1e6, "bytes": total}


def measure(directory: str | None = None, quick: bool = False) -> dict:
    with tempfile.TemporaryDirectory(dir=directory) as d:
        total = (128 if quick else 512) << 20
        return {"fsync_4k": fsync_rate(d, 500 if quick else 2000),
                "seq_write": seq_bandwidth(d, total),
                # journal-shaped: every 1 MiB write followed by its own fdatasync
                "sync_1m_write": seq_bandwidth(d, total // 2, sync_every=1 << 20)}


if __name__ == "__main__":
    print(measure())
