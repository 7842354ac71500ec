"""Persisting the entry store's run index: the table a checkpoint writes, and
loading it back at start-up.

Theory of operation
-------------------
``index_table`` turns every ledger's segment runs into one Arrow table
(ledger, start, end, segment, offset, length, row); memory runs are not in
it, because journal replay rebuilds them. ``take_delta`` gives a checkpoint
only what changed since the last checkpoint: the new runs of ledgers that
only had batches flushed (``EntryStore.index_appended``), and every run of
ledgers whose stored runs were moved or removed (compaction, quarantine, GC:
``EntryStore.index_changed``). A checkpoint persists such a delta beside the
tables persisted before it (checkpoint_file.py), and ``fold`` puts a table
and the deltas after it back together, at load and when a checkpoint writes
a new whole table from its files. ``load_index`` restores refs, runs and
per-segment live bytes from such a table, then ``scan_segments`` sizes every
segment file on disk (and every journal file an index run points into).

Ordering obligations:
  * A delta is cut under ``store.lock`` as the change marks are cleared, so it
    is one consistent cut of those ledgers and every change is in exactly
    one persisted table: this delta, or the next. A flush only ever adds
    segment runs (the memory runs it removes are never persisted), so its
    new runs appended to what is persisted give the ledger's runs. Nothing
    here ever walks the whole store under the lock, except ``index_table``
    (tests and tools).
  * The caller persists a cut (fsync) before deleting any file the previous
    index referenced.
  * ``load_index`` runs before journal replay and before the bookie serves:
    nothing else touches the store yet.  After it, appends always go to a
    fresh segment (``store.files.roll()``), never into a file of unknown tail.
"""
from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field
from typing import Optional

import numpy as np
import pyarrow as pa

from bookie_server.storage.entry_store import EntryStore
from bookie_server.storage.write_cache import Ref
from bookie_server.storage.segment_files import is_journal_segment
from bookie_server.storage.run_index import LedgerIndex

log = logging.getLogger("bookie.store")

INDEX_SCHEMA = pa.schema([(n, pa.int64()) for n in
                          ("ledger", "start", "end", "segment", "offset", "length", "row")])


def index_table(store: EntryStore) -> pa.Table:
    """Segment runs of every ledger (memory runs are not persisted): the
    whole index, one consistent cut."""
    with store.lock:
        return _rows(store, [(ledger, None) for ledger in store.ledgers])


@dataclass(frozen=True)
class IndexDelta:
    """What changed in the persisted index since the last cut: ``table``
    holds every segment run of each ``replaced`` ledger (none: dropped) and
    the new runs of each ``appended`` one (its older runs stand)."""
    table: pa.Table
    replaced: list[int] = field(default_factory=list)
    appended: list[int] = field(default_factory=list)

    @property
    def empty(self) -> bool:
        return not self.replaced and not self.appended


def take_delta(store: EntryStore) -> IndexDelta:
    """One consistent cut of the change since the last cut; the change
    marks are cleared.  A ledger that only had batches flushed gives only
    its new runs, so the cost follows what was written, not how long the
    ledger is; a ledger compacted, quarantined or dropped gives all of its
    runs."""
    with store.lock:
        replaced = sorted(store.index_changed)
        appended = {ledger: refs for ledger, refs in store.index_appended.items()
                    if ledger not in store.index_changed}
        store.index_changed, store.index_appended = set(), {}
        table = _rows(store, [(ledger, None) for ledger in replaced]
                      + [(ledger, appended[ledger]) for ledger in sorted(appended)])
    return IndexDelta(table, replaced, sorted(appended))


def _rows(store: EntryStore, wanted: list[tuple[int, Optional[list[int]]]]) -> pa.Table:
    """The segment runs of these ledgers, each whole (None) or only those of
    the given refs (a dropped ledger has none); caller holds
    ``store.lock``.  Work is per ledger and per stored batch taken, never
    over the whole store."""
    cols: list[list[np.ndarray]] = [[] for _ in INDEX_SCHEMA]
    for ledger_id, only in wanted:
        idx = store.ledgers.get(ledger_id)
        if idx is None:
            continue
        starts, ends, refs, rows = idx.table_parts()
        if only is not None:
            sel = np.isin(refs, np.asarray(only, np.int64))
            starts, ends, refs, rows = starts[sel], ends[sel], refs[sel], rows[sel]
        if len(refs) == 0:
            continue
        uniq, inverse = np.unique(refs, return_inverse=True)
        loc = []
        for rid in uniq.tolist():
            r = store.refs.get(rid)
            loc.append((r.segment, r.offset, r.length) if r is not None and not r.in_memory
                       else (-1, 0, 0))                  # in memory: replay restores it
        where = np.array(loc, np.int64)[inverse]
        on_disk = where[:, 0] >= 0
        if not on_disk.any():
            continue
        cols[0].append(np.full(int(on_disk.sum()), ledger_id, np.int64))
        cols[1].append(starts[on_disk])
        cols[2].append(ends[on_disk])
        cols[3].append(where[on_disk, 0])
        cols[4].append(where[on_disk, 1])
        cols[5].append(where[on_disk, 2])
        cols[6].append(rows[on_disk])
    arrays = [pa.array(np.concatenate(c) if c else np.empty(0, np.int64), pa.int64())
              for c in cols]
    return pa.Table.from_arrays(arrays, schema=INDEX_SCHEMA)


def fold(table: pa.Table, deltas: list[IndexDelta]) -> pa.Table:
    """``table`` with each delta applied in order: a ledger a delta replaces
    has exactly that delta's runs, plus the runs later deltas append to it;
    a ledger a delta appends to keeps its runs and gains the delta's.  One
    pass over ``table``, whatever the number of deltas."""
    if not deltas:
        return table
    last: dict[int, int] = {}               # ledger -> the last delta replacing it
    for i, d in enumerate(deltas):
        for ledger in d.replaced:
            last[int(ledger)] = i
    named = np.fromiter(last, np.int64, len(last))
    parts = [table.filter(pa.array(~np.isin(table.column("ledger").to_numpy(), named)))]
    for i, d in enumerate(deltas):
        keep = [x for x in d.replaced if last[int(x)] == i]
        keep += [x for x in d.appended if last.get(int(x), -1) < i]
        if not d.table.num_rows or not keep:
            continue
        if len(keep) == len(d.replaced) + len(d.appended):
            parts.append(d.table)
        else:
            mine = np.isin(d.table.column("ledger").to_numpy(), np.asarray(keep, np.int64))
            parts.append(d.table.filter(pa.array(mine)))
    return pa.concat_tables(parts)


def load_index(store: EntryStore, table: pa.Table) -> None:
    if table.num_rows == 0:
        scan_segments(store)
        return
    c = {n: table.column(n).to_numpy() for n in INDEX_SCHEMA.names}
    key = (c["segment"] << 40) | c["offset"]
    uniq, first_pos, inverse = np.unique(key, return_index=True, return_inverse=True)
    with store.lock:
        base = store.reserve_ref_ids(len(uniq))
        ref_ids = inverse.astype(np.int64) + base
        for j, pos in enumerate(first_pos):
            store.refs[base + j] = Ref(int(c["ledger"][pos]), None, int(c["segment"][pos]),
                                      int(c["offset"][pos]), int(c["length"][pos]))
        order = np.lexsort((c["start"], c["ledger"]))
        ledgers = c["ledger"][order]
        bounds = np.flatnonzero(np.diff(ledgers)) + 1
        for lo, hi in zip(np.concatenate(([0], bounds)), np.concatenate((bounds, [len(order)]))):
            sel = order[lo:hi]
            idx = store.ledgers.setdefault(int(ledgers[lo]), LedgerIndex())
            idx.add_runs(c["start"][sel], c["end"][sel], ref_ids[sel], c["row"][sel])
        segs, seg_of = np.unique(c["segment"][first_pos], return_inverse=True)
        seg_live = np.bincount(seg_of, weights=c["length"][first_pos]).astype(np.int64)
        for seg, live in zip(segs.tolist(), seg_live.tolist()):
            if live > 0:
                store.segment_live[seg] = live
    scan_segments(store)


def scan_segments(store: EntryStore) -> None:
    for name in os.listdir(store.seg_dir):
        if name.endswith(".seg"):
            s = int(name[:-4])
            store.segment_size[s] = os.path.getsize(store.files.path(s))
            store.segment_live.setdefault(s, 0)
    for s in [s for s in store.segment_live if is_journal_segment(s)]:
        try:
            store.segment_size[s] = os.path.getsize(store.files.path(s))
        except FileNotFoundError:
            log.error("event=journal_segment_missing segment=%d", s)
    store.files.roll()    # always append to a fresh segment after restart
