"""How long a bookie's checkpoint keeps other threads from the GIL.

In one process: a bookie (no journal traffic) is given N lone adds, then
checkpoints, R times.  A probe thread sleeps 50 us in a loop; the time it
wakes late while a checkpoint runs is what a thread serving an add would
wait for the GIL, set against the same span right after with no checkpoint
(the other processes on the machine).  Prints one JSON line.

    python bench/checkpoint_stall.py 8000 6
"""
from __future__ import annotations

import json
import os
import sys
import tempfile
import threading
import time

from bookie_server.bookie import Bookie
from bookie_server.config import BookieConfig
from pybk_spark.wire.entries import entry_record_head

_SLEEP_S = 0.00005


def summary(late: list[float]) -> dict:
    v = sorted(late) or [0.0]

    def q(f: float) -> float:
        return round(v[min(len(v) - 1, int(f * len(v)))] * 1e3, 2)
    return {"wakes": len(late), "p99_ms": q(.99), "p999_ms": q(.999),
            "max_ms": round(v[-1] * 1e3, 2), "over_2ms": sum(x > 2e-3 for x in v),
            "over_5ms": sum(x > 5e-3 for x in v)}


def measure(n: int, rounds: int) -> dict:
    late: list[float] = []
    stop = threading.Event()

    def probe() -> None:
        while not stop.is_set():
            t = time.perf_counter()
            time.sleep(_SLEEP_S)
            late.append(time.perf_counter() - t - _SLEEP_S)

    with tempfile.TemporaryDirectory(prefix="ckpt-stall-") as d:
        bookie = Bookie(BookieConfig(data_dir=d)).open(background=False)
        threading.Thread(target=probe, daemon=True).start()
        payload, entry_id = os.urandom(1024), 0
        during: list[float] = []
        idle: list[float] = []
        took = []
        try:
            for _ in range(rounds):
                for _ in range(n):
                    head = entry_record_head(1, entry_id, entry_id - 1, 1024 * (entry_id + 1),
                                             b"\0" * 4)
                    bookie.store.add_entry(1, entry_id, head + payload)
                    entry_id += 1
                time.sleep(0.02)
                late.clear()
                t = time.perf_counter()
                bookie.checkpoint()
                took.append(time.perf_counter() - t)
                during += late
                late.clear()
                time.sleep(took[-1])
                idle += late
        finally:
            stop.set()
            bookie.close(checkpoint=False)
    return {"lone_adds": n, "checkpoints": rounds,
            "checkpoint_ms": round(1e3 * sum(took) / len(took), 1),
            "during": summary(during), "no_checkpoint": summary(idle)}


if __name__ == "__main__":
    args = [int(a) for a in sys.argv[1:3]]
    print(json.dumps(measure(*(args + [8000, 6][len(args):]))))
