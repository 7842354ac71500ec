"""Segment compaction: rewrite sparse segments so GC'd space can be reclaimed.

Theory of operation
-------------------
A segment (or journal segment: a journal file the entry store indexes big
batches in, see ``entry_store``) whose live bytes fall below
``min_live_ratio`` of its size is a victim.  ``compact`` copies the live
batches of every victim to the end of the store's current segment as raw
bytes (each batch is a self-contained Arrow IPC stream: no decode, no
re-encode), fsyncs, and then re-points the refs at the copies.  The victims
are left with no live bytes, so ``EntryStore.dead_segments`` lists them (or,
for journal files, the journal deletes them once ``journal_seqs_in_use`` no
longer names them).  Compaction works through the store's public state and
its ``files`` (``storage/segment_files.py``), under ``store.lock`` while it
reads or changes them; the stored batches in victims are found from a
snapshot of the refs (``EntryStore.refs_snapshot``), walked without the lock.

Ordering obligations:
  * The copy is written and fsync'd (file and directory: it may be a new
    segment) before any ref is switched to it, under
    ``store.lock``; readers keep using the old location until then.  A ref
    that changed meanwhile (its ledger dropped by GC) is not switched.
  * Old files are deleted only after the caller has persisted an index that
    no longer references them (checkpoint, then ``dead_segments`` /
    ``delete_segments``); a read racing with the deletion re-locates.
  * Journal files are victims only below ``journal_below_seq`` (the
    checkpoint's journal file): replay never reads them again, and torn-tail
    truncation only happens after the checkpoint position.
  * A sparse current segment is rolled away from first, so no batch is
    copied into a victim.
  * Copies are appended to the current segment without the store lock, like
    ``EntryStore.write_snapshot``: the caller never runs the two at once (the
    bookie runs both under its checkpoint lock).
"""
from __future__ import annotations


from bookie_server.storage.entry_store import EntryStore
from bookie_server.storage.write_cache import Ref
from bookie_server.storage.segment_files import JOURNAL_SEGMENT_BASE, is_journal_segment


def compact(store: EntryStore, min_live_ratio: float, journal_below_seq: int = 0) -> int:
    """Copy live batches of sparse segments into the current segment (raw
    bytes, no decode).  Old segments become dead; caller checkpoints, then
    deletes them.  Journal files are candidates only below
    ``journal_below_seq`` (the checkpoint's journal file: replay never
    reads them again).  Returns the number of segments compacted."""
    with store.lock:
        victims = [s for s, live in store.segment_live.items()
                   if store.segment_size.get(s, 0) > 0
                   and live / store.segment_size[s] < min_live_ratio
                   and (not is_journal_segment(s)
                        or s - JOURNAL_SEGMENT_BASE < journal_below_seq)]
        if store.files.current in victims:   # roll away from a sparse current segment
            store.files.roll()
        victims = [s for s in victims if store.segment_live.get(s, 0) > 0]
    if not victims:              # the common case: no walk over every stored batch
        return 0
    in_victims = set(victims)
    ids, refs = store.refs_snapshot()     # walked without the lock: a ref dropped
    moving = [(rid, ref) for rid, ref in zip(ids, refs)     # meanwhile is not switched
              if not ref.in_memory and ref.segment in in_victims]
    if not moving:
        return 0
    fh = store.files.open_for_append()
    moved = []
    try:
        for rid, ref in moving:
            data = store.files.read_bytes(ref.segment, ref.offset, ref.length)
            off = store.segment_size[store.files.current]
            fh.write(data)
            store.segment_size[store.files.current] = off + ref.length
            moved.append((rid, ref, store.files.current, off))
        fh.sync()
    finally:
        fh.close()
    store.files.fsync_dir()         # the copy may be a new file: its name must survive too
    with store.lock:
        for rid, ref, seg, off in moved:
            if store.refs.get(rid) is ref:
                store.segment_live[ref.segment] -= ref.length
                store.segment_live[seg] = store.segment_live.get(seg, 0) + ref.length
                store.refs[rid] = Ref(ref.ledger, None, seg, off, ref.length)
                store.index_changed.add(ref.ledger)
    return len(victims)
