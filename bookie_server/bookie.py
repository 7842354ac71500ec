"""The bookie core: journal + entry store + per-ledger states.  No gRPC here.

``Bookie`` is the lifecycle (start-up, replay, durable application, GC,
checkpoints) and owns its typed parts: the per-ledger states under the state
lock (``ledger_table.LedgerTable``), the read-only mode
(``bookie_mode.BookieMode``) and the request handlers
(``bookie_requests.RequestHandlers``), whose API it exposes.

Theory of operation
-------------------
Write path (``add_async``, bookie_requests.py): validate the Arrow batch in the caller's thread
(vectorised), pass admission (``admission.AddAdmission``: TooManyRequests
past the bounds on adds in progress and add memory), then under the state
lock decide (``ledger_state.decide_add``), update the in-memory state and
submit the journal records - MASTER_KEY first if the key is new, then
ADD_BATCH.  Deciding and submitting under one lock
makes journal order equal decision order: a fence decided before an add is
durable no later than it.  The journal thread, after the group's fdatasync,
runs ``_on_durable``: entries go into the store's write cache and the LAC is
advanced (readers and long polls see only durable entries), then the futures
complete and the caller answers.

Fence / explicit LAC: journaled and fdatasync'd BEFORE the reply.

Checkpoint (flusher thread, or on demand): snapshot the store's write cache
together with the journal position P it reflects, write its small batches to
segments and re-point its big ones at the journal file that already holds
them (no copy: ``entry_store``, journal-resident batches), persist the run
index (what changed since the last checkpoint, or all of it:
``checkpoint_file``) + ledger states + P atomically (``checkpoint.json``
names its index files; nothing is written when none of them changed), then
delete the journal files before P that hold no indexed batch, and
dead segments.  Restart loads
the checkpoint and replays the journal from P; replay is idempotent
(duplicate entries are kept-first, fences/keys/LACs are monotone).

GC deletes a ledger by journaling LEDGER_DELETED and then dropping it, so a
replay from an older checkpoint cannot resurrect it.

Storage failure (``bookie_mode.BookieMode.storage_failed``; docs/bookie.md,
"Storage failure"): a journal write/fdatasync failure (the journal's ``on_failure``) or a failed
checkpoint write/fsync pins the bookie read-only until restart: ``io_error``
is set at once, so adds (recovery adds too), fences, explicit LACs and GC
deletes get ReadOnly; the listeners (registrar) are told; the disk checker
cannot lift it; no checkpoint is written any more, so the last good one and
the journal after it are what the restart replays.  Reads go on.  Replay may
find records never acknowledged (the failed fsync may have persisted them):
BookKeeper's model allows it, and every LAC they carry was confirmed by
their writer, so the ledger state stays consistent.

Damage (``damage.py``): replay skips damaged journal records and the
scrubber takes damaged stored batches out of the index; the entries they may
have held go into ``lost`` (persisted in the checkpoint, published to the
metadata store for the auditor).  A read of a lost, not re-stored id answers
BookieIOError, never NoSuchEntry.
"""
from __future__ import annotations

import errno
import functools
import logging
import os
import shutil
import threading
import time
from typing import Any, Callable, Optional

import pyarrow as pa

from bookie_server.storage import compaction, damage, flush_slices, store_index
from bookie_server.journal import journal_replay
from bookie_server.serving.admission import AddAdmission
from pybk_spark.protocol import ledger_state as ls
from bookie_server import checkpoint_file
from bookie_server.bookie_mode import BookieMode
from bookie_server.bookie_requests import RequestHandlers
from bookie_server.config import BookieConfig, MiB
from bookie_server.storage.entry_store import EntryStore
from bookie_server.journal.journal import Journal
from bookie_server.journal.journal_format import LEDGER, LEDGER_LAC, Position, RecordType
from bookie_server.journal.journal_crc import Body
from bookie_server.journal.records import (AddRecord, DeleteRecord, EntryRecord, LacRecord,
                                           Submission)
from bookie_server.ledger_table import LedgerTable
from bookie_server.serving.metrics import BookieMetrics
from pybk_spark import errors
from pybk_spark.wire.entries import batch_from_bytes, parse_entry_record

log = logging.getLogger("bookie.core")


class Bookie:
    def __init__(self, cfg: BookieConfig, *, metrics: Optional[BookieMetrics] = None,
                 clock: Callable[[], float] = time.monotonic,
                 fsync: Callable[[int], None] = os.fdatasync,
                 pwritev: Callable[[int, list[Body], int], int] = os.pwritev,
                 store_fsync: Callable[[int], None] = os.fsync) -> None:
        # fsync / pwritev / store_fsync: the journal's and the entry store's
        # syscalls, injected like the clock (fault tests); production passes none
        self.cfg = cfg
        self.clock = clock
        self.metrics = metrics or BookieMetrics()
        self.data_dir = cfg.data_dir
        os.makedirs(self.data_dir, exist_ok=True)
        self.store = EntryStore(os.path.join(self.data_dir, "store"),
                                segment_max_bytes=cfg.segment_max_bytes,
                                journal_dir=os.path.join(self.data_dir, "journal"),
                                fsync=store_fsync, sync_every_bytes=cfg.checkpoint_sync_bytes)
        self.journal = Journal(os.path.join(self.data_dir, "journal"),
                               max_group_wait_s=cfg.journal_max_group_wait_ms / 1000.0,
                               max_group_bytes=cfg.journal_max_group_bytes,
                               flush_when_queue_empty=cfg.journal_flush_when_queue_empty,
                               sync_data=cfg.journal_sync_data,
                               max_file_bytes=cfg.journal_max_file_bytes,
                               prealloc_bytes=cfg.journal_prealloc_bytes,
                               page_cache_keep_bytes=(None if cfg.journal_page_cache_keep_mb < 0
                                                      else cfg.journal_page_cache_keep_mb * MiB),
                               lead_max_bytes=cfg.journal_lead_max_bytes,
                               direct_min_bytes=cfg.journal_direct_write_min_bytes,
                               clock=clock, metrics=self.metrics, fsync=fsync,
                               pwritev=pwritev, on_failure=self._journal_failed)
        self.ledgers = LedgerTable(self.store)
        self.states = self.ledgers.states       # the table's, under its lock (``cond``)
        self.cond = self.ledgers.cond
        self.mode = BookieMode(self.cond, self.metrics)
        self._applied = Position(0, 0)
        self._ckpt_lock = threading.Lock()
        self._ckpt_gen = 0
        # what the last checkpoint named; None: the next one writes the whole index
        self._index_files: Optional[checkpoint_file.IndexFiles] = None
        # (P, states, lost) persisted last
        self._last_written: Optional[tuple[Position, list[dict[str, Any]], dict[str, Any]]] = None
        self._flush_wanted = threading.Event()
        self._stop = threading.Event()
        self._flusher: Optional[threading.Thread] = None
        self.replayed_records = 0
        # the write cache's bytes read with no Python frame: admission asks on every add
        self.admission = AddAdmission(cfg.max_adds_in_progress, cfg.max_add_memory_bytes,
                                      functools.partial(getattr, self.store.cache, "nbytes"),
                                      on_refused=self.metrics.adds_refused.inc,
                                      on_full=self._flush_wanted.set)
        self.lost = damage.LostSet()       # filled in place from the checkpoint
        self.requests = RequestHandlers(cfg, self.ledgers, self.store, self.journal,
                                        self.admission, self.lost, self.mode, self._stop)
        # the request API, bound once (no extra call on the add path)
        self.add_async = self.requests.add_async
        self.add_entry = self.requests.add_entry
        self.add_entry_async = self.requests.add_entry_async
        self.add = self.requests.add
        self.fence = self.requests.fence
        self.write_lac = self.requests.write_lac
        self.master_key_of = self.requests.master_key_of
        self.lac_of = self.requests.lac_of
        self.read_lac = self.requests.read_lac
        self.read = self.requests.read

    # -- lifecycle ----------------------------------------------------------------------
    def open(self, *, background: bool = True) -> "Bookie":
        start = self._load_checkpoint()
        # Applied-up-to starts AT the checkpoint, not at (0, 0): a restart that
        # replays nothing and then checkpoints must not move the mark back to
        # the journal's beginning, or the next replay re-reads kept old files
        # (ones still holding indexed batches) and resurrects state that later,
        # since-deleted files had undone - e.g. a GC-deleted ledger's fence.
        self._applied = start
        tracker = damage.ReplayTracker(self.store.max_entry, self.store.ledger_ids)
        for pos, rtype, body in journal_replay.replay(self.journal.dir, start, tracker.on_damage):
            ledger_id, last_id = self._apply_record(rtype, body, (pos.seq, pos.offset - len(body)))
            if ledger_id is not None:
                tracker.on_record(ledger_id, last_id)
            self._applied = pos
            self.replayed_records += 1
        if tracker.damages:
            self.report_lost(tracker.ranges(functools.partial(damage.store_gaps, self.store)),
                             unattributed=True)
        self.journal.start(self._on_durable)
        with self.cond:     # every record before the fresh file is applied now
            self._applied = max(self._applied, Position(self.journal.durable_position.seq, 0))
        window = self.journal.cache_window
        self.metrics.bind_gauges(self.journal.queue_depth, lambda: self.store.write_cache_bytes,
                                 self.store.journal_live_bytes,
                                 (lambda: window.held) if window is not None else (lambda: 0))
        if background:
            self._flusher = threading.Thread(target=self._flush_loop, name="flusher", daemon=True)
            self._flusher.start()
        log.info("event=bookie_open ledgers=%d entries=%d replayed_records=%d",
                 len(self.store.ledgers), self.store.entry_count(), self.replayed_records)
        return self

    def close(self, *, checkpoint: bool = True) -> None:
        self._stop.set()
        self._flush_wanted.set()
        if self._flusher is not None:
            self._flusher.join()
        self.journal.close()
        if checkpoint and self.io_error is None:   # after a failure: restart replays
            self.checkpoint()

    # -- durable application (journal thread and replay) ---------------------------------
    def _on_durable(self, group: list[Submission], position: Position) -> None:
        with self.ledgers.lock:         # cond's lock (ledger_table.py)
            for sub in group:
                if type(sub) is EntryRecord:    # ADD_ENTRY (the last record): a lone add, first
                    self.store.add_entry(sub.ledger_id, sub.entry_id, sub.record)
                    self.states[sub.ledger_id] = ls.apply_entries(
                        self.ledgers.get(sub.ledger_id), sub.lac, sub.entry_id)
                    continue
                rec = sub.payload
                if rec is None:
                    continue
                if isinstance(rec, AddRecord):  # ADD_BATCH is the submission's last record
                    self._apply_batch(rec.ledger_id, rec.batch, rec.raw, (sub.seq, sub.body_at),
                                      rec.cold)
                elif isinstance(rec, DeleteRecord):
                    self._apply_delete(rec.ledger_id)
                elif isinstance(rec, LacRecord):
                    self.states[rec.ledger_id] = ls.apply_explicit_lac(
                        self.ledgers.get(rec.ledger_id), rec.lac)
            self._applied = position
            if self.ledgers.waiters:
                self.cond.notify_all()
        if self.store.write_cache_bytes > self.cfg.write_cache_max_bytes:
            self._flush_wanted.set()

    def _apply_batch(self, ledger_id: int, batch: pa.RecordBatch, raw: bytes | None,
                     location: tuple[int, int] | None = None, cold: bool = False) -> None:
        self.store.add(ledger_id, batch, raw, location, cold)
        lacs = batch.column(2).to_numpy()
        max_lac = int(lacs[0] if len(lacs) == 1 else lacs.max())   # a lone add: no reduction
        max_id = int(batch.column(1).to_numpy()[-1])
        self.states[ledger_id] = ls.apply_entries(self.ledgers.get(ledger_id), max_lac, max_id)

    def _apply_delete(self, ledger_id: int) -> None:
        self.states.pop(ledger_id, None)
        self.store.drop_ledger(ledger_id)

    def _apply_record(self, rtype: int, body: bytes,
                      location: tuple[int, int] | None = None) -> tuple[Optional[int], Optional[int]]:
        """Returns (ledger, last entry id of an add) for the damage tracker."""
        if rtype == RecordType.ADD_BATCH:
            try:
                batch = batch_from_bytes(body)
            except errors.BadRequest as exc:
                log.error("event=replay_bad_batch error=%r", exc)
                return None, None
            if not batch.num_rows:
                return None, None
            ledger_id = batch.column(0)[0].as_py()
            self._apply_batch(ledger_id, batch, body, location)
            return ledger_id, batch.column(1)[batch.num_rows - 1].as_py()
        if rtype == RecordType.ADD_ENTRY:
            try:
                ledger_id, entry_id, lac, _length, _start = parse_entry_record(body)
            except errors.BadRequest as exc:
                log.error("event=replay_bad_entry error=%r", exc)
                return None, None
            self.store.add_entry(ledger_id, entry_id, body)
            self.states[ledger_id] = ls.apply_entries(self.ledgers.get(ledger_id), lac, entry_id)
            return ledger_id, entry_id
        if rtype == RecordType.PAD:             # alignment filler (journal/direct_write.py)
            return None, None
        (ledger_id,) = LEDGER.unpack_from(body)
        if rtype == RecordType.FENCE:
            self.states[ledger_id] = ls.apply_fence(self.ledgers.get(ledger_id))
        elif rtype == RecordType.MASTER_KEY:
            self.states[ledger_id] = ls.apply_key(self.ledgers.get(ledger_id), body[LEDGER.size:])
        elif rtype == RecordType.EXPLICIT_LAC:
            _, lac = LEDGER_LAC.unpack(body)
            self.states[ledger_id] = ls.apply_explicit_lac(self.ledgers.get(ledger_id), lac)
        elif rtype == RecordType.LEDGER_DELETED:
            self._apply_delete(ledger_id)
        return ledger_id, None

    # -- damage (damage.py) ------------------------------------------------------------------
    def report_lost(self, ranges: list[tuple[int, int, int]], unattributed: bool = False) -> None:
        """Entries this bookie may have lost (journal replay, scrubber): reads
        of them answer BookieIOError until the auditor has copied them back."""
        self.lost.report(ranges, unattributed)
        self.metrics.damaged_ranges.set(len(self.lost.ranges()))

    def quarantine_batch(self, ref_id: int, ledger_id: int,
                         good: Optional[pa.RecordBatch] = None) -> list[tuple[int, int, int]]:
        """The scrubber found a stored batch damaged: out of the index, its
        intact rows (``good``) re-stored, the rest reported lost.  Under the
        checkpoint lock: no checkpoint persists the index without the batch
        and without the lost ranges."""
        with self._ckpt_lock, self.cond:
            lost = damage.quarantine(self.store, ref_id, ledger_id, good)
            if lost:
                self.report_lost(lost)
            return lost

    # -- read-only mode (bookie_mode.py) ------------------------------------------------------
    @property
    def read_only(self) -> bool:
        return self.mode.read_only

    @property
    def admin_read_only(self) -> bool:
        return self.mode.admin_read_only

    @property
    def io_error(self) -> Optional[str]:
        """Why storage failed (the bookie is then pinned read-only), or None."""
        return self.mode.io_error

    def set_read_only(self, value: bool) -> bool:
        """Returns True if the mode changed (``BookieMode.set_read_only``)."""
        return self.mode.set_read_only(value)

    def set_admin_read_only(self, value: bool, disk_full: bool = False) -> bool:
        """The operator's switch (``BookieMode.set_admin_read_only``)."""
        return self.mode.set_admin_read_only(value, disk_full)

    def add_mode_listener(self, listener: Callable[[bool], None]) -> None:
        """``listener(read_only)`` after every mode change (the registrar)."""
        self.mode.add_listener(listener)

    def _journal_failed(self, exc: BaseException) -> None:
        """Journal hook: a write or fdatasync failed (EIO, ENOSPC...); the
        journal has logged ``event=journal_failed`` with the errno and path."""
        self.mode.storage_failed(exc, "journal")

    @property
    def applied_position(self) -> Position:
        """The journal position up to which every record is applied."""
        return self._applied

    def ledger_ids(self) -> list[int]:
        with self.cond:
            return sorted(set(self.states) | set(self.store.ledger_ids()))

    def disk_usage(self) -> tuple[int, int]:
        du = shutil.disk_usage(self.data_dir)
        return du.free, du.total

    # -- GC ------------------------------------------------------------------------------------
    def delete_ledger(self, ledger_id: int) -> None:
        """Reclaim a ledger (GC only, after it has confirmed the metadata is gone)."""
        self.mode.check_storage()
        fut = self.journal.write([(RecordType.LEDGER_DELETED, LEDGER.pack(ledger_id))],
                                 DeleteRecord(ledger_id))
        fut.result()
        self.metrics.gc_ledgers.inc()
        log.info("event=gc_ledger_deleted ledger_id=%d", ledger_id)

    # -- checkpoint ------------------------------------------------------------------------------
    def _flush_loop(self) -> None:
        while not self._stop.is_set():
            self._flush_wanted.wait(self.cfg.flush_interval_s)
            self._flush_wanted.clear()
            if self._stop.is_set():
                return
            if self.io_error is not None:     # pinned read-only: the restart replays
                continue
            try:
                self.checkpoint()
            except errors.BookieIOError:    # logged with errno and path; now pinned read-only
                continue
            except Exception as exc:  # noqa: BLE001 - keep serving; journal still holds data
                log.error("event=checkpoint_failed error=%r", exc)

    def checkpoint(self) -> Position:
        """Raises BookieIOError once storage has failed: the checkpoint never
        advances past a failed write or fsync.  A failure here pins the
        bookie read-only (``BookieMode.storage_failed``): ``flush_begin`` has already
        handed the write cache's refs to this checkpoint, so a later one would
        persist a position past entries no segment holds durably."""
        with self._ckpt_lock:
            if self.io_error is not None:
                raise errors.BookieIOError(f"no checkpoint after a storage failure "
                                           f"({self.io_error}); restart the bookie")
            with self.cond:
                position = self._applied
                snap = self.store.flush_begin()
                frozen = list(self.states.values())     # immutable states: copy the list only
            states: list[dict[str, Any]] = []    # ~3.6 us each: not under the add lock,
            for part in flush_slices.in_slices(frozen):      # nor in one GIL stretch
                states += [s.to_json() for s in part]
            try:
                if snap.by_ledger:
                    self.store.write_snapshot(snap)
                self.store.flush_commit(snap)
                if self.cfg.compaction_min_live_ratio > 0:
                    compaction.compact(self.store, self.cfg.compaction_min_live_ratio,
                                       journal_below_seq=position.seq)
                self._write_checkpoint(position, states)
            except Exception as exc:  # noqa: BLE001 - pin read-only, then report
                code = getattr(exc, "errno", None)
                log.error("event=checkpoint_failed errno=%s path=%s error=%r "
                          "action=read_only_until_restart",
                          errno.errorcode.get(code, code) if code is not None else "-",
                          getattr(exc, "filename", None) or self.data_dir, exc)
                self.mode.storage_failed(exc, "checkpoint")
                raise errors.BookieIOError(f"checkpoint failed: {exc!r}") from exc
            # journal files before P go, unless indexed batches still live in them
            gone = self.journal.delete_before(position, keep=self.store.journal_seqs_in_use())
            self.store.forget_journal_files(gone)
            dead = self.store.dead_segments()
            if dead:
                self.store.delete_segments(dead)
            self.metrics.checkpoints.inc()
            return position

    def _write_checkpoint(self, position: Position, states: list[dict[str, Any]]) -> None:
        """Persist the index change since the last checkpoint (folded into a
        new whole index from the files when checkpoint_file.wants_base says
        so, with no lock of the store held) with P and the states; nothing
        at all when none of them changed."""
        lost = self.lost.to_json()
        delta = store_index.take_delta(self.store)
        if (delta.empty and self._index_files is not None
                and self._last_written == (position, states, lost)):
            return
        self._ckpt_gen += 1
        self._index_files = checkpoint_file.write(
            self.data_dir, self._ckpt_gen, position, self._index_files, delta,
            states, lost, self.store.fsync)
        self._last_written = (position, states, lost)

    def _load_checkpoint(self) -> Position:
        found = checkpoint_file.read(self.data_dir)
        if found is None:
            store_index.load_index(self.store, store_index.INDEX_SCHEMA.empty_table())
            return Position(0, 0)
        doc, table = found
        self._ckpt_gen = int(doc["generation"])
        self._index_files = checkpoint_file.IndexFiles.of(doc)    # the next one goes on from them
        store_index.load_index(self.store, table)
        for d in doc["states"]:
            s = ls.LedgerState.from_json(d)
            self.states[s.ledger_id] = s
        saved = damage.LostSet.from_json(doc.get("lost"))
        self.lost.add(saved.ranges(), saved.unattributed)   # the set the handlers hold
        if self.lost:
            log.warning("event=damage_outstanding ranges=%d unattributed=%s",
                        len(self.lost.ranges()), self.lost.unattributed)
        return Position(int(doc["journal_seq"]), int(doc["journal_offset"]))
