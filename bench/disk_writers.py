"""Sequential bandwidth with periodic fdatasync for N concurrent writer
processes (figure 1's "1 and 3 writers"); each writer runs
``bench.disk.seq_bandwidth`` on its own file in the same directory."""
from __future__ import annotations

import multiprocessing as mp
import os
import tempfile
import time

from bench import disk


def _one(args) -> dict:
    directory, total, barrier_at = args
    while time.time() < barrier_at:        # start together (all processes spawned)
        time.sleep(0.001)
    return disk.seq_bandwidth(directory, total)


def seq_bandwidth_writers(directory: str, writers: int, total_each: int) -> dict:
    with tempfile.TemporaryDirectory(dir=directory) as d:
        dirs = [os.path.join(d, f"w{i}") for i in range(writers)]
        for x in dirs:
            os.mkdir(x)
        ctx = mp.get_context("spawn")
        with ctx.Pool(writers) as pool:
            start_at = time.time() + 2.0
            results = pool.map(_one, [(x, total_each, start_at) for x in dirs])
    per = [r["mb_per_s"] for r in results]
    return {"writers": writers, "bytes_each": total_each, "per_writer_mb_per_s": per,
            "total_mb_per_s_sum": sum(per)}
