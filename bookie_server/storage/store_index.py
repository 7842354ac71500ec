"""Persisting the entry store's run index: the table a checkpoint writes, and
loading it back at start-up.

Theory of operation
-------------------
``index_table`` turns every ledger's segment runs into one Arrow table
(ledger, start, end, segment, offset, length, row); memory runs are not in
it, because journal replay rebuilds them.  ``take_delta`` gives a
checkpoint only the runs of the ledgers changed since the last checkpoint
(``EntryStore.index_changed``); a checkpoint persists such a delta beside the
tables persisted before it (checkpoint_file.py), and ``fold`` puts a table
and the deltas after it back together, at load and when a checkpoint writes
a new whole table from its files.  ``load_index`` restores refs, runs and
per-segment live bytes from such a table, then ``scan_segments`` sizes every
segment file on disk (and every journal file an index run points into).

Ordering obligations:
  * A delta is cut under ``store.lock`` as the changed set is cleared, so it
    is one consistent cut of those ledgers and every change is in exactly
    one persisted table: this delta, or the next.  Nothing here ever walks
    the whole store under the lock, except ``index_table`` (tests and tools).
  * The caller persists a cut (fsync) before deleting any file the previous
    index referenced.
  * ``load_index`` runs before journal replay and before the bookie serves:
    nothing else touches the store yet.  After it, appends always go to a
    fresh segment (``store.files.roll()``), never into a file of unknown tail.
"""
from __future__ import annotations

import logging
import os

import numpy as np
import pyarrow as pa

from bookie_server.storage.entry_store import EntryStore, Ref
from bookie_server.storage.segment_files import is_journal_segment
from bookie_server.storage.run_index import LedgerIndex

log = logging.getLogger("bookie.store")

INDEX_SCHEMA = pa.schema([(n, pa.int64()) for n in
                          ("ledger", "start", "end", "segment", "offset", "length", "row")])


def index_table(store: EntryStore) -> pa.Table:
    """Segment runs of every ledger (memory runs are not persisted): the
    whole index, one consistent cut."""
    with store.lock:
        return _rows(store, list(store.ledgers))


def take_delta(store: EntryStore) -> tuple[pa.Table, list[int]]:
    """One consistent cut of the ledgers changed since the last cut: (their
    segment runs, those ledgers, ascending).  The changed set is cleared."""
    with store.lock:
        changed = sorted(store.index_changed)
        store.index_changed = set()
        return _rows(store, changed), changed


def _rows(store: EntryStore, ledger_ids: list[int]) -> pa.Table:
    """The segment runs of these ledgers (a dropped one has none); caller
    holds ``store.lock``.  Work is per ledger and per stored batch of it,
    never over the whole store."""
    cols: list[list[np.ndarray]] = [[] for _ in INDEX_SCHEMA]
    for ledger_id in ledger_ids:
        idx = store.ledgers.get(ledger_id)
        if idx is None:
            continue
        starts, ends, refs, rows = idx.table_parts()
        if len(refs) == 0:
            continue
        uniq, inverse = np.unique(refs, return_inverse=True)
        loc = []
        for rid in uniq.tolist():
            r = store.refs.get(rid)
            loc.append((r.segment, r.offset, r.length) if r is not None and r.batch is None
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


def fold(table: pa.Table, deltas: list[tuple[pa.Table, list[int]]]) -> pa.Table:
    """``table`` with each delta applied in order: a ledger a delta names has
    exactly that delta's runs (none: dropped), and only the last delta
    naming a ledger counts.  One pass over ``table``, whatever the number of
    deltas."""
    if not deltas:
        return table
    last: dict[int, int] = {}
    for i, (_, ledgers) in enumerate(deltas):
        for ledger in ledgers:
            last[int(ledger)] = i
    named = np.fromiter(last, np.int64, len(last))
    parts = [table.filter(pa.array(~np.isin(table.column("ledger").to_numpy(), named)))]
    for i, (delta, ledgers) in enumerate(deltas):
        mine = np.asarray([x for x in ledgers if last[int(x)] == i], np.int64)
        if delta.num_rows and len(mine):
            parts.append(delta if len(mine) == len(ledgers) else
                         delta.filter(pa.array(np.isin(delta.column("ledger").to_numpy(), mine))))
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
