"""Figure 5: catch-up read through a non-fencing reader.

The ledger is the one the batched E=3 Qw=3 Qa=2 append figure wrote (1,000,000
1 KiB entries in the full run); its writer is still alive and the ledger OPEN.
A second client opens it with ``recovery=False`` (no fencing: the writer is not
disturbed) and reads [0, LAC] with ``read_batches`` (runs of 1000 entries, each
digest-verified), touching every payload byte count.  Redis's peer figure is
XRANGE COUNT 1000 over a 1 KiB-value stream of the same length.

Before reading, the writer's last batch must be confirmed to the bookies: an
idle writer sends an explicit LAC (the client's background ticker); we poll
the non-fencing LAC with a deadline until it reaches the last written id.
"""
from __future__ import annotations

import time

from bench.cpu import CpuMeter
from bench.stats import rate
from pybk_spark.ledger.client import BookKeeper


def wait_for_lac(bk: BookKeeper, ledger_id: int, last: int, timeout: float = 60.0):
    deadline = time.monotonic() + timeout
    while True:
        rh = bk.open_ledger(ledger_id, recovery=False)
        if rh.last_add_confirmed >= last:
            return rh
        if time.monotonic() > deadline:
            raise RuntimeError(f"LAC of ledger {ledger_id} stuck at {rh.last_add_confirmed} "
                               f"(want {last})")
        time.sleep(0.2)


def timed_read(rh, entries: int, pids: dict | None = None) -> dict:
    """Read [0, entries-1] of an open read handle with ``read_batches``, timed;
    with ``pids``, each process kind's CPU per entry over the same window."""
    last = entries - 1
    rows = nbytes = 0
    with CpuMeter(pids) as meter:
        t0 = time.perf_counter()
        for batch in rh.read_batches(0, last):
            rows += batch.num_rows
            nbytes += batch.column("payload").nbytes
        elapsed = time.perf_counter() - t0
    if rows != entries:
        raise RuntimeError(f"catch-up read {rows} entries, expected {entries}")
    out = {"entries": rows, "seconds": elapsed, "entries_per_s": rate(rows, elapsed),
           "mb_per_s": rate(nbytes, elapsed) / 1e6, "ledger_state": rh.metadata.state}
    if pids is not None:
        out["cpu"] = meter.figure(rows)
    return out


def measure(uri: str, ledger_id: int, entries: int, pids: dict | None = None) -> dict:
    with BookKeeper(uri) as bk:
        rh = wait_for_lac(bk, ledger_id, entries - 1)
        return timed_read(rh, entries, pids)
