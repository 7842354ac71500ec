"""How much a bookie's checkpoint slows the sync adds of that moment.

On a 3-bookie ``LocalCluster``: sync ``add_entry`` calls (E=3 Qw=3 Qa=2,
1 KiB, one in flight) for ``seconds``, so that each bookie checkpoints its
lone adds about every ``flush_interval_s`` (5 s) meanwhile.  The checkpoint
writes them to a segment file on the disk the journal shares, and each add
waits for the fdatasync of two journals.  Prints one JSON line: the
latency quantiles and the time adds spent past 2 ms, with the bookies'
``checkpoint_sync_bytes`` as given (``-1``: the bookie's default).

    python bench/checkpoint_disk_stall.py [seconds] [checkpoint_sync_bytes]
"""
from __future__ import annotations

import json
import os
import sys
import tempfile
import time

from bench.client_append import payloads
from pybk_spark import BookKeeper
from pybk_spark.cluster.local import LocalCluster


def measure(seconds: float = 10.0, sync_bytes: int = -1) -> dict:
    conf = {"checkpoint_sync_bytes": sync_bytes} if sync_bytes >= 0 else None
    lat: list[float] = []
    data = payloads(4096)
    with tempfile.TemporaryDirectory(prefix="ckpt-disk-") as d:
        with LocalCluster(os.path.join(d, "cluster"), num_bookies=3, bookie_conf=conf) as c:
            with BookKeeper(c.metadata_uri) as bk:
                lh = bk.create_ledger(3, 3, 2)
                for p in data[:20]:
                    lh.add_entry(p)
                end = time.perf_counter() + seconds
                i = 0
                while time.perf_counter() < end:
                    t = time.perf_counter()
                    lh.add_entry(data[i % len(data)])
                    lat.append(time.perf_counter() - t)
                    i += 1
                lh.close()
    v = sorted(lat)

    def q(f: float) -> float:
        return round(v[min(len(v) - 1, int(f * len(v)))] * 1e3, 3)
    return {"checkpoint_sync_bytes": sync_bytes, "adds": len(v), "p50_ms": q(.5),
            "p99_ms": q(.99), "p999_ms": q(.999), "max_ms": round(v[-1] * 1e3, 1),
            "over_2ms_total_ms": round(sum(x for x in v if x > 2e-3) * 1e3)}


if __name__ == "__main__":
    secs = float(sys.argv[1]) if len(sys.argv) > 1 else 10.0
    step = int(sys.argv[2]) if len(sys.argv) > 2 else -1
    print(json.dumps(measure(secs, step)))
