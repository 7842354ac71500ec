"""Entry storage: Arrow record batches in a write cache and in segment files.

Theory of operation
-------------------
Entries arrive as whole Arrow batches (already durable in the journal).  The
store never loops over entries in Python: per ledger it keeps an index of
*runs* - maximal ranges of consecutive entry ids stored contiguously in one
batch - as sorted numpy arrays ``(start, end, ref, row)``.  A ``ref`` is one
stored batch: either still in memory (write cache) or at ``(segment, offset,
length)`` in a segment file, where it is a self-contained Arrow IPC stream.

Journal-resident batches: a big batch (``RAW_MIN_ROWS`` rows or
``RAW_MIN_BYTES`` bytes, kept as received) is not copied into a segment at
all.  Its journal record body is already that IPC stream, durable before the
add was acknowledged, so ``add(..., location=(journal seq, offset))`` makes a
*located* memory ref and the flush just switches it to the journal file, a
"journal segment" with id ``JOURNAL_SEGMENT_BASE + seq``.  Every byte is
written once instead of twice.  Journal segments are read like segments,
counted in ``segment_live`` like segments, compacted like segments (see
``compaction``: only below the checkpoint's journal file, so never a file
replay may still read), but never deleted here: the journal deletes them
(``delete_before`` with ``journal_seqs_in_use()`` kept) once the persisted
index no longer needs them.
A contiguous ledger batch of 1000 entries costs one run, so memory grows with
batches, not entries.

Ordering obligations:
  * ``add`` keeps the FIRST copy of an entry: ids already indexed are
    filtered out with a vectorised membership test (duplicate adds are
    idempotent, never an error).
  * ``flush`` = ``flush_begin`` (snapshot the write cache under the lock) ->
    ``write_snapshot`` (one concatenated, id-sorted batch per ledger appended
    to the current segment, fsync'd; the lock held only to look up a slice
    of refs, see ``WriteCache.drain``) -> ``flush_commit`` (swap the ledger's
    memory runs for segment runs under the lock, then drop the flushed refs
    a slice at a time).  Readers
    and duplicate checks see the memory runs until the swap.  A write or
    fsync that fails in ``write_snapshot`` propagates and ``flush_commit`` is
    not run: the memory runs stay (reads go on), and the caller (the bookie's
    checkpoint) must persist no index or journal position past the failure -
    it pins the bookie read-only until a restart replays the journal.  The
    fsync is never retried (after a failed fsync the dirty pages may be gone).
  * Segments whose live bytes drop to zero (GC) or below the compaction ratio
    are dropped / rewritten (``compaction.compact``); files are deleted only
    after the caller has persisted an index that no longer references them
    (``dead_segments``).
  * ``store_index.index_table``/``load_index`` persist and restore the run
    index (segment runs only; memory runs are rebuilt by journal replay).
    Every change to a ledger's segment runs is marked under the lock, so a
    checkpoint can persist only what changed since the last one
    (``store_index.take_delta``): ``flush_commit`` records the refs it adds
    (``index_appended``); compaction, ``drop_ledger`` and ``quarantine``,
    which move or remove runs, mark the whole ledger (``index_changed``).

The files themselves (segment and journal files, their sizes and live bytes,
the current segment, memory maps and the decoded-batch cache) are
``segment_files.SegmentFiles``, the store's ``files``; the ref table and the
batches still in memory (lone adds in per-ledger runs of records) are
``write_cache.WriteCache``, the store's ``cache``; this module keeps the
index, reads and the flush.
"""
from __future__ import annotations

import functools
import logging
import os
import threading
from dataclasses import dataclass, field
from typing import Callable, Optional

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from bookie_server.storage import flush_slices, write_cache
from bookie_server.storage.run_index import LedgerIndex, runs_of
from bookie_server.storage.segment_files import (JOURNAL_SEGMENT_BASE, SegmentFiles,
                                                 is_journal_segment, journal_segment)
from bookie_server.storage.write_cache import (Ref, WriteCache, WrittenRun, cached_bytes,
                                                decode_records)
from bookie_server.direct_buffers import ANSWER_BUFFERS
from pybk_spark.wire.entries import ENTRY_SCHEMA, empty_batch, one_batch, one_batch_into, Record

log = logging.getLogger("bookie.store")

_EMPTY = empty_batch()
RAW_MIN_ROWS = 128     # batches with this many rows, or of this many bytes, are
RAW_MIN_BYTES = 64 << 10   # written to segments as received (no re-encoding)

POOLED_ANSWER_ROWS = 1024   # answers of this many rows are joined in pooled memory
SLICE_READ_MAX_ROWS = 256  # sparse reads of up to this many rows gather row slices (one copy)


def _within_bytes(table: pa.Table, max_bytes: int, limited: bool, gather: bool = False
                  ) -> tuple[pa.RecordBatch | pa.Table, bool]:
    """A read's rows as one batch, cut after the last row within ``max_bytes``
    of payload (at least one row); ``limited`` turns true if cut.  ``gather``
    (a pull's read of whole stored batches): an answer of
    ``POOLED_ANSWER_ROWS`` or more stays a table of its stored batches, which
    the lane sends from where they lie (``wire.entry_parts.rows_parts``) and
    gRPC joins (``answer_batch``); other reads are joined here."""
    sizes = pc.binary_length(table.column("payload")).to_numpy(zero_copy_only=False)
    cum = np.cumsum(sizes)
    if cum[-1] > max_bytes:
        keep = max(1, int(np.searchsorted(cum, max_bytes, side="right")))
        if keep < table.num_rows:
            table = table.slice(0, keep)
            limited = True
    if gather and table.num_rows >= POOLED_ANSWER_ROWS:
        return table, limited
    return answer_batch(table), limited


def answer_batch(rows: pa.RecordBatch | pa.Table) -> pa.RecordBatch:
    """A read answer as one record batch: a large one joined in pooled memory."""
    if isinstance(rows, pa.Table) and rows.num_rows >= POOLED_ANSWER_ROWS:
        return one_batch_into(rows, ANSWER_BUFFERS.take)
    return one_batch(rows)


@dataclass
class FlushSnapshot:
    by_ledger: dict[int, list[int]]      # ledger -> memory ref ids
    results: Optional[dict[int, list[WrittenRun]]] = None     # ledger -> its written runs
    # ledger -> (its index when written, the write-cache bytes of its refs)
    cached: dict[int, tuple[LedgerIndex, int]] = field(default_factory=dict)


class EntryStore:
    def __init__(self, directory: str, *, segment_max_bytes: int = 256 << 20,
                 batch_cache_size: int = 256, mmap_cache_size: int = 32,
                 journal_dir: Optional[str] = None,
                 fsync: Callable[[int], None] = os.fsync, sync_every_bytes: int = 0):
        self.dir = directory
        # the checkpoint's fsync, injected like a clock (fault tests); a failure
        # propagates: the caller must not persist an index past it
        self.fsync = fsync
        self.journal_dir = journal_dir          # None: big batches are copied as before
        self.files = SegmentFiles(directory, segment_max_bytes=segment_max_bytes,
                                  batch_cache_size=batch_cache_size,
                                  mmap_cache_size=mmap_cache_size, journal_dir=journal_dir,
                                  fsync=fsync, sync_every_bytes=sync_every_bytes)
        self.seg_dir = self.files.seg_dir
        self.segment_max_bytes = segment_max_bytes
        self.raw_min_rows = RAW_MIN_ROWS
        self.raw_min_bytes = RAW_MIN_BYTES
        self.lock = threading.RLock()
        self.ledgers: dict[int, LedgerIndex] = {}
        self.cache = WriteCache(self.lock)
        self.refs = self.cache.refs                    # ref id -> Ref (the same dict)
        self.segment_live = self.files.live            # segment -> live bytes
        self.segment_size = self.files.size            # segment -> bytes
        # since the last persisted index: ledgers whose segment runs moved or
        # went (all their runs are persisted again), and the refs a flush
        # added to other ledgers (only those runs are persisted)
        self.index_changed: set[int] = set()
        self.index_appended: dict[int, list[int]] = {}

    @property
    def write_cache_bytes(self) -> int:
        """Bytes the write cache holds (not yet in segments)."""
        return self.cache.nbytes

    # -- writes -----------------------------------------------------------------
    def add(self, ledger_id: int, batch: pa.RecordBatch, raw: Optional[bytes] = None,
            location: Optional[tuple[int, int]] = None, cold: bool = False) -> int:
        """Index a validated batch (ascending ids).  Returns rows kept.  ``raw``
        (the batch's IPC stream bytes) lets a big batch go to a segment as is;
        ``location`` (journal seq, offset) says where the journal holds ``raw``
        durably, so a big batch is never copied at all.  ``cold``: such a
        located batch is not kept in memory either (``write_cache.Ref``):
        its reads go to the journal file."""
        if batch.num_rows == 0:
            return 0
        ids = batch.column(1).to_numpy()
        with self.lock:
            idx = self.ledgers.get(ledger_id)
            if idx is None:
                idx = self.ledgers[ledger_id] = LedgerIndex()
            if ids[0] <= idx.max_entry:
                dup = idx.contains(ids)
                if dup.all():
                    return 0
                if dup.any():
                    keep = ~dup
                    batch = batch.filter(pa.array(keep))
                    ids = ids[keep]
                    raw = None
            as_received = raw is not None and (batch.num_rows >= self.raw_min_rows
                                               or len(raw) >= self.raw_min_bytes)
            if (as_received and raw is not None and location is not None
                    and self.journal_dir is not None):
                ref = Ref(ledger_id, None if cold else batch, journal_segment(location[0]),
                          location[1], len(raw), cold=cold)
            else:
                ref = Ref(ledger_id, batch, raw=raw if as_received else None)
            if not ref.cold:
                ref.cached = cached_bytes(batch)
            ref_id = self.cache.put(ledger_id, ref)
            starts, ends, rows = runs_of(ids)
            refs = np.array([ref_id], np.int64) if len(starts) == 1 else np.full(len(starts), ref_id, np.int64)
            idx.add_runs(starts, ends, refs, rows)
            return len(ids)

    def add_entry(self, ledger_id: int, entry_id: int, record: Record) -> int:
        """Index a lone add's entry record (checked), held as received in
        its ledger's run (``write_cache``): no batch is built until it is
        read or flushed.  Returns rows kept."""
        with self.lock:
            idx = self.ledgers.get(ledger_id)
            if idx is None:
                idx = self.ledgers[ledger_id] = LedgerIndex()
            elif entry_id <= idx.max_entry and idx.contains(np.array([entry_id], np.int64))[0]:
                return 0                       # the first copy is kept
            self.cache.put_entry(ledger_id, idx, entry_id, record)
            return 1

    def reserve_ref_ids(self, n: int) -> int:
        """Set aside ``n`` ref ids (for refs a loaded index adds); the first."""
        return self.cache.reserve(n)

    # -- reads ------------------------------------------------------------------
    def has_ledger(self, ledger_id: int) -> bool:
        return ledger_id in self.ledgers

    def read(self, ledger_id: int, first: int, last: int, max_entries: int,
             max_bytes: int, sparse: bool = False,
             stripe: Optional[tuple[int, int]] = None) -> tuple[pa.RecordBatch | pa.Table, bool]:
        """Contiguous entries from ``first``; (batch, hit_limit); a large
        sparse read's whole stored batches as a table (``_within_bytes``).  Empty batch
        means ``first`` is not stored here.  ``sparse``: every stored entry in
        [first, last] instead, gaps skipped (re-replication / replicas check,
        striped reads); ``stripe=(E, slot)`` keeps only ids e % E == slot."""
        fn = functools.partial(self._read_sparse, stripe=stripe) if sparse else self._read
        try:
            return fn(ledger_id, first, last, max_entries, max_bytes)
        except FileNotFoundError:   # raced with compaction + segment deletion: re-locate
            return fn(ledger_id, first, last, max_entries, max_bytes)

    def _read_sparse(self, ledger_id: int, first: int, last: int, max_entries: int,
                     max_bytes: int, stripe: Optional[tuple[int, int]] = None
                     ) -> tuple[pa.RecordBatch | pa.Table, bool]:
        with self.lock:
            idx = self.ledgers.get(ledger_id)
            if idx is None:
                return empty_batch(), False
            refs, rows, counts, piece_first = idx.locate_sparse(first, last, max_entries)
            by_id = {r: self.refs[r] for r in np.unique(refs).tolist()}
            # a run of lone adds: the rows read, copied now (freed in slices
            # once flushed), from its first row read on
            runs = {r: ref.records_read(refs == r, rows, counts) for r, ref in by_id.items()
                    if ref.entries is not None}
        if len(counts) == 0:
            return empty_batch(), False
        ref_objs = list(by_id.values())
        for r, (lo, records) in runs.items():
            by_id[r] = Ref(by_id[r].ledger, decode_records(records))
            rows = rows - np.where(refs == r, lo, 0)
        offsets = np.cumsum(counts) - counts
        take_rows = np.repeat(rows - offsets, counts) + np.arange(int(counts.sum()))
        piece_of_row = np.repeat(np.arange(len(counts)), counts)
        ref_of_row = refs[piece_of_row]
        # max_entries counts the ids scanned, before any stripe filter
        limited = int(counts.sum()) >= max_entries and int(piece_first[-1] + counts[-1] - 1) < last
        if stripe is not None:
            ids_of_row = take_rows - rows[piece_of_row] + piece_first[piece_of_row]
            mine = ids_of_row % stripe[0] == stripe[1]
            take_rows, ref_of_row = take_rows[mine], ref_of_row[mine]
            if len(take_rows) == 0:
                return empty_batch(), limited
        if stripe is None:
            # every stored id of the span (a pull, a replicas check): each
            # stored batch is read once, whole, around the page cache, the
            # neighbours in a file together
            used = list(dict.fromkeys(ref_of_row.tolist()))
            got = dict(zip(used, self.files.batches_whole([by_id[r] for r in used])))
        else:
            self.files.will_need(ref_objs, max_bytes)
            got = {}

        def stored(ref_id: int) -> pa.RecordBatch:
            batch = got.get(ref_id)
            if batch is None:           # a striped read's: through the map, when first used
                batch = got[ref_id] = self.files.batch_of(by_id[ref_id])
            return batch

        if len(take_rows) <= SLICE_READ_MAX_ROWS:
            # few (large) entries: zero-copy row slices, copied once by combine_chunks below
            parts = [stored(ref).slice(row, 1)
                     for ref, row in zip(ref_of_row.tolist(), take_rows.tolist())]
        else:   # one piece per run of rows in the same stored batch: a zero-copy
            # slice where the run is contiguous (a copy's or a whole fragment's
            # read), else one take()
            cuts = np.flatnonzero(np.diff(ref_of_row)) + 1
            bounds = np.concatenate(([0], cuts, [len(ref_of_row)]))
            gaps = np.concatenate(((np.diff(take_rows) != 1), [False])).astype(np.int64)
            gapped = np.add.reduceat(gaps, bounds[:-1]) - gaps[bounds[1:] - 1]
            parts = []
            for a, b, g in zip(bounds[:-1].tolist(), bounds[1:].tolist(), gapped.tolist()):
                rows_of = stored(int(ref_of_row[a]))
                parts.append(rows_of.take(pa.array(take_rows[a:b])) if g
                             else rows_of.slice(int(take_rows[a]), b - a))
        table = pa.Table.from_batches(parts, schema=ENTRY_SCHEMA)
        # a pull's answer (every stored id of a span, whole stored batches) is
        # sent from where its batches lie, measured in docs/performance.md (8)
        return _within_bytes(table, max_bytes, limited, gather=stripe is None)

    def _read(self, ledger_id: int, first: int, last: int, max_entries: int,
              max_bytes: int) -> tuple[pa.RecordBatch, bool]:
        with self.lock:
            idx = self.ledgers.get(ledger_id)
            pieces = idx.locate(first, last, max_entries) if idx is not None else []
            # a run's records are copied now (write_cache: freed in slices once flushed)
            located = [(ref, row, n, ref.records(row, n))
                       for ref, row, n in ((self.refs[r], row, n) for r, row, n in pieces)]
        if not located:
            return _EMPTY, False
        self.files.will_need([p[0] for p in located], max_bytes)
        slices = [self.files.batch_of(ref).slice(row, n) if records is None
                  else decode_records(records) for ref, row, n, records in located]
        table = pa.Table.from_batches(slices, schema=ENTRY_SCHEMA)
        got = table.num_rows
        limited = got >= max_entries and got < last - first + 1
        return _within_bytes(table, max_bytes, limited)

    # -- flush --------------------------------------------------------------------
    def flush_begin(self) -> FlushSnapshot:
        with self.lock:
            return FlushSnapshot(self.cache.take())

    def write_snapshot(self, snap: FlushSnapshot) -> None:
        """Append the snapshot to segments; fsync.  No lock held but for a
        slice of refs at a time (``flush_slices``: the threads serving adds
        take the GIL and the lock between slices).  Big batches are written
        as received; small ones are merged per ledger.  The appender syncs
        every ``sync_every_bytes`` on the way (``segment_files.SegmentAppend``)."""
        results: dict[int, list[WrittenRun]] = {}
        snap.results = results
        touched: set[int] = set()
        fh = None
        try:
            for ledger_id, ref_ids in snap.by_ledger.items():
                with self.lock:     # the index's arrays are replaced, never changed
                    idx = self.ledgers.get(ledger_id)
                    parts = idx.table_parts() if idx is not None else None
                got = self.cache.drain(ledger_id, parts, ref_ids) if parts is not None else None
                if idx is None or got is None:     # dropped by GC meanwhile
                    continue
                written, out, cached = got
                for data, r_starts, r_ends, r_rows in out:
                    if (fh is None or self.segment_size.get(self.files.current, 0)
                            >= self.segment_max_bytes):
                        if fh is not None:
                            fh.sync()
                            fh.close()
                        fh = self.files.open_for_append()
                    offset = self.segment_size[self.files.current]
                    fh.write(data)
                    self.segment_size[self.files.current] = offset + len(data)
                    touched.add(self.files.current)
                    written.append((Ref(ledger_id, None, self.files.current, offset, len(data)),
                                    r_starts, r_ends, r_rows))
                results[ledger_id] = written
                snap.cached[ledger_id] = (idx, cached)
                flush_slices.pause()
            if fh is not None:
                fh.sync()
        finally:
            if fh is not None:
                fh.close()
        if touched:
            self.files.fsync_dir()

    def flush_commit(self, snap: FlushSnapshot) -> None:
        """Swap the snapshot's memory runs for its segment runs, under the
        lock (numpy work and a few new refs per ledger: readers and duplicate
        checks switch at once).  The flushed refs then leave ``refs`` a slice
        at a time, each slice popped under the lock and freed outside it (a
        run's records a slice at a time too: freeing a record costs the GIL a
        few hundred ns, a checkpoint frees thousands), with a pause between
        slices.  No index names them any more, and the write cache no longer
        counts them: what sees them meanwhile (``refs_snapshot``) skips
        memory refs."""
        olds = {l: np.array(r, np.int64) for l, r in snap.by_ledger.items()}
        nbytes = 0
        with self.lock:
            for ledger_id, old in olds.items():
                written = (snap.results or {}).get(ledger_id) or []
                idx = self.ledgers.get(ledger_id)
                if idx is not None:
                    idx.remove_refs(old)
                    for new_ref, starts, ends, rows in written:
                        rid = self.cache.new_ref(new_ref)
                        idx.add_runs(starts, ends, np.full(len(starts), rid, np.int64), rows)
                        self.index_appended.setdefault(ledger_id, []).append(rid)
                        self.segment_live[new_ref.segment] = \
                            self.segment_live.get(new_ref.segment, 0) + new_ref.length
                        if is_journal_segment(new_ref.segment):   # extent, for compaction
                            self.segment_size[new_ref.segment] = max(
                                self.segment_size.get(new_ref.segment, 0),
                                new_ref.offset + new_ref.length)
                    counted = snap.cached.get(ledger_id)
                    if counted is not None and counted[0] is idx:   # not dropped (that uncounts)
                        nbytes += counted[1]
            self.cache.nbytes -= nbytes
        for ref_ids in snap.by_ledger.values():
            for ids_slice in flush_slices.in_slices(ref_ids):
                with self.lock:
                    gone = self.cache.pop_slice(ids_slice)
                write_cache.release(gone)
                del gone
            flush_slices.pause()

    def flush(self) -> None:
        snap = self.flush_begin()
        if snap.by_ledger:
            self.write_snapshot(snap)
        self.flush_commit(snap)

    # -- GC -----------------------------------------------------------------------
    def drop_ledger(self, ledger_id: int) -> None:
        with self.lock:
            self.index_changed.add(ledger_id)
            idx = self.ledgers.pop(ledger_id, None)
            self.cache.drop(ledger_id)
            if idx is None:
                return
            for r in np.unique(idx.table_parts()[2]):
                ref = self.refs.pop(int(r), None)
                if ref is None:
                    continue
                if ref.in_memory:
                    self.cache.nbytes -= ref.cached
                else:
                    self.segment_live[ref.segment] -= ref.length

    def dead_segments(self) -> list[int]:
        """Segment files no live batch is in (journal files excluded: the
        journal deletes those, see ``journal_seqs_in_use``)."""
        with self.lock:
            return [s for s, live in self.segment_live.items()
                    if live <= 0 and s != self.files.current and not is_journal_segment(s)]

    def journal_seqs_in_use(self) -> frozenset[int]:
        """Journal files that flushed refs read from (the journal keeps them)."""
        with self.lock:
            return frozenset(s - JOURNAL_SEGMENT_BASE for s, live in self.segment_live.items()
                             if live > 0 and is_journal_segment(s))

    def journal_live_bytes(self) -> int:
        """Bytes of flushed batches that live inside journal files."""
        with self.lock:
            return sum(live for s, live in self.segment_live.items() if is_journal_segment(s))

    def forget_journal_files(self, seqs: list[int]) -> None:
        """The journal deleted these files (no live ref pointed into them)."""
        with self.lock, self.files.io_lock:
            self.files.forget([journal_segment(seq) for seq in seqs])

    def delete_segments(self, segs: list[int]) -> None:
        with self.lock, self.files.io_lock:
            self.files.delete(segs)

    # -- damage (scrubber) -------------------------------------------------------------
    def refs_snapshot(self) -> tuple[list[int], list[Ref]]:
        """(ref ids, refs) as they are now.  Refs are never changed in place
        (a move or a flush puts a new one in), so the lock is held only for
        the two C-level copies (about 30 ms at a million refs); walking them
        in Python (0.6-0.8 s at a million) happens after it."""
        with self.lock:
            return list(self.refs), list(self.refs.values())

    def flushed_refs(self) -> list[tuple[int, Ref, str]]:
        """(ref id, ref, file path) of every batch stored in a file, by position."""
        ids, refs = self.refs_snapshot()
        out = [(r, ref, self.files.path(ref.segment)) for r, ref in zip(ids, refs)
               if not ref.in_memory]
        return sorted(out, key=lambda p: (p[1].segment, p[1].offset))

    def quarantine(self, ref_id: int) -> list[tuple[int, int]]:
        """Take a damaged stored batch out of the index; the (first, last)
        id runs it held (no longer stored here).  [] if it is gone already."""
        with self.lock, self.files.io_lock:
            ref = self.refs.pop(ref_id, None)
            idx = self.ledgers.get(ref.ledger) if ref is not None else None
            if ref is None or idx is None:
                return []
            self.index_changed.add(ref.ledger)
            starts, ends, refs, _rows = idx.table_parts()
            mine = refs == ref_id
            out = list(zip(starts[mine].tolist(), ends[mine].tolist()))
            idx.remove_refs(np.array([ref_id], np.int64))
            self.segment_live[ref.segment] = self.segment_live.get(ref.segment, 0) - ref.length
            self.files.uncache(ref.segment, ref.offset)
            return out

    # -- info -----------------------------------------------------------------------
    def ledger_ids(self) -> list[int]:
        with self.lock:
            return sorted(self.ledgers)

    def entry_count(self) -> int:
        with self.lock:
            return sum(i.count for i in self.ledgers.values())

    def max_entry(self, ledger_id: int) -> int:
        with self.lock:
            idx = self.ledgers.get(ledger_id)
            return idx.max_entry if idx is not None else -1
