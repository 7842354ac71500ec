"""Reading a given set of entry ids from ONE bookie, many reads in flight.

A bookie read answers the contiguous run of entries it holds from the first
id asked, so a set of ids is asked run by run (``entry_sets.runs``), with a
bounded window of concurrent reads.  A short answer (MISSING) resumes after
the hole, a LIMIT answer resumes right after the last row, NoSuchEntry skips
one id; NoSuchLedger means the bookie holds none of them; any other error
(bookie down, timeout) stops and reports the bookie unreachable, so callers
fall back to another replica.  Rows come back as Arrow batches (ENTRY_SCHEMA).
"""
from __future__ import annotations

import concurrent.futures as cf
from collections import deque
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa

from pybk_spark import errors
from pybk_spark.admin.entry_sets import runs

DEFAULT_WINDOW = 64


@dataclass
class ReplicaRead:
    batches: list = field(default_factory=list)
    unreachable: str = ""          # error text when the bookie could not be read

    def table(self) -> pa.Table | None:
        if not self.batches:
            return None
        return pa.Table.from_batches(self.batches)

    def present_ids(self) -> np.ndarray:
        if not self.batches:
            return np.empty(0, np.int64)
        return np.concatenate([b.column("entry_id").to_numpy() for b in self.batches])


def read_ids(transport, ledger_id: int, ids: np.ndarray, master_key: bytes, *,
             max_entries: int = 1000, max_bytes: int = 16 << 20, timeout: float | None = None,
             window: int = DEFAULT_WINDOW) -> ReplicaRead:
    out = ReplicaRead()
    todo: deque = deque()
    for a, b in runs(ids):
        while a <= b:                       # split long runs into bounded requests
            end = min(b, a + max_entries - 1)
            todo.append((a, end))
            a = end + 1
    inflight: dict = {}

    def launch(a: int, b: int) -> None:
        f = transport.read(ledger_id, a, b, max_entries=b - a + 1, max_bytes=max_bytes,
                           master_key=master_key, timeout=timeout)
        inflight[f] = (a, b)

    while (todo or inflight) and not out.unreachable:
        while todo and len(inflight) < window:
            launch(*todo.popleft())
        done, _ = cf.wait(list(inflight), return_when=cf.FIRST_COMPLETED)
        for f in done:
            a, b = inflight.pop(f)
            exc = f.exception()
            if exc is None:
                res = f.result()
                batch = res.batch
                got = batch.num_rows
                if got:
                    out.batches.append(batch)
                nxt = a + got + (0 if res.end == "LIMIT" else 1)
                if res.end != "COMPLETE" and nxt <= b:
                    todo.append((nxt, b))
            elif isinstance(exc, errors.NoSuchEntry):
                if a + 1 <= b:
                    todo.append((a + 1, b))
            elif isinstance(exc, errors.NoSuchLedger):
                todo.clear()
            else:
                out.unreachable = f"{type(exc).__name__}: {exc}"
    for f in inflight:           # stopped early: let stragglers finish unobserved
        f.cancel()
    return out
