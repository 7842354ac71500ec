"""Reading a given set of entry ids from ONE bookie, many reads in flight.

Sparse reads (``ReadRequest.sparse``): the bookie returns every entry it
stores in a range, gaps skipped, so a striped fragment (E > Qw: a bookie
holds runs of Qw ids) costs one read per ``max_entries`` ids, not one per
run.  The span of the wanted ids is cut into chunks of ``max_entries`` ids,
read with a bounded window of concurrent requests; a LIMIT answer resumes
after its last row; rows not wanted are dropped (vectorised): the plan is
``protocol.sparse_reads.SparseReadWindow``, shared with a bookie's pull.  NoSuchLedger
means the bookie holds none of them; any other error (bookie down, timeout)
stops and reports the bookie unreachable, so callers fall back to another
replica.  Rows come back as Arrow batches (ENTRY_SCHEMA).

A bookie that predates sparse reads ignores the flag and answers with a
contiguous run (end MISSING, or NoSuchEntry for an absent first id); then
the ids are re-read run by run (``entry_sets.runs``), the slow path.
"""
from __future__ import annotations

import concurrent.futures as cf
from collections import deque
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa

from pybk_spark import errors
from pybk_spark.admin.decisions.entry_sets import runs
from pybk_spark.protocol.sparse_reads import SparseReadWindow
from pybk_spark.transport.base import BookieTransport
from pybk_spark.wire.results import ReadResult

DEFAULT_WINDOW = 8


@dataclass
class ReplicaRead:
    batches: list[pa.RecordBatch] = field(default_factory=list)
    unreachable: str = ""          # error text when the bookie could not be read

    def table(self) -> pa.Table | None:
        if not self.batches:
            return None
        return pa.Table.from_batches(self.batches)

    def present_ids(self) -> np.ndarray:
        if not self.batches:
            return np.empty(0, np.int64)
        return np.concatenate([b.column("entry_id").to_numpy() for b in self.batches])


def read_ids(transport: BookieTransport, ledger_id: int, ids: np.ndarray, master_key: bytes, *,
             max_entries: int = 5000, max_bytes: int = 16 << 20, timeout: float | None = None,
             window: int = DEFAULT_WINDOW) -> ReplicaRead:
    out = ReplicaRead()
    ids = np.asarray(ids, dtype=np.int64)
    if len(ids) == 0:
        return out
    win: SparseReadWindow = SparseReadWindow(ids, max_entries, window)
    legacy = False

    def send(a: int, b: int) -> cf.Future[ReadResult]:
        return transport.read(ledger_id, a, b, max_entries=max_entries, max_bytes=max_bytes,
                              master_key=master_key, timeout=timeout, sparse=True)

    while win.busy and not out.unreachable and not legacy:
        win.fill(send)
        done, _ = cf.wait(list(win.inflight), return_when=cf.FIRST_COMPLETED)
        for f in done:
            span = win.finished(f)
            exc = f.exception()
            if (exc is None and f.result().end == "MISSING") or isinstance(exc, errors.NoSuchEntry):
                legacy = True          # the bookie ignored ``sparse``
                break
            if exc is None:
                res = f.result()
                batch = res.batch
                if batch.num_rows:
                    keep = win.answered(span, batch.column("entry_id").to_numpy(), res.end)
                    out.batches.append(batch if keep.all() else batch.filter(pa.array(keep)))
            elif isinstance(exc, errors.NoSuchLedger):
                continue
            else:
                out.unreachable = f"{type(exc).__name__}: {exc}"
    for f in win.abandon():      # stopped early: let stragglers finish unobserved
        f.cancel()
    if legacy:
        return _read_runs(transport, ledger_id, ids, master_key, max_entries=max_entries,
                          max_bytes=max_bytes, timeout=timeout, window=4 * window)
    return out


def _read_runs(transport: BookieTransport, ledger_id: int, ids: np.ndarray, master_key: bytes, *,
               max_entries: int, max_bytes: int, timeout: float | None,
               window: int) -> ReplicaRead:
    """Slow path for bookies without sparse reads: one read per run of ids."""
    out = ReplicaRead()
    todo: deque[tuple[int, int]] = deque()
    for a, b in runs(ids):
        while a <= b:
            end = min(b, a + max_entries - 1)
            todo.append((a, end))
            a = end + 1
    inflight: dict[cf.Future[ReadResult], tuple[int, int]] = {}
    while (todo or inflight) and not out.unreachable:
        while todo and len(inflight) < window:
            a, b = todo.popleft()
            inflight[transport.read(ledger_id, a, b, max_entries=b - a + 1,
                                    max_bytes=max_bytes, master_key=master_key,
                                    timeout=timeout)] = (a, b)
        done, _ = cf.wait(list(inflight), return_when=cf.FIRST_COMPLETED)
        for f in done:
            a, b = inflight.pop(f)
            exc = f.exception()
            if exc is None:
                res = f.result()
                got = res.batch.num_rows
                if got:
                    out.batches.append(res.batch)
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
    for f in inflight:
        f.cancel()
    return out
