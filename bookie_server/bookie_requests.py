"""The bookie's request handlers: add, fence, explicit LAC, LAC reads (with
long poll) and entry reads.

``RequestHandlers`` is owned by ``bookie.Bookie`` (the lifecycle: start-up,
replay, durable application, GC and checkpoints) and gets from it, typed,
what it works on: the config, the per-ledger states under the state lock
(``ledger_table.LedgerTable``), the entry store, the journal, add admission,
the lost-entry set (``storage.damage``), the read-only mode
(``bookie_mode.BookieMode``) and the bookie's stop event.  Every decision
about a ledger's state is ``ledger_state``'s (pure); a handler journals what
the decision says and waits for it to be durable.
"""
from __future__ import annotations

import threading
from concurrent.futures import Future
from typing import Callable, Optional

import pyarrow as pa

from pybk_spark.protocol import ledger_state as ls
from pybk_spark.wire.add_validation import validate_batch, validate_entry
from bookie_server.bookie_mode import BookieMode
from bookie_server.config import BookieConfig
from bookie_server.journal.direct_write import RecordSpace
from bookie_server.journal.journal import Journal, Lead
from bookie_server.journal.journal_crc import Body
from bookie_server.journal.journal_format import LEDGER, LEDGER_LAC, Position, RecordType
from bookie_server.journal.records import AddRecord, EntryRecord, LacRecord
from bookie_server.ledger_table import LedgerTable
from bookie_server.serving.admission import AddAdmission
from bookie_server.storage.damage import LostSet
from bookie_server.storage.entry_store import EntryStore
from pybk_spark import errors
from pybk_spark.wire.entries import Record
from pybk_spark.wire.results import LacResult, ReadResult


class RequestHandlers:
    def __init__(self, cfg: BookieConfig, ledgers: LedgerTable, store: EntryStore,
                 journal: Journal, admission: AddAdmission, lost: LostSet, mode: BookieMode,
                 stop: threading.Event) -> None:
        self.cfg = cfg
        self.ledgers = ledgers
        self.cond = ledgers.cond
        self.lock = ledgers.lock         # cond's lock, for the add path (ledger_table.py)
        self.states = ledgers.states
        self.store = store
        self.journal = journal
        self.admission = admission
        self.lost = lost
        self.mode = mode
        self._stop = stop

    def _key_records(self, plan: ls.Plan, ledger_id: int, key: bytes) -> list[tuple[int, Body]]:
        recs: list[tuple[int, Body]] = []
        if plan.record_key:
            recs.append((RecordType.MASTER_KEY, LEDGER.pack(ledger_id) + bytes(key)))
        if plan.record_fence:
            recs.append((RecordType.FENCE, LEDGER.pack(ledger_id)))
        return recs

    def add_async(self, ledger_id: int, master_key: bytes, data: bytes,
                  recovery: bool = False, keyless: bool = False,
                  body_crc: Optional[int] = None,
                  space: Optional[RecordSpace] = None,
                  lead: Lead = Lead.NOW) -> tuple[Future[Position], int, int]:
        """Returns (future completing when durable+visible, first id, last id).
        ``keyless``: an operator's recovery add without the master key
        (protocol/access.py).  ``body_crc``: the crc32c of ``data``, where
        the caller took it already (a pull's digest check): the journal
        frames the record from it.  ``space``: the journal record space
        ``data`` was received into (a pull's answer), framed in place.
        ``lead``: who writes the add (``journal.Lead``).  ``Lead.NOW``:
        this thread, before it returns (write + sync inline when the
        journal is idle).  ``Lead.LATER``: the add only queues, and the
        caller's later ``Journal.lead()`` leads it with what queued behind
        it (an AddStream's handler thread leads what its reader thread
        queued).  ``Lead.WRITER``: the
        journal's writer thread, woken as the add queues, writes it while
        the caller reads on."""
        batch = validate_batch(data, ledger_id, self.cfg)
        first, last = batch.column(1)[0].as_py(), batch.column(1)[batch.num_rows - 1].as_py()
        self.mode.check_storage()
        release = self.admission.admit(len(data))      # TooManyRequests past its bounds
        try:
            fut = self._submit_add(ledger_id, master_key, data, batch, recovery, keyless,
                                   body_crc, space, lead)
        except BaseException:
            release()
            raise
        fut.add_done_callback(lambda _f: release())
        if lead is Lead.NOW:
            self.journal.lead()      # an idle journal: write + sync on this thread
        return fut, first, last

    def add_entry(self, record: Record, master_key: bytes, recovery: bool = False,
                  keyless: bool = False,
                  on_applied: Optional[Callable[[int, int], None]] = None,
                  lead: Lead = Lead.NOW) -> tuple[Optional[Future[Position]], int, int]:
        """A lone add as its entry record (wire/entries.py), journaled and
        cached as received: the same checks, admission and decision as
        ``add_async``.  Returns (None, ledger id, entry id) when the add is
        durable and applied already: an idle journal let this thread lead it
        (``Journal.claim`` / ``lead_now``: no future, no callback), and
        ``on_applied(ledger id, entry id)`` ran on this thread as soon as it
        was applied (before the journal's bookkeeping); otherwise (future,
        ledger id, entry id), the add queued behind the journal's work, and
        ``on_applied`` is not called.  ``BookieIOError`` when the inline
        write or sync fails.  ``lead``: as ``add_async``'s; only
        ``Lead.NOW`` may make the add durable inline.  ``Lead.LATER``: more
        adds of the caller are already here; the add only queues (the
        journal is not woken), and the caller's next add, or its
        ``Journal.lead()``, leads them all as one group."""
        ledger_id, entry_id, lac = validate_entry(record, self.cfg)
        mode = self.mode
        if mode.io_error is not None:
            mode.check_storage()
        nbytes = len(record)
        admission = self.admission
        admission.enter(nbytes)
        try:
            with self.lock:
                plan = ls.admit_add(self.ledgers.get(ledger_id), master_key, recovery,
                                    mode.read_only, keyless)
                records: list[tuple[int, Body]]
                if plan is None:        # every add of a ledger after its first
                    records = [(RecordType.ADD_ENTRY, record)]
                else:
                    records = self._key_records(plan, ledger_id, master_key)
                    records.append((RecordType.ADD_ENTRY, record))
                    self.states[ledger_id] = plan.state
                sub = EntryRecord(records, ledger_id, entry_id, lac, record, on_applied)
                led = lead is Lead.NOW and self.journal.claim(sub)
                if not led:
                    fut = self.journal.enqueue(sub, lead=lead)
            if led:             # the inline path: its lines are the add's latency
                self.journal.lead_now(sub)
                admission.leave(nbytes)
                return None, ledger_id, entry_id
        except BaseException:
            admission.leave(nbytes)
            raise
        fut.add_done_callback(lambda _f: admission.leave(nbytes))
        if lead is Lead.NOW:
            self.journal.lead()
        return fut, ledger_id, entry_id

    def add_entry_async(self, record: Record, master_key: bytes, recovery: bool = False,
                        keyless: bool = False) -> tuple[Future[Position], int, int]:
        """``add_entry`` with a future either way: (future completing when
        durable+visible, ledger id, entry id)."""
        fut, ledger_id, entry_id = self.add_entry(record, master_key, recovery, keyless)
        if fut is None:
            fut = Future()
            fut.set_result(self.journal.durable_position)
        return fut, ledger_id, entry_id

    def _submit_add(self, ledger_id: int, master_key: bytes, data: bytes,
                    batch: pa.RecordBatch, recovery: bool, keyless: bool = False,
                    body_crc: Optional[int] = None,
                    space: Optional[RecordSpace] = None,
                    lead: Lead = Lead.NOW) -> Future[Position]:
        """Decide and queue the add (``add_async``); with ``Lead.NOW`` or
        ``Lead.LATER`` the caller leads it (``Journal.lead()``)."""
        # framed before the lock: a big batch's CRC and copy are this thread's
        staged = self.journal.stage_ahead(RecordType.ADD_BATCH, data, body_crc, space)
        with self.cond:
            plan = ls.decide_add(self.ledgers.get(ledger_id), master_key, recovery=recovery,
                                 read_only=self.mode.read_only, keyless=keyless)
            records = self._key_records(plan, ledger_id, master_key)
            records.append((RecordType.ADD_BATCH, data))
            self.states[ledger_id] = plan.state
            # a recovery add copies entries written long before (a pull, a
            # client's re-replication or ledger recovery): read back from the
            # journal, not held in memory until the checkpoint
            return self.journal.submit(records, AddRecord(ledger_id, batch, data, recovery),
                                       lead=lead, staged=staged)

    def add(self, ledger_id: int, master_key: bytes, data: bytes, recovery: bool = False,
            timeout: Optional[float] = None) -> tuple[int, int]:
        fut, first, last = self.add_async(ledger_id, master_key, data, recovery)
        fut.result(timeout)
        return first, last

    def fence(self, ledger_id: int, master_key: bytes, keyless: bool = False) -> LacResult:
        self.mode.check_storage()
        with self.cond:
            plan = ls.decide_fence(self.ledgers.get(ledger_id), master_key, keyless)
            records = self._key_records(plan, ledger_id, master_key)
            self.states[ledger_id] = plan.state
            fut = self.journal.submit(records, lead=Lead.NOW) if records else None
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
        self.mode.check_storage()
        with self.cond:
            if self.mode.read_only:
                raise errors.ReadOnly("bookie is read-only")
            plan = ls.decide_write_lac(self.ledgers.get(ledger_id), master_key, lac)
            records = self._key_records(plan, ledger_id, master_key)
            records.append((RecordType.EXPLICIT_LAC, LEDGER_LAC.pack(ledger_id, lac)))
            self.states[ledger_id] = ls.apply_key(self.ledgers.get(ledger_id), master_key)
            fut = self.journal.submit(records, LacRecord(ledger_id, lac), lead=Lead.NOW)
        self.journal.lead()
        fut.result()

    def master_key_of(self, ledger_id: int) -> bytes:
        """The key this bookie recorded for the ledger (b"" if none)."""
        with self.cond:
            return self.ledgers.get(ledger_id).master_key or b""

    def lac_of(self, ledger_id: int) -> LacResult:
        with self.cond:
            s = self.ledgers.get(ledger_id)
            return LacResult(s.lac, max(s.last_entry_id, self.store.max_entry(ledger_id)), s.fenced)

    def read_lac(self, ledger_id: int, *, fence: bool = False, master_key: bytes = b"",
                 wait_for_lac_above: int = -2, timeout_s: float = 0.0,
                 keyless: bool = False) -> LacResult:
        if fence:
            return self.fence(ledger_id, master_key, keyless)
        if wait_for_lac_above >= -1 and timeout_s > 0:
            timeout_s = min(timeout_s, self.cfg.long_poll_max_timeout_ms / 1000.0)
            with self.cond:
                self.ledgers.waiters += 1
                try:
                    self.cond.wait_for(lambda: self.ledgers.get(ledger_id).lac > wait_for_lac_above
                                       or self._stop.is_set(), timeout_s)
                finally:
                    self.ledgers.waiters -= 1
        with self.cond:
            if not self.ledgers.known(ledger_id):
                self._unknown_ledger(ledger_id)
        return self.lac_of(ledger_id)

    def _unknown_ledger(self, ledger_id: int) -> None:
        if self.lost.unattributed or self.lost.has_ledger(ledger_id):
            raise errors.BookieIOError(
                f"ledger {ledger_id} not found, but this bookie lost journal records to damage "
                "(event=journal_damage) and is not yet re-replicated")
        raise errors.NoSuchLedger(ledger_id=ledger_id)

    def _check_lost(self, ledger_id: int, entry_id: int) -> None:
        """Unattributed damage: any ledger's tail may be lost (a ledger none of
        whose records since the checkpoint survived is named by no range)."""
        if self.lost and (self.lost.covers(ledger_id, entry_id) or (
                self.lost.unattributed and entry_id > self.store.max_entry(ledger_id))):
            raise errors.BookieIOError(
                f"entry {ledger_id}:{entry_id} was lost to damage on this bookie and is "
                "not yet re-replicated (event=entries_missing)")

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
            if not self.ledgers.known(ledger_id):
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
