"""Per-ledger run index: which stored batch holds which entry ids.  Pure numpy.

A *run* is a maximal range of consecutive entry ids stored contiguously in one
batch: ``(start, end, ref, row)`` = ids start..end are rows row..row+(end-start)
of stored batch ``ref``.  Runs of a ledger never overlap (the store filters
duplicates before adding), are appended cheaply to a pending list and merged
(sorted by start) lazily before the next lookup.  Every operation is
vectorised over runs or ids; ``locate`` steps once per run, never per entry.
"""
from __future__ import annotations

from array import array

import numpy as np

_ZERO_ROW = np.zeros(1, np.int64)
_ZERO_ROW.flags.writeable = False


def runs_of(entry_ids: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Split strictly ascending ids into runs of consecutive ids: (starts, ends,
    first rows)."""
    n = len(entry_ids)
    if n == 0:
        e = np.empty(0, np.int64)
        return e, e, e
    if entry_ids[n - 1] - entry_ids[0] == n - 1:    # consecutive ids (every writer's add): one run
        # copies: a view would keep the whole batch's buffer alive in the
        # index after the write cache let go of the batch
        return entry_ids[:1].copy(), entry_ids[n - 1:].copy(), _ZERO_ROW
    breaks = np.flatnonzero(np.diff(entry_ids) != 1) + 1
    first_rows = np.concatenate(([0], breaks)).astype(np.int64)
    last_rows = np.concatenate((breaks - 1, [len(entry_ids) - 1])).astype(np.int64)
    return entry_ids[first_rows], entry_ids[last_rows], first_rows


class LedgerIndex:
    """Sorted, non-overlapping runs of one ledger."""

    def __init__(self) -> None:
        empty = np.empty(0, np.int64)
        self.starts = self.ends = self.refs = self.rows = empty
        self._pending: list[tuple[np.ndarray, ...]] = []
        # runs of lone entries added since the last settle: (start, end, ref,
        # row) in C arrays, numpy arrays (no copy) only when the index is next
        # read (a checkpoint reads thousands at once, under the store lock)
        self._lone_starts = array("q")
        self._lone_ends = array("q")
        self._lone_refs = array("q")
        self._lone_rows = array("q")
        self.max_entry = -1
        self.count = 0

    def add_runs(self, starts: np.ndarray, ends: np.ndarray, refs: np.ndarray,
                 rows: np.ndarray) -> None:
        if len(starts) == 0:
            return
        self._pending.append((starts, ends, refs, rows))
        if len(starts) == 1:             # one run (every writer's add): scalars, no reductions
            end = int(ends[0])
            self.max_entry = max(self.max_entry, end)
            self.count += end - int(starts[0]) + 1
            return
        self.max_entry = max(self.max_entry, int(ends.max()))
        self.count += int((ends - starts + 1).sum())

    def add_entry(self, entry_id: int, ref_id: int, row: int) -> None:
        """One entry, row ``row`` of ``ref_id`` (a lone add): no array until
        read.  The next id of the last run, in the same ref, extends it: a
        ref's rows are appended in order, one per entry added here, so the
        row follows on (a ledger has one growing ref at a time)."""
        ends = self._lone_ends
        if ends and ends[-1] == entry_id - 1 and self._lone_refs[-1] == ref_id:
            ends[-1] = entry_id
        else:
            self._lone_starts.append(entry_id)
            ends.append(entry_id)
            self._lone_refs.append(ref_id)
            self._lone_rows.append(row)
        if entry_id > self.max_entry:
            self.max_entry = entry_id
        self.count += 1

    def _settle(self) -> None:
        if self._lone_starts:
            self._pending.append(tuple(np.frombuffer(a, np.int64) for a in (
                self._lone_starts, self._lone_ends, self._lone_refs, self._lone_rows)))
            self._lone_starts, self._lone_ends = array("q"), array("q")
            self._lone_refs, self._lone_rows = array("q"), array("q")
        if not self._pending:
            return
        parts = [(self.starts, self.ends, self.refs, self.rows)] + self._pending
        cols = [np.concatenate([p[i] for p in parts]) for i in range(4)]
        order = np.argsort(cols[0], kind="stable")
        self.starts, self.ends, self.refs, self.rows = (c[order] for c in cols)
        self._pending = []

    def contains(self, ids: np.ndarray) -> np.ndarray:
        self._settle()
        if len(self.starts) == 0:
            return np.zeros(len(ids), bool)
        i = np.searchsorted(self.starts, ids, side="right") - 1
        ok = i >= 0
        return ok & (ids <= self.ends[np.maximum(i, 0)])

    def locate(self, first: int, last: int, max_entries: int) -> list[tuple[int, int, int]]:
        """(ref, row, count) pieces covering a contiguous run from ``first``."""
        self._settle()
        i = int(np.searchsorted(self.starts, first, side="right")) - 1
        if i < 0 or self.ends[i] < first:
            return []
        out, want, eid = [], min(last - first + 1, max_entries), first
        n = len(self.starts)
        while want > 0 and i < n and self.starts[i] <= eid:
            count = min(int(self.ends[i]) - eid + 1, want)
            out.append((int(self.refs[i]), int(self.rows[i]) + eid - int(self.starts[i]), count))
            want -= count
            eid += count
            i += 1
        return out

    def locate_sparse(self, first: int, last: int, max_entries: int
                      ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """(refs, rows, counts, first ids) of the pieces holding every stored
        id in [first, last], ascending, at most ``max_entries`` ids (gaps
        skipped).  Vectorised over runs."""
        self._settle()
        i0 = int(np.searchsorted(self.ends, first, side="left"))
        i1 = int(np.searchsorted(self.starts, last, side="right"))
        if i1 <= i0 or max_entries <= 0:
            e = np.empty(0, np.int64)
            return e, e, e, e
        st = self.starts[i0:i1]
        lo = np.maximum(st, first)
        counts = np.minimum(self.ends[i0:i1], last) - lo + 1
        cum = np.cumsum(counts)
        k = int(np.searchsorted(cum, max_entries, side="left"))
        if k < len(counts):
            counts = counts[:k + 1].copy()
            counts[k] -= int(cum[k]) - max_entries
            lo, st = lo[:k + 1], st[:k + 1]
        n = len(counts)
        return self.refs[i0:i0 + n], self.rows[i0:i0 + n] + (lo - st), counts, lo

    def remove_refs(self, ref_ids: np.ndarray) -> None:
        self._settle()
        keep = ~np.isin(self.refs, ref_ids)
        self.count -= int((self.ends[~keep] - self.starts[~keep] + 1).sum())
        self.starts, self.ends, self.refs, self.rows = (
            a[keep] for a in (self.starts, self.ends, self.refs, self.rows))

    def table_parts(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        self._settle()
        return self.starts, self.ends, self.refs, self.rows
