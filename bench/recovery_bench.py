"""Figure 7: time to fence, recover and close an OPEN ledger.

What is measured, exactly
-------------------------
A writer client (background ticker off, so it never sends an explicit LAC)
creates an E=3 Qw=3 Qa=2 ledger and appends 1000 x 1 KiB entries with ONE
``add_entries`` call.  The client sends them as one chunk, so every entry
carries the LAC from before the chunk (-1): the bookies hold 1000 entries
but know LAC = -1.  The writer is then abandoned (client closed, ledger never
closed: a crashed writer; its client process stays connected but silent until
the measurement is over, so no half-finished RPC of a closing client races the
recovery).

* tail = 1000: left as is.  Recovery must read forward 1000 entries past the
  LAC, re-write them to their write sets with recovery adds (fdatasync'd),
  then close at 999.
* tail = 0: before abandoning, the writer's transport sends an explicit LAC
  of 999 to every bookie (the ``WriteLac`` RPC an idle writer sends), so the
  tail past the LAC is empty and recovery only fences, probes entry 1000,
  finds it missing and closes.

The clock covers ``BookKeeper.open_ledger(id, recovery=True)`` of a second,
already-connected client: CAS to IN_RECOVERY, fenced ReadLac until coverage,
read-forward, recovery adds, CAS to CLOSED.  Each case runs ``reps`` times on
fresh ledgers; the median and every sample are reported.
"""
from __future__ import annotations

import statistics
import time

from bench.client_append import payloads
from pybk_spark.ledger.client import BookKeeper
from pybk_spark.protocol import ledger_metadata as lm

TAIL_ENTRIES = 1000


def _abandoned_ledger(uri: str, confirm_all: bool, writers: list) -> int:
    writer = BookKeeper(uri, conf={"explicit_lac_interval_ms": 0}, background=False)
    writers.append(writer)      # closed only after the measurement (see measure)
    lh = writer.create_ledger(3, 3, 2)
    lh.add_entries(payloads(TAIL_ENTRIES))
    if confirm_all:
        key = lm.master_key(b"")
        futs = [writer.transports.get(b).write_lac(lh.ledger_id, key, TAIL_ENTRIES - 1)
                for b in lh.metadata.current_ensemble]
        for f in futs:
            f.result()
    return lh.ledger_id     # the handle is never closed: the ledger stays OPEN


def measure(uri: str, quick: bool) -> dict:
    reps = 1 if quick else 5
    out: dict = {}
    writers: list = []
    try:
        _measure(uri, reps, out, writers)
    finally:
        for w in writers:
            w.close()
    return out


def _measure(uri: str, reps: int, out: dict, writers: list) -> None:
    with BookKeeper(uri) as recoverer:
        recoverer.list_ledgers()          # connect to etcd before timing
        for tail, confirm_all in ((0, True), (TAIL_ENTRIES, False)):
            samples = []
            for _ in range(reps):
                lid = _abandoned_ledger(uri, confirm_all, writers)
                before = recoverer.open_ledger(lid, recovery=False).last_add_confirmed
                t0 = time.perf_counter()
                rh = recoverer.open_ledger(lid, recovery=True)
                samples.append(time.perf_counter() - t0)
                if not rh.is_closed or rh.last_add_confirmed != TAIL_ENTRIES - 1:
                    raise RuntimeError(f"recovery of ledger {lid} closed at "
                                       f"{rh.last_add_confirmed}, expected {TAIL_ENTRIES - 1}")
                expect_lac = TAIL_ENTRIES - 1 if confirm_all else -1
                if before != expect_lac:
                    raise RuntimeError(f"ledger {lid}: bookies' LAC was {before} before recovery, "
                                       f"expected {expect_lac}: the tail was not as described")
            out[f"tail_{tail}"] = {"median_ms": statistics.median(samples) * 1e3,
                                   "samples_ms": [s * 1e3 for s in samples],
                                   "entries_in_ledger": TAIL_ENTRIES,
                                   "unconfirmed_tail": tail}
