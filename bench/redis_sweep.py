"""Redis Streams (appendfsync always) against batch size, for the plot.

For pipeline depth P in 1/10/100/1000 (1 KiB values):
  * ``one_in_flight``: redis-py pipeline of P XADDs, executed and awaited one
    pipeline at a time: throughput and per-pipeline latency (same shape as our
    ``add_entries`` of P entries, one call in flight);
  * ``pipelined``: redis-benchmark -c1 -P P (its C client keeps the pipe full).
"""
from __future__ import annotations

import time

from bench.redis_peer import VALUE, redis_benchmark, redis_server
from bench.stats import latency_summary, rate

SWEEP_SIZES = (1, 10, 100, 1000)


def measure(quick: bool = False) -> dict:
    calls = {1: 30, 10: 20, 100: 10, 1000: 5} if quick else {1: 2000, 10: 500, 100: 200, 1000: 60}
    requests = {1: 2_000, 10: 5_000, 100: 10_000, 1000: 20_000} if quick else \
        {1: 20_000, 10: 50_000, 100: 200_000, 1000: 300_000}
    out: dict = {"one_in_flight": {}, "pipelined": {}}
    with redis_server() as (port, client):
        for p in SWEEP_SIZES:
            lat = []
            t0 = time.perf_counter()
            for _ in range(calls[p]):
                s = time.perf_counter()
                pipe = client.pipeline(transaction=False)
                for _ in range(p):
                    pipe.xadd("sweep", {"f": VALUE})
                pipe.execute()
                lat.append(time.perf_counter() - s)
            elapsed = time.perf_counter() - t0
            out["one_in_flight"][str(p)] = {"entries_per_s": rate(p * calls[p], elapsed),
                                            **latency_summary(lat)}
            out["pipelined"][str(p)] = {"entries_per_s": redis_benchmark(port, 1, p, requests[p])}
    return out
