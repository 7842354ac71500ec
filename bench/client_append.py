"""Figures 3 and 4: client append throughput and single-entry add latency.

Every figure uses 1 KiB random (incompressible) payloads, prepared before the
clock starts, against a real LocalCluster (etcd + 3 bookie-server processes,
each ack meaning the entry is fdatasync'd in the bookie's journal).

* ``throughput``: for E=3 Qw=3 Qa=2 and E=3 Qw=2 Qa=2,
  ``add_entries`` (batched: chunks of ``add_batch_entries`` = 1000 entries,
  up to ``max_inflight_adds`` chunks in flight) and ``add_entry_async``
  (30,000 calls, one entry per call, pipelined: every future is created
  before the first is awaited; timed before the batched run of its config,
  on bookies that are not flushing an earlier run).
* ``batch_sweep``: E=3 Qw=3 Qa=2, for batch sizes 1/10/100/1000:
  one batch in flight (``add_entries`` of exactly N entries, timed per call:
  throughput and per-batch latency), and pipelined (``add_entries`` of many
  entries with ``add_batch_entries`` = N).
* ``sync_latency``: ``add_entry`` one at a time (one in flight), p50/p99/p999.

The batched E=3 Qw=3 Qa=2 ledger is left OPEN and its id returned, so the
catch-up figure (5) reads exactly what was written here.
"""
from __future__ import annotations

import os
import time

from bench.cpu import CpuMeter
from bench.stats import latency_summary, rate
from pybk_spark.ledger.client import BookKeeper

ENTRY_BYTES = 1024
CONFIGS = ((3, 3, 2), (3, 2, 2))
SWEEP_SIZES = (1, 10, 100, 1000)


def payloads(n: int, size: int = ENTRY_BYTES, distinct: int = 4096) -> list[bytes]:
    """n random payloads (``distinct`` different ones, repeated: no per-entry urandom)."""
    pool_blob = os.urandom(size * min(n, distinct))
    pool = [pool_blob[i * size:(i + 1) * size] for i in range(min(n, distinct))]
    return [pool[i % len(pool)] for i in range(n)]


def _cfg_name(cfg) -> str:
    return "E%dQw%dQa%d" % cfg


def timed_batched(lh, data: list[bytes], pids: dict | None = None) -> dict:
    """``pids`` (kind -> pids): also measure each process kind's CPU per entry."""
    with CpuMeter(pids) as meter:
        t0 = time.perf_counter()
        ids = lh.add_entries(data)
        elapsed = time.perf_counter() - t0
    if len(ids) != len(data):
        raise RuntimeError(f"add_entries acknowledged {len(ids)} of {len(data)}")
    out: dict = {"entries": len(data), "seconds": elapsed, "entries_per_s": rate(len(data), elapsed),
           "mb_per_s": rate(len(data) * ENTRY_BYTES, elapsed) / 1e6}
    if pids is not None:
        out["cpu"] = meter.figure(len(data))
    return out


def _timed_async(lh, data: list[bytes]) -> dict:
    t0 = time.perf_counter()
    futs = [lh.add_entry_async(p) for p in data]
    for f in futs:
        f.result()
    elapsed = time.perf_counter() - t0
    return {"entries": len(data), "seconds": elapsed, "entries_per_s": rate(len(data), elapsed),
            "mb_per_s": rate(len(data) * ENTRY_BYTES, elapsed) / 1e6}


def throughput(uri: str, quick: bool, catchup_entries: int,
               pids: dict | None = None) -> tuple[dict, tuple]:
    """Batched and pipelined appends for each quorum config.

    The first batched run (E=3 Qw=3 Qa=2) writes ``catchup_entries`` entries and
    its ledger stays OPEN for the catch-up read; its id is under ``catchup_ledger``."""
    n_batched = 5_000 if quick else 300_000
    n_async = 200 if quick else 30_000
    out: dict = {}
    bk = BookKeeper(uri)
    kept = None
    try:
        warm = bk.create_ledger(3, 3, 2)
        warm.add_entries(payloads(2_000 if quick else 20_000))
        for _ in range(20):
            warm.add_entry(b"w" * ENTRY_BYTES)
        warm.close()
        for cfg in CONFIGS:
            name = _cfg_name(cfg)
            # pipelined first: right after a batched run the bookies are still
            # flushing its entries to their segments, and a sub-second figure
            # would time that flush rather than the adds
            lh = bk.create_ledger(*cfg)
            out[f"async_{name}"] = _timed_async(lh, payloads(n_async))
            lh.close()
            lh = bk.create_ledger(*cfg)
            n = max(n_batched, catchup_entries) if cfg == CONFIGS[0] else n_batched
            out[f"batched_{name}"] = timed_batched(lh, payloads(n),
                                                   pids if cfg == CONFIGS[0] else None)
            if cfg == CONFIGS[0]:
                out["catchup_ledger"] = lh.ledger_id   # stays OPEN: its writer is still alive
                out["catchup_ledger_entries"] = n
                kept = lh      # a referenced handle keeps sending explicit LACs when idle
            else:
                lh.close()
    except BaseException:
        bk.close()
        raise
    return out, (bk, kept)   # the caller closes the writer after the catch-up read


def batch_sweep(uri: str, quick: bool) -> dict:
    """Throughput and per-batch latency against batch size (E=3 Qw=3 Qa=2)."""
    one_calls = {1: 30, 10: 20, 100: 10, 1000: 5} if quick else {1: 400, 10: 300, 100: 200, 1000: 60}
    piped_total = ({1: 200, 10: 1_000, 100: 5_000, 1000: 10_000} if quick else
                   {1: 2_000, 10: 10_000, 100: 60_000, 1000: 200_000})
    out: dict = {"one_in_flight": {}, "pipelined": {}}
    with BookKeeper(uri) as bk:
        lh = bk.create_ledger(3, 3, 2)
        for n in SWEEP_SIZES:
            data = payloads(n)
            lh.add_entries(data)       # warm-up
            lat = []
            t0 = time.perf_counter()
            for _ in range(one_calls[n]):
                s = time.perf_counter()
                lh.add_entries(data)
                lat.append(time.perf_counter() - s)
            elapsed = time.perf_counter() - t0
            out["one_in_flight"][str(n)] = {"entries_per_s": rate(n * one_calls[n], elapsed),
                                            **latency_summary(lat)}
        lh.close()
    for n in SWEEP_SIZES:
        with BookKeeper(uri, conf={"add_batch_entries": n}) as bk:
            lh = bk.create_ledger(3, 3, 2)
            lh.add_entries(payloads(min(n * 4, 2000)))
            out["pipelined"][str(n)] = timed_batched(lh, payloads(piped_total[n]))
            lh.close()
    return out


def timed_sync_adds(lh, data: list[bytes]) -> tuple[list[float], float]:
    """``add_entry`` of each payload, one at a time (one in flight): every
    call's latency and the whole loop's duration, in seconds.  The timed loop
    of figure 4 and of ``bench.cpu_by_thread``."""
    lat = []
    t0 = time.perf_counter()
    for p in data:
        s = time.perf_counter()
        lh.add_entry(p)
        lat.append(time.perf_counter() - s)
    return lat, time.perf_counter() - t0


def sync_latency(uri: str, quick: bool, pids: dict | None = None) -> dict:
    """Single-entry synchronous add_entry latency (E=3 Qw=3 Qa=2, one in flight);
    with ``pids``, the CPU each process kind spent per add over the same window.

    On a shared machine the CPU per add moves with what other processes run
    (``cpu.others_cores``), far more than with what figure 3 left on the
    cluster (docs/performance.md); ``bench.run`` measures the floor, its peer,
    right before this figure so that the ratio compares one moment."""
    n = 100 if quick else 5_000
    data = payloads(n)
    with BookKeeper(uri) as bk:
        lh = bk.create_ledger(3, 3, 2)
        for p in data[:20]:
            lh.add_entry(p)
        with CpuMeter(pids) as meter:
            lat, elapsed = timed_sync_adds(lh, data)
        lh.close()
    out = {"entries_per_s": rate(n, elapsed), **latency_summary(lat)}
    if pids is not None:
        out["cpu"] = meter.figure(n)
    return out
