"""Persisting the entry store's run index: the table a checkpoint writes, and
loading it back at start-up.

Theory of operation
-------------------
``index_table`` turns every ledger's segment runs into one Arrow table
(ledger, start, end, segment, offset, length, row); memory runs are not in
it, because journal replay rebuilds them.  ``load_index`` restores refs, runs
and per-segment live bytes from such a table, then ``scan_segments`` sizes
every segment file on disk (and every journal file an index run points into).

Ordering obligations:
  * The table is taken under ``store.lock``, so it is one consistent cut of
    the index; the caller persists it (fsync) before deleting any file the
    previous index referenced.
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
    """Segment runs of every ledger (memory runs are not persisted)."""
    cols: list[list[np.ndarray]] = [[] for _ in INDEX_SCHEMA]
    with store.lock:
        disk = sorted((rid, r.segment, r.offset, r.length) for rid, r in store.refs.items()
                      if r.batch is None)
        loc = np.array(disk, np.int64).reshape(-1, 4)
        for ledger_id, idx in store.ledgers.items():
            starts, ends, refs, rows = idx.table_parts()
            if len(refs) == 0 or len(loc) == 0:
                continue
            pos = np.minimum(np.searchsorted(loc[:, 0], refs), len(loc) - 1)
            on_disk = loc[pos, 0] == refs
            if not on_disk.any():
                continue
            p = pos[on_disk]
            cols[0].append(np.full(len(p), ledger_id, np.int64))
            cols[1].append(starts[on_disk])
            cols[2].append(ends[on_disk])
            cols[3].append(loc[p, 1])
            cols[4].append(loc[p, 2])
            cols[5].append(loc[p, 3])
            cols[6].append(rows[on_disk])
    arrays = [pa.array(np.concatenate(c) if c else np.empty(0, np.int64), pa.int64())
              for c in cols]
    return pa.Table.from_arrays(arrays, schema=INDEX_SCHEMA)


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
