"""The write cache: stored batches by ref id, and the ones still in memory.

The run index (``run_index``) names a stored batch by a *ref id*; this module
keeps the table of those ids (``refs``: batches in memory and batches in
files alike, one id counter, ``new_ref``) and the write cache's own part:
which refs of each ledger are still in memory (``by_ledger``), waiting for a
checkpoint to write them to a segment, and the bytes they hold (``nbytes``,
the bound ``write_cache_max_bytes`` and add admission look at).

Lone adds: a ledger's lone entries, each kept as the record it arrived in
(``pybk_spark.wire.entries.ENTRY_RECORD``), go into the ledger's open *run*:
one memory ref whose ``entries`` list grows by one record per add, the
record's row being its position in the list.  A lone add costs a list
append and an index append (``LedgerIndex.add_entry`` extends the last run
of consecutive ids), with no object of its own; a checkpoint handles one ref
per ledger instead of one per entry.  ``take`` (the checkpoint's snapshot)
closes every open run: later adds open new ones, so a run's list never
grows while a checkpoint writes it.

A run's list is freed a slice at a time after a checkpoint (``release``):
freeing thousands of records in one go would hold the GIL against the
threads serving adds.  So a reader copies the records it reads out of a
run's list under the store's lock (``Ref.records``), never later, and
nothing decodes a run's list in place (``Ref``).
"""
from __future__ import annotations

import itertools
import threading
from typing import Optional, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from bookie_server.storage import flush_slices
from bookie_server.storage.run_index import LedgerIndex, runs_of
from pybk_spark.wire.entries import (ENTRY_SCHEMA, Record, batch_to_buffer, one_batch,
                                     records_to_batch)


def cached_bytes(batch: pa.RecordBatch) -> int:
    """Memory a cached batch holds, for the write cache's accounting: its
    buffers' sizes (``nbytes`` walks the buffers' ranges and costs ~10 us,
    as much as the rest of a one-entry add's indexing)."""
    size: int = batch.get_total_buffer_size()
    return size


def decode_records(records: Sequence[Record]) -> pa.RecordBatch:
    """Entry records as one batch: one record with ``records_to_batch``,
    more with ``flush_slices.decode``'s vector operations."""
    return records_to_batch(records) if len(records) == 1 else flush_slices.decode(records)


class Ref:
    """One stored batch: in memory (``batch``, or a run of lone adds'
    ``entries`` as received) or in a segment file; a memory ref with
    ``segment >= 0`` is *located*: already durable there (journal).
    ``cached`` is what a memory ref counts in the write cache's bytes (a
    run's grows with it).  A *cold* ref is a located one the write cache
    holds without its rows (``batch`` None, ``cold`` True): a recovery add's
    batch, a copy of entries written long before, which readers read back
    from the journal; it waits for a checkpoint like any memory ref
    (``in_memory``) and counts no bytes.

    A run's ``entries`` are never decoded in place: the list grows under the
    store's lock (``WriteCache.put_entry``) and is freed without it once
    flushed (``release``), and decoding walks it more than once.  A read
    takes the rows it wants under the lock (``records``, a copy: the reads
    of ``EntryStore``) and decodes the copy; a checkpoint decodes a run
    that ``take`` closed, before ``release`` (``WriteCache.drain``).  So
    ``batch`` is None for a run, and the readers that take a ref's
    ``batch`` (``segment_files.batch_of`` / ``batch_whole``, ``drain``)
    are handed no run (``segment_files`` refuses one with a ValueError
    naming it)."""
    __slots__ = ("ledger", "batch", "entries", "segment", "offset", "length", "raw", "cached",
                 "cold")

    def __init__(self, ledger: int, batch: Optional[pa.RecordBatch] = None,
                 segment: int = -1, offset: int = 0, length: int = 0,
                 raw: Optional[bytes] = None, entries: Optional[list[Record]] = None,
                 cold: bool = False):
        self.ledger, self.batch, self.raw, self.entries = ledger, batch, raw, entries
        self.segment, self.offset, self.length = segment, offset, length
        self.cached = 0
        self.cold = cold

    @property
    def in_memory(self) -> bool:
        """Held by the write cache: not yet switched to a file by a checkpoint."""
        return self.batch is not None or self.entries is not None or self.cold

    def records(self, row: int, count: int) -> Optional[list[Record]]:
        """A run's records of rows ``row`` .. ``row + count - 1`` (a copy: call
        it under the store's lock), None for any other ref."""
        entries = self.entries
        return entries[row:row + count] if entries is not None else None

    def records_read(self, mine: np.ndarray, rows: np.ndarray, counts: np.ndarray
                     ) -> tuple[int, list[Record]]:
        """(first row, the records from it to the last row read) of a run
        whose pieces of a located read ``mine`` selects (``rows``, ``counts``:
        every piece's first row and row count); a copy, under the store's lock."""
        lo = int(rows[mine].min())
        records = self.records(lo, int((rows[mine] + counts[mine]).max()) - lo)
        return lo, records or []


# one run of a flush written to a segment (or located in the journal):
# (its new Ref, the run starts, ends and rows it holds)
WrittenRun = tuple[Ref, np.ndarray, np.ndarray, np.ndarray]
# what a flush writes: (bytes, the run starts, ends and rows they hold)
ToWrite = tuple[bytes | pa.Buffer, np.ndarray, np.ndarray, np.ndarray]


class WriteCache:
    """The ref table and the memory refs of each ledger.  Every method but
    ``drain`` runs under the store's lock (``lock``), which ``drain`` takes a
    slice of refs at a time."""

    def __init__(self, lock: threading.RLock) -> None:
        self.lock = lock
        self.refs: dict[int, Ref] = {}
        self.by_ledger: dict[int, list[int]] = {}     # ledger -> memory ref ids
        self.nbytes = 0
        self._next = 1
        # ledger -> its open run of lone adds: (ref id, ref, the ref's entries)
        self._runs: dict[int, tuple[int, Ref, list[Record]]] = {}

    def new_ref(self, ref: Ref) -> int:
        """The next ref id, naming ``ref``."""
        ref_id = self._next
        self._next = ref_id + 1
        self.refs[ref_id] = ref
        return ref_id

    def reserve(self, n: int) -> int:
        """Set aside ``n`` ref ids (for refs a loaded index adds); the first."""
        base = self._next
        self._next = base + n
        return base

    def put(self, ledger_id: int, ref: Ref) -> int:
        """A memory ref of ``ledger_id``: its id, its bytes counted."""
        ref_id = self.new_ref(ref)
        mem = self.by_ledger.get(ledger_id)
        if mem is None:
            mem = self.by_ledger[ledger_id] = []
        mem.append(ref_id)
        self.nbytes += ref.cached
        return ref_id

    def put_entry(self, ledger_id: int, idx: LedgerIndex, entry_id: int, record: Record) -> None:
        """A lone add's record (checked, not yet indexed) at the end of its
        ledger's open run, and indexed there."""
        run = self._runs.get(ledger_id)
        if run is None:
            records: list[Record] = []
            ref = Ref(ledger_id, entries=records)
            run = self._runs[ledger_id] = (self.put(ledger_id, ref), ref, records)
        ref_id, ref, entries = run
        idx.add_entry(entry_id, ref_id, len(entries))
        entries.append(record)
        n = len(record)
        ref.cached += n
        self.nbytes += n

    def take(self) -> dict[int, list[int]]:
        """Every ledger's memory ref ids, handed to a checkpoint; the open
        runs are closed."""
        taken = {ledger: ids for ledger, ids in self.by_ledger.items() if ids}
        self.by_ledger = {}
        self._runs = {}
        return taken

    def drain(self, ledger_id: int, parts: tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray],
              ref_ids: list[int]) -> Optional[tuple[list[WrittenRun], list[ToWrite], int]]:
        """One ledger's part of a checkpoint, from its index's runs
        (``parts``) and the memory refs ``take`` gave: (the runs that need
        no write, what to write, the write-cache bytes its refs count);
        None once the ledger is gone.  Big batches are written as received,
        small ones and runs of lone adds merged into one batch."""
        starts, ends, refs, rows = parts
        sel = np.isin(refs, np.array(ref_ids, np.int64))
        starts, ends, refs, rows = starts[sel], ends[sel], refs[sel], rows[sel]
        written: list[WrittenRun] = []
        out: list[ToWrite] = []
        small: list[pa.RecordBatch] = []
        cached = 0
        for ids_slice in flush_slices.in_slices(np.unique(refs).tolist()):
            with self.lock:
                objs = list(map(self.refs.get, ids_slice))
            for rid, o in zip(ids_slice, objs):
                if o is None:       # the ledger was dropped meanwhile
                    return None
                cached += o.cached
                if o.entries is not None:       # a run of lone adds (closed: it no longer grows)
                    small += [flush_slices.decode(part) for part in flush_slices.in_slices(o.entries)]
                elif o.segment >= 0:    # journal-resident: nothing to write, point at the journal
                    m = refs == rid
                    written.append((Ref(ledger_id, None, o.segment, o.offset, o.length),
                                    starts[m], ends[m], rows[m]))
                elif o.raw is not None:     # big: its received IPC bytes go as they are
                    m = refs == rid
                    out.append((o.raw, starts[m], ends[m], rows[m]))
                elif o.batch is not None:
                    small.append(o.batch)
        if small:      # whole batches (every row is indexed): one, sorted by entry id
            table = pa.Table.from_batches(small, schema=ENTRY_SCHEMA)
            ids = table.column(1).to_numpy()
            if len(ids) > 1 and not (ids[1:] > ids[:-1]).all():   # adds came in order,
                table = table.take(pc.sort_indices(table.column(1)))   # as a rule
                ids = table.column(1).to_numpy()
            batch = one_batch(table)
            out.append((batch_to_buffer(batch), *runs_of(ids)))   # written, not copied
        return written, out, cached

    def drop(self, ledger_id: int) -> None:
        """A deleted ledger's memory refs are no longer listed (its refs
        leave the table with its index)."""
        self.by_ledger.pop(ledger_id, None)
        self._runs.pop(ledger_id, None)

    def pop_slice(self, ref_ids: Sequence[int]) -> list[Optional[Ref]]:
        """Take refs out of the table (a checkpoint's flushed ones)."""
        return list(map(self.refs.pop, ref_ids, itertools.repeat(None)))


def release(gone: list[Optional[Ref]]) -> None:
    """Free refs taken out of the table, a run's records a slice at a time
    (with ``flush_slices.pause`` between slices); no lock held."""
    for ref in gone:
        entries = ref.entries if ref is not None else None
        while entries:
            del entries[-flush_slices.SLICE:]
            if entries:
                flush_slices.pause()
