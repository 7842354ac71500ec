"""The bookie core: journal + entry store + per-ledger states.  No gRPC here.

Theory of operation
-------------------
Write path (``add_async``): validate the Arrow batch in the caller's thread
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
index + ledger states + P atomically (``checkpoint.json`` names its index
file), then delete the journal files before P that hold no indexed batch, and
dead segments.  Restart loads
the checkpoint and replays the journal from P; replay is idempotent
(duplicate entries are kept-first, fences/keys/LACs are monotone).

GC deletes a ledger by journaling LEDGER_DELETED and then dropping it, so a
replay from an older checkpoint cannot resurrect it.

Storage failure (``_storage_failed``; docs/bookie.md, "Storage failure"): a
journal write/fdatasync failure (the journal's ``on_failure``) or a failed
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
import json
import logging
import os
import shutil
import struct
import threading
import time
from concurrent.futures import Future
from typing import Callable, Optional

import numpy as np
import pyarrow as pa

from bookie_server.storage import compaction, damage, store_index
from bookie_server.journal import journal_replay
from bookie_server.serving.admission import AddAdmission
from bookie_server import ledger_state as ls
from bookie_server.config import BookieConfig, MiB
from bookie_server.storage.entry_store import EntryStore
from bookie_server.journal.journal import LEDGER, LEDGER_LAC, Journal, Position, RecordType
from bookie_server.serving.metrics import BookieMetrics
from pybk_spark import errors
from pybk_spark.transport.base import LacResult, ReadResult
from pybk_spark.wire.entries import batch_from_bytes

log = logging.getLogger("bookie.core")

CHECKPOINT = "checkpoint.json"


def validate_batch(data: bytes, ledger_id: int, cfg: BookieConfig) -> pa.RecordBatch:
    """Parse + check one add batch without a per-entry Python loop (numpy
    views of the Arrow buffers: a one-entry add pays microseconds, not the
    ~25 us of each Arrow compute call; a one-entry batch, the synchronous
    add, is checked with scalars)."""
    if len(data) > cfg.max_batch_bytes:
        raise errors.TooLarge(f"batch of {len(data)} bytes > max_batch_bytes {cfg.max_batch_bytes}")
    batch = batch_from_bytes(data)
    n = batch.num_rows
    if n == 0:
        raise errors.BadRequest("empty entry batch")
    cols = batch.columns
    if any(col.null_count for col in cols):
        raise errors.BadRequest("entry batch has null values")
    lids = cols[0].to_numpy()
    ids = cols[1].to_numpy()
    if n == 1:
        wrong_ledger, ordered = lids[0] != ledger_id, ids[0] >= 0
    else:
        wrong_ledger = lids.min() != ledger_id or lids.max() != ledger_id
        ordered = ids[0] >= 0 and bool((np.diff(ids) > 0).all())
    if wrong_ledger:
        raise errors.BadRequest(f"batch rows must all belong to ledger {ledger_id}")
    if not ordered:
        raise errors.BadRequest("entry ids must be >= 0 and strictly ascending")
    biggest = max_value_length(cols[3])
    if biggest > cfg.max_entry_bytes:
        raise errors.TooLarge(f"entry payload of {biggest} bytes > max_entry_bytes {cfg.max_entry_bytes}")
    return batch


_OFFSET_PAIR = struct.Struct("<ii")


def max_value_length(arr: pa.BinaryArray) -> int:
    """Longest value of a (non-empty) binary array, from its offsets buffer."""
    if len(arr) == 1:
        start, end = _OFFSET_PAIR.unpack_from(arr.buffers()[1], arr.offset * 4)
        return end - start
    offsets = np.frombuffer(arr.buffers()[1], dtype=np.int32,
                            count=len(arr) + 1, offset=arr.offset * 4)
    return int(np.diff(offsets).max())


class Bookie:
    def __init__(self, cfg: BookieConfig, *, metrics: Optional[BookieMetrics] = None,
                 clock: Callable[[], float] = time.monotonic,
                 fsync: Callable[[int], None] = os.fdatasync,
                 pwritev: Callable[[int, list, int], int] = os.pwritev,
                 store_fsync: Callable[[int], None] = os.fsync):
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
                                fsync=store_fsync)
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
                               clock=clock, metrics=self.metrics, fsync=fsync,
                               pwritev=pwritev, on_failure=self._journal_failed)
        self.states: dict[int, ls.LedgerState] = {}
        self.cond = threading.Condition(threading.RLock())
        self.read_only = False
        self.admin_read_only = False     # set by the operator (admin HTTP API): kept until cleared
        self.io_error: Optional[str] = None     # set once storage failed (pinned read-only)
        self._mode_listeners: list[Callable[[bool], None]] = []
        self._applied = Position(0, 0)
        self._ckpt_lock = threading.Lock()
        self._ckpt_gen = 0
        self._flush_wanted = threading.Event()
        self._stop = threading.Event()
        self._flusher: Optional[threading.Thread] = None
        self.replayed_records = 0
        self.admission = AddAdmission(cfg.max_adds_in_progress, cfg.max_add_memory_bytes,
                                      lambda: self.store.write_cache_bytes,
                                      on_refused=self.metrics.adds_refused.inc,
                                      on_full=self._flush_wanted.set)
        self.lost = damage.LostSet()

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

    # -- state helpers -------------------------------------------------------------------
    def _state(self, ledger_id: int) -> ls.LedgerState:
        return self.states.get(ledger_id) or ls.empty(ledger_id)

    def _known(self, ledger_id: int) -> bool:
        return ledger_id in self.states or self.store.has_ledger(ledger_id)

    def _key_records(self, plan: ls.Plan, ledger_id: int, key: bytes) -> list:
        recs = []
        if plan.record_key:
            recs.append((RecordType.MASTER_KEY, LEDGER.pack(ledger_id) + bytes(key)))
        if plan.record_fence:
            recs.append((RecordType.FENCE, LEDGER.pack(ledger_id)))
        return recs

    # -- durable application (journal thread and replay) ---------------------------------
    def _on_durable(self, group, position: Position) -> None:
        with self.cond:
            for sub in group:
                if sub.payload is not None:
                    kind, ledger_id, batch = sub.payload[:3]
                    if kind == "add":    # ADD_BATCH is the submission's last record
                        self._apply_batch(ledger_id, batch, sub.payload[3],
                                          sub.locations[-1] if sub.locations else None)
                    elif kind == "delete":
                        self._apply_delete(ledger_id)
                    elif kind == "lac":
                        self.states[ledger_id] = ls.apply_explicit_lac(self._state(ledger_id), batch)
            self._applied = position
            self.cond.notify_all()
        if self.store.write_cache_bytes > self.cfg.write_cache_max_bytes:
            self._flush_wanted.set()

    def _apply_batch(self, ledger_id: int, batch: pa.RecordBatch, raw: bytes | None,
                     location: tuple[int, int] | None = None) -> None:
        self.store.add(ledger_id, batch, raw, location)
        max_lac = int(batch.column(2).to_numpy().max())
        max_id = int(batch.column(1).to_numpy()[-1])
        self.states[ledger_id] = ls.apply_entries(self._state(ledger_id), max_lac, max_id)

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
        (ledger_id,) = LEDGER.unpack_from(body)
        if rtype == RecordType.FENCE:
            self.states[ledger_id] = ls.apply_fence(self._state(ledger_id))
        elif rtype == RecordType.MASTER_KEY:
            self.states[ledger_id] = ls.apply_key(self._state(ledger_id), body[LEDGER.size:])
        elif rtype == RecordType.EXPLICIT_LAC:
            _, lac = LEDGER_LAC.unpack(body)
            self.states[ledger_id] = ls.apply_explicit_lac(self._state(ledger_id), lac)
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

    def _check_lost(self, ledger_id: int, entry_id: int) -> None:
        """Unattributed damage: any ledger's tail may be lost (a ledger none of
        whose records since the checkpoint survived is named by no range)."""
        if self.lost and (self.lost.covers(ledger_id, entry_id) or (
                self.lost.unattributed and entry_id > self.store.max_entry(ledger_id))):
            raise errors.BookieIOError(
                f"entry {ledger_id}:{entry_id} was lost to damage on this bookie and is "
                "not yet re-replicated (event=entries_missing)")

    # -- operations ------------------------------------------------------------------------
    def add_async(self, ledger_id: int, master_key: bytes, data: bytes,
                  recovery: bool = False, keyless: bool = False) -> tuple[Future, int, int]:
        """Returns (future completing when durable+visible, first id, last id).
        ``keyless``: an operator's recovery add without the master key
        (protocol/access.py)."""
        batch = validate_batch(data, ledger_id, self.cfg)
        first, last = batch.column(1)[0].as_py(), batch.column(1)[batch.num_rows - 1].as_py()
        self._check_storage()
        release = self.admission.admit(len(data))      # TooManyRequests past its bounds
        try:
            fut = self._submit_add(ledger_id, master_key, data, batch, recovery, keyless)
        except BaseException:
            release()
            raise
        fut.add_done_callback(lambda _f: release())
        self.journal.lead()      # an idle journal: write + sync on this thread
        return fut, first, last

    def _submit_add(self, ledger_id: int, master_key: bytes, data: bytes,
                    batch: pa.RecordBatch, recovery: bool, keyless: bool = False) -> Future:
        with self.cond:
            plan = ls.decide_add(self._state(ledger_id), master_key, recovery=recovery,
                                 read_only=self.read_only, keyless=keyless)
            records = self._key_records(plan, ledger_id, master_key)
            records.append((RecordType.ADD_BATCH, data))
            self.states[ledger_id] = plan.state
            return self.journal.submit(records, ("add", ledger_id, batch, data), lead=True)

    def add(self, ledger_id: int, master_key: bytes, data: bytes, recovery: bool = False,
            timeout: Optional[float] = None) -> tuple[int, int]:
        fut, first, last = self.add_async(ledger_id, master_key, data, recovery)
        fut.result(timeout)
        return first, last

    def fence(self, ledger_id: int, master_key: bytes, keyless: bool = False) -> LacResult:
        self._check_storage()
        with self.cond:
            plan = ls.decide_fence(self._state(ledger_id), master_key, keyless)
            records = self._key_records(plan, ledger_id, master_key)
            self.states[ledger_id] = plan.state
            fut = self.journal.submit(records, lead=True) if records else None
        if fut is not None:
            self.journal.lead()
            fut.result()
        else:
            self._wait_applied()
        return self.lac_of(ledger_id)

    def _wait_applied(self) -> None:
        """An already-fenced ledger: wait until the fence we saw is durable."""
        self.journal.write([]).result()

    def write_lac(self, ledger_id: int, master_key: bytes, lac: int) -> None:
        self._check_storage()
        with self.cond:
            if self.read_only:
                raise errors.ReadOnly("bookie is read-only")
            plan = ls.decide_write_lac(self._state(ledger_id), master_key, lac)
            records = self._key_records(plan, ledger_id, master_key)
            records.append((RecordType.EXPLICIT_LAC, LEDGER_LAC.pack(ledger_id, lac)))
            self.states[ledger_id] = ls.apply_key(self._state(ledger_id), master_key)
            fut = self.journal.submit(records, ("lac", ledger_id, lac), lead=True)
        self.journal.lead()
        fut.result()

    def master_key_of(self, ledger_id: int) -> bytes:
        """The key this bookie recorded for the ledger (b"" if none)."""
        with self.cond:
            return self._state(ledger_id).master_key or b""

    def lac_of(self, ledger_id: int) -> LacResult:
        with self.cond:
            s = self._state(ledger_id)
            return LacResult(s.lac, max(s.last_entry_id, self.store.max_entry(ledger_id)), s.fenced)

    def read_lac(self, ledger_id: int, *, fence: bool = False, master_key: bytes = b"",
                 wait_for_lac_above: int = -2, timeout_s: float = 0.0,
                 keyless: bool = False) -> LacResult:
        if fence:
            return self.fence(ledger_id, master_key, keyless)
        if wait_for_lac_above >= -1 and timeout_s > 0:
            timeout_s = min(timeout_s, self.cfg.long_poll_max_timeout_ms / 1000.0)
            with self.cond:
                self.cond.wait_for(lambda: self._state(ledger_id).lac > wait_for_lac_above
                                   or self._stop.is_set(), timeout_s)
        with self.cond:
            if not self._known(ledger_id):
                self._unknown_ledger(ledger_id)
        return self.lac_of(ledger_id)

    def _unknown_ledger(self, ledger_id: int) -> None:
        if self.lost.unattributed or self.lost.has_ledger(ledger_id):
            raise errors.BookieIOError(
                f"ledger {ledger_id} not found, but this bookie lost journal records to damage "
                "(event=journal_damage) and is not yet re-replicated")
        raise errors.NoSuchLedger(ledger_id=ledger_id)

    def read(self, ledger_id: int, first: int, last: int, *, max_entries: int = 0,
             max_bytes: int = 0, fence: bool = False, master_key: bytes = b"",
             sparse: bool = False, stripe: Optional[tuple[int, int]] = None,
             keyless: bool = False) -> ReadResult:
        if fence:
            self.fence(ledger_id, master_key, keyless)
        if first < 0 or last < first:
            raise errors.BadRequest(f"bad entry range [{first}, {last}]")
        max_entries = min(max_entries or self.cfg.max_read_entries, self.cfg.max_read_entries)
        max_bytes = min(max_bytes or self.cfg.max_read_bytes, self.cfg.max_read_bytes)
        with self.cond:
            if not self._known(ledger_id):
                if sparse:      # copies / replicas checks: never a recovery decision
                    raise errors.NoSuchLedger(ledger_id=ledger_id)
                self._unknown_ledger(ledger_id)
        if stripe is not None and not (sparse and 0 <= stripe[1] < stripe[0]):
            raise errors.BadRequest(f"stripe {stripe} needs a sparse read and 0 <= slot < ensemble")
        batch, limited = self.store.read(ledger_id, first, last, max_entries, max_bytes,
                                         sparse=sparse, stripe=stripe)
        lac = self.lac_of(ledger_id)
        if sparse:   # every stored id in range; an empty answer is not an error
            return ReadResult(batch, "LIMIT" if limited else "COMPLETE", lac.lac, lac.fenced)
        if batch.num_rows == 0:
            self._check_lost(ledger_id, first)
            raise errors.NoSuchEntry(ledger_id=ledger_id, entry_id=first)
        got_last = first + batch.num_rows - 1
        end = "COMPLETE" if got_last >= last else ("LIMIT" if limited else "MISSING")
        return ReadResult(batch, end, lac.lac, lac.fenced)

    def set_read_only(self, value: bool) -> bool:
        """Returns True if the mode changed.  After a journal failure the
        bookie stays read-only until it is restarted (and its journal
        replayed): nothing may be acknowledged that was not made durable."""
        with self.cond:
            if not value and (self.io_error is not None or self.admin_read_only):
                value = True
            changed = self.read_only != value
            self.read_only = value
        if changed:
            self.metrics.read_only.set(1 if value else 0)
            log.warning("event=bookie_mode read_only=%s storage_failed=%s", value,
                        self.io_error is not None)
            for listener in list(self._mode_listeners):
                try:
                    listener(value)
                except Exception:  # noqa: BLE001 - e.g. etcd down: the registrar retries
                    log.exception("event=mode_listener_error")
        return changed

    def set_admin_read_only(self, value: bool, disk_full: bool = False) -> bool:
        """The operator's read-only switch (``PUT /api/v1/bookie/state/readonly``):
        while set, nothing (not the disk checker) makes the bookie writable.
        Clearing it leaves the bookie read-only if ``disk_full`` or storage failed."""
        with self.cond:
            self.admin_read_only = value
        self.set_read_only(value or disk_full)
        return self.read_only

    def add_mode_listener(self, listener: Callable[[bool], None]) -> None:
        """``listener(read_only)`` after every mode change (the registrar)."""
        self._mode_listeners.append(listener)

    def _check_storage(self) -> None:
        """Refuse what needs the journal once storage has failed."""
        if self.io_error is not None:
            raise errors.ReadOnly(f"bookie is read-only until restarted: storage failed "
                                  f"({self.io_error})")

    def _journal_failed(self, exc: BaseException) -> None:
        """Journal hook: a write or fdatasync failed (EIO, ENOSPC...); the
        journal has logged ``event=journal_failed`` with the errno and path."""
        self._storage_failed(exc, "journal")

    def _storage_failed(self, exc: BaseException, where: str) -> None:
        """Pin the bookie read-only until restart (see the module docstring).
        ``io_error`` is set at once, so the very next operation is refused;
        the switch itself runs on its own thread: a journal thread must not
        wait for the bookie lock, nor for the registrar's etcd round trip."""
        if self.io_error is None:
            self.io_error = f"{where}: {exc!r}"
        threading.Thread(target=self.set_read_only, args=(True,), name="storage-failed",
                         daemon=True).start()

    def ledger_ids(self) -> list[int]:
        with self.cond:
            return sorted(set(self.states) | set(self.store.ledger_ids()))

    def disk_usage(self) -> tuple[int, int]:
        du = shutil.disk_usage(self.data_dir)
        return du.free, du.total

    # -- GC ------------------------------------------------------------------------------------
    def delete_ledger(self, ledger_id: int) -> None:
        """Reclaim a ledger (GC only, after it has confirmed the metadata is gone)."""
        self._check_storage()
        fut = self.journal.write([(RecordType.LEDGER_DELETED, LEDGER.pack(ledger_id))],
                                 ("delete", ledger_id, None))
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
        bookie read-only (``_storage_failed``): ``flush_begin`` has already
        handed the write cache's refs to this checkpoint, so a later one would
        persist a position past entries no segment holds durably."""
        with self._ckpt_lock:
            if self.io_error is not None:
                raise errors.BookieIOError(f"no checkpoint after a storage failure "
                                           f"({self.io_error}); restart the bookie")
            with self.cond:
                position = self._applied
                snap = self.store.flush_begin()
                states = [s.to_json() for s in self.states.values()]
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
                self._storage_failed(exc, "checkpoint")
                raise errors.BookieIOError(f"checkpoint failed: {exc!r}") from exc
            # journal files before P go, unless indexed batches still live in them
            gone = self.journal.delete_before(position, keep=self.store.journal_seqs_in_use())
            self.store.forget_journal_files(gone)
            dead = self.store.dead_segments()
            if dead:
                self.store.delete_segments(dead)
            self.metrics.checkpoints.inc()
            return position

    def _write_checkpoint(self, position: Position, states: list[dict]) -> None:
        self._ckpt_gen += 1
        index_name = f"index-{self._ckpt_gen:010d}.arrow"
        index_path = os.path.join(self.data_dir, index_name)
        table = store_index.index_table(self.store)
        with pa.OSFile(index_path, "wb") as sink:
            with pa.ipc.new_file(sink, table.schema) as w:
                w.write_table(table)
        self._fsync_path(index_path)
        doc = {"version": 1, "generation": self._ckpt_gen, "journal_seq": position.seq,
               "journal_offset": position.offset, "index": index_name, "states": states,
               "lost": self.lost.to_json()}
        tmp = os.path.join(self.data_dir, CHECKPOINT + ".tmp")
        with open(tmp, "w", encoding="utf-8") as fh:
            json.dump(doc, fh)
            fh.flush()
            self.store.fsync(fh.fileno())
        os.replace(tmp, os.path.join(self.data_dir, CHECKPOINT))
        self._fsync_path(self.data_dir)
        for name in os.listdir(self.data_dir):
            if name.startswith("index-") and name != index_name:
                os.unlink(os.path.join(self.data_dir, name))

    def _load_checkpoint(self) -> Position:
        path = os.path.join(self.data_dir, CHECKPOINT)
        if not os.path.exists(path):
            store_index.load_index(self.store, store_index.INDEX_SCHEMA.empty_table())
            return Position(0, 0)
        with open(path, encoding="utf-8") as fh:
            doc = json.load(fh)
        self._ckpt_gen = int(doc["generation"])
        with pa.OSFile(os.path.join(self.data_dir, doc["index"]), "rb") as src:
            table = pa.ipc.open_file(src).read_all()
        store_index.load_index(self.store, table)
        for d in doc["states"]:
            s = ls.LedgerState.from_json(d)
            self.states[s.ledger_id] = s
        self.lost = damage.LostSet.from_json(doc.get("lost"))
        if self.lost:
            log.warning("event=damage_outstanding ranges=%d unattributed=%s",
                        len(self.lost.ranges()), self.lost.unattributed)
        return Position(int(doc["journal_seq"]), int(doc["journal_offset"]))

    def _fsync_path(self, path: str) -> None:
        fd = os.open(path, os.O_RDONLY)
        try:
            self.store.fsync(fd)
        finally:
            os.close(fd)
