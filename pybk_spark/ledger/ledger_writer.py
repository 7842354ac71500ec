"""The I/O shell around ``protocol.pending_adds.PendingAdds``.

Theory of operation
-------------------
All protocol decisions are taken by the pure core under ``self._lock``; this
module only turns them into bookie requests, metadata CAS and completed
futures (never completing a future while holding the lock).

* ``submit(batch)``: a contiguous run of entries (ENTRY_SCHEMA, ids assigned
  by the caller via ``assign``) is split per bookie and sent as one Add per
  bookie (``wire.entry_parts.add_payload``: a large part as the buffers of its
  IPC stream, its payloads sent from where they lie in ``batch``).
  ``Waiter``s are completed in id order when the core's LAC passes their
  last id.
* ``submit_entry``: a lone add (one id, sent as its entry record); each
  bookie's answer arrives in ``_lone_answered`` on the transport's reader,
  which acks it with ``core.ack_one``.
* A failed add (not fenced) becomes ``core.on_failure``; a decided change runs
  on the client's executor (``_run_change``): pick replacements and CAS
  ``replace_bookies`` (``ensemble_change.replace_by_cas``: re-reads and
  re-decides on conflict; a non-OPEN ledger raises LedgerFenced), then
  ``core.commit_change`` and the resends it decides (``Resend`` ranges per
  replaced slot: the parts of the held chunks inside each range go to that
  slot's new bookie, nothing else: ``ensemble_change.resend_parts``).
  Nothing is released before the CAS succeeded (#1591).
* What a bookie's add error means is ``protocol.add_admission.
  classify_add_failure``: a bookie failure starts an ensemble change; an
  overload (``TooManyRequests``) re-sends the same request to the same
  bookie after a jittered exponential backoff (``ctx.call_later``, rng
  ``ctx.rng``), counted in ``_sends`` while it waits, until
  ``add_overload_retry_s`` after the first refusal (then: a bookie failure);
  a ``TooLarge`` (a bookie with a smaller limit than it advertised) aborts
  with ``TooLarge`` and replaces nobody.
* LedgerFenced / Unauthorized from a bookie, or a failed change, aborts: every
  pending add fails with an unknown-outcome error (no replacement bookie:
  ``NotEnoughBookies``, marked unknown-outcome).  Such adds may still land
  on bookies later (a paused bookie resumes), so a writer that aborted with
  unreleased ids (``unknown_tail``) is closed by fencing recovery, never at
  its LAC.
The writer serves both the application writer (``recovery=False``, ensemble
changes need OPEN) and recovery adds (``recovery=True``, need IN_RECOVERY).
"""
from __future__ import annotations

import functools
import threading
from collections.abc import Collection
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any, Callable, Union

import numpy as np
import pyarrow as pa

from pybk_spark import errors
from pybk_spark.ledger.context import ClientContext
from pybk_spark.ledger.ensemble_change import (HeldChunk, change_failure, replace_by_cas,
                                               resend_parts)
from pybk_spark.ledger.sync_result import Completion
from pybk_spark.protocol import add_admission as admission
from pybk_spark.protocol.distribution import holds
from pybk_spark.protocol import ledger_metadata as lm
from pybk_spark.protocol.pending_adds import EnsembleChange, PendingAdds, Resend
from pybk_spark.transport.base import LoneEntry
from pybk_spark.wire.entries import Payload
from pybk_spark.wire.entry_parts import add_payload


Ids = Union[np.ndarray, range]     # the ids of one request: a lone add's is a range


@dataclass
class Waiter:
    last: int
    future: Completion
    result: Callable[[], Any]


class LedgerWriter:
    def __init__(self, ctx: ClientContext, md: lm.LedgerMetadata, master_key: bytes, *,
                 recovery: bool, last_released: int = -1,
                 on_metadata: Callable[[lm.LedgerMetadata], None] | None = None,
                 limits: admission.AddLimits | None = None) -> None:
        self.ctx = ctx
        self.md = md
        self.ledger_id = md.ledger_id
        self.master_key = master_key
        self.recovery = recovery
        self.core = PendingAdds(md.write_quorum, md.ack_quorum, md.current_ensemble, last_released)
        self._lock = threading.Lock()
        self._waiters: list[Waiter] = []
        self._chunks: list[HeldChunk] = []
        self._error: errors.BKError | None = None
        self._failed_bookies: set[str] = set()
        self._last_bookie_error: BaseException | None = None
        # requests to bookies a caller waited for (``max_inflight_adds``
        # bounds them; resends and retries do not wait): a count under
        # ``_lock``, not a semaphore, so a lone add pays no lock of its own
        self._max_inflight = max(1, ctx.conf.max_inflight_adds)
        self._inflight = 0
        self._inflight_waiters = 0
        self._inflight_free = threading.Condition(self._lock)
        self._sends = 0                         # requests to bookies not yet answered
        self._sends_done = threading.Condition(self._lock)
        self._sends_waiters = 0                 # ``wait_all_sent`` callers: notified at 0
        self._on_metadata = on_metadata
        self.length = 0                 # payload bytes of the released entries
        self._assigned_length = 0       # ... of every assigned entry (ids are assigned in order)
        self.last_activity = ctx.clock()
        # add size limits of the current ensemble (read by LedgerHandle before it assigns ids)
        self.limits = limits or admission.limits(ctx.conf.max_entry_size_bytes,
                                                 ctx.conf.max_message_bytes, ())

    # -- public -----------------------------------------------------------------------
    @property
    def lac(self) -> int:
        return self.core.lac

    @property
    def error(self) -> errors.BKError | None:
        return self._error

    def assign(self, count: int, nbytes: int = 0) -> tuple[int, int, int]:
        """Reserve ``count`` ids for ``nbytes`` of payload; returns (first id,
        LAC to carry, ledger length before the first id: each entry carries
        this plus the payload bytes up to and including its own).  Caller
        holds no lock."""
        with self._lock:
            if self._error is not None:
                raise self._error
            first = self.core.assign_run(count)
            base = self._assigned_length
            self._assigned_length += nbytes
            return first, self.core.lac, base

    def _pend(self, chunk: HeldChunk, waiter: Waiter, lone: bool = False
              ) -> tuple[tuple[str, ...], Collection[int]] | None:
        """Record ``chunk`` as in flight: the ensemble and unavailable slots to
        send it to, or None (the waiter failed) once the writer has failed.
        ``lone``: a lone add, whose sends are counted here, under the same
        lock; the second item is then the slots of its write set it goes to."""
        with self._lock:
            if self._error is None:
                self._chunks.append(chunk)
                self._waiters.append(waiter)
                self.last_activity = self.ctx.clock()
                core = self.core
                if not lone:
                    return core.ensemble, core.unavailable_slots
                slots = core.target_slots(chunk.first)
                count = len(slots)
                if self._inflight and self._inflight + count > self._max_inflight:
                    self._wait_inflight(count)
                else:                           # ``_wait_inflight`` with nothing to wait for
                    self._inflight += count
                self._sends += count
                return core.ensemble, slots
            err = self._error
        waiter.future.set_exception(err)
        return None

    def submit(self, batch: pa.RecordBatch, waiter: Waiter, nbytes: int | None = None) -> None:
        """Send the entries of ``batch`` (ids already assigned, contiguous);
        ``nbytes``: total payload bytes, if the caller knows it."""
        first = int(batch.column("entry_id")[0].as_py())
        last = first + batch.num_rows - 1
        if nbytes is None:
            nbytes = batch.column("payload").total_values_length
        pending = self._pend(HeldChunk(first, last, batch, nbytes), waiter)
        if pending is not None:
            ensemble, bad = pending
            self._send(batch, ensemble, bad, wait=True)

    def submit_entry(self, entry_id: int, head: bytes, payload: bytes, waiter: Waiter) -> None:
        """Send a lone add (its id assigned) as its entry record: ``head``
        (wire/entries.py, ``entry_record_head``) then ``payload``.  Each
        bookie's answer comes back through ``_lone_answered``, called by
        the transport (no future per bookie)."""
        lone = LoneEntry(self.master_key, head, payload, self.recovery)
        pending = self._pend(HeldChunk(entry_id, entry_id, None, len(payload), lone), waiter,
                             lone=True)
        if pending is None:
            return
        ensemble, slots = pending
        timeout = self.ctx.conf.add_timeout_s
        get = self.ctx.transports.get
        answered = self._lone_answered
        for slot in slots:
            bookie = ensemble[slot]
            deliver = functools.partial(answered, slot, bookie, lone, entry_id)
            try:
                get(bookie).send_entry(lone, timeout, deliver)
            except errors.BKError as exc:
                # not even sent (e.g. the bookie's address lookup while etcd
                # is down): a failure of that bookie like any other
                deliver(None, exc)

    def _wait_inflight(self, count: int) -> None:
        """Take ``count`` in-flight requests (lock held); waits while the
        bound is reached and earlier requests are still out."""
        while self._inflight and self._inflight + count > self._max_inflight:
            self._inflight_waiters += 1
            try:
                self._inflight_free.wait()
            finally:
                self._inflight_waiters -= 1
        self._inflight += count

    def _answered(self, waited: bool) -> None:
        """One request to a bookie answered (lock held)."""
        if waited:
            self._inflight -= 1
            if self._inflight_waiters:
                self._inflight_free.notify_all()
        self._sends -= 1
        if not self._sends and self._sends_waiters:
            self._sends_done.notify_all()

    def _lone_answered(self, slot: int, bookie: str, lone: LoneEntry, entry_id: int,
                       _result: Any, exc: BaseException | None) -> None:
        if exc is None:
            with self._lock:
                self._answered(True)
                core = self.core
                core.ack_one(entry_id, slot, bookie)
                waiters = self._waiters
                done = self._collect_done() if waiters and waiters[0].last <= core.lac else None
            if done:
                self._complete(done)
            return
        with self._lock:
            self._answered(True)
        if not (admission.classify_add_failure(exc) == admission.OVERLOAD
                and self._retry_overloaded(slot, bookie, lone,
                                           range(entry_id, entry_id + 1), None)):
            self._on_failed(slot, bookie, exc)

    def wait_idle(self) -> None:
        """Block until every submitted entry is released or failed."""
        with self._lock:
            pending = [w.future for w in self._waiters]
        for f in pending:
            try:
                f.result()
            except errors.BKError:
                pass

    def wait_all_sent(self, timeout: float) -> int:
        """Block until every request sent to a bookie was answered (acked or
        failed), at most ``timeout`` seconds; so a ledger closed while healthy
        has all Qw copies, not just the Qa that released its entries.  The
        requests still unanswered (0: all were)."""
        with self._lock:
            self._sends_waiters += 1
            try:
                self._sends_done.wait_for(lambda: self._sends == 0, timeout)
            finally:
                self._sends_waiters -= 1
            return self._sends

    @property
    def unknown_tail(self) -> bool:
        """Aborted while adds were unreleased (see ``assigned_beyond_lac``):
        the ledger must be closed by fencing recovery, not at the LAC."""
        with self._lock:
            return self._error is not None and self.core.assigned_beyond_lac

    def fail(self, error: errors.BKError) -> None:
        self._abort(error)

    # -- sending ------------------------------------------------------------------------
    def _send(self, batch: pa.RecordBatch, ensemble: tuple[str, ...], bad: Collection[int], *,
              wait: bool, only_slots: set[int] | None = None) -> None:
        E, Qw = len(ensemble), self.md.write_quorum
        ids = batch.column("entry_id").to_numpy()
        # the full batch is encoded once (Qw == E) and a striped part per
        # bookie; large ones as buffers whose payloads are sent from where
        # they lie in ``batch`` (wire/entry_parts.py ``add_payload``)
        whole: list[Payload] = []
        for slot, bookie in enumerate(ensemble):
            if slot in bad or (only_slots is not None and slot not in only_slots):
                continue
            if Qw == E:                          # every slot holds every entry
                mask, count = None, len(ids)
            else:
                mask = holds(ids, E, Qw, slot)
                count = int(mask.sum())
            if count == 0:
                continue
            if count == len(ids):
                if not whole:
                    whole.append(add_payload(batch))
                data, sent_ids = whole[0], ids
            else:
                # a bookie stores contiguous-by-id runs; a filtered part is still ascending
                data, sent_ids = add_payload(batch, mask), ids[mask]
            try:
                self._send_one(slot, bookie, data, sent_ids, wait)
            except errors.BKError as exc:
                # not even sent (e.g. the bookie's address lookup while etcd is
                # down): a failure of that bookie like any other, so the ids
                # already assigned never strand behind it
                self._on_failed(slot, bookie, exc)

    def _send_one(self, slot: int, bookie: str, data: Payload | LoneEntry, ids: Ids,
                  wait: bool, overload: tuple[float, int] | None = None) -> None:
        """``overload``: (time of the first TooManyRequests, retries so far)
        when this is a re-send to an overloaded bookie."""
        with self._lock:
            if wait:
                self._wait_inflight(1)
            self._sends += 1
        try:
            transport = self.ctx.transports.get(bookie)
            if isinstance(data, LoneEntry):
                fut = transport.add_entry(self.master_key, data.head, data.payload,
                                          recovery=self.recovery,
                                          timeout=self.ctx.conf.add_timeout_s)
            else:
                fut = transport.add(self.ledger_id, self.master_key, data, recovery=self.recovery,
                                    timeout=self.ctx.conf.add_timeout_s)
        except BaseException:
            with self._lock:
                self._answered(wait)
            raise

        def done(f: Future[tuple[int, int]]) -> None:
            with self._lock:
                self._answered(wait)
            exc = f.exception()
            if exc is None:
                self._on_acked(ids, slot, bookie)
            elif not (admission.classify_add_failure(exc) == admission.OVERLOAD
                      and self._retry_overloaded(slot, bookie, data, ids, overload)):
                self._on_failed(slot, bookie, exc)
        fut.add_done_callback(done)

    def _retry_overloaded(self, slot: int, bookie: str, data: Payload | LoneEntry, ids: Ids,
                          overload: tuple[float, int] | None) -> bool:
        """The bookie refused the request as overloaded: send it again later.
        False when it has refused for too long (the caller treats it as a
        bookie failure)."""
        conf = self.ctx.conf
        now = self.ctx.clock()
        first, attempt = overload or (now, 0)
        if not admission.keep_retrying(first, now, conf.add_overload_retry_s):
            return False
        with self._lock:
            if (self._error is not None or self.core.ensemble[slot] != bookie
                    or slot in self.core.unavailable_slots):
                return True     # aborted, or the slot is being replaced: resends cover it
            self._sends += 1    # the retry is still a send not yet answered
        delay = admission.backoff_delay(attempt, self.ctx.rng.random(),
                                        conf.add_overload_backoff_ms / 1000.0,
                                        conf.add_overload_backoff_max_ms / 1000.0)

        def resend() -> None:
            with self._lock:
                self._sends -= 1
                self._sends_done.notify_all()
                stale = (self._error is not None or self.core.ensemble[slot] != bookie
                         or slot in self.core.unavailable_slots)
            if stale:
                return
            try:
                self._send_one(slot, bookie, data, ids, False, (first, attempt + 1))
            except errors.BKError as exc:
                self._on_failed(slot, bookie, exc)
        try:
            self.ctx.call_later(delay, resend)
        except RuntimeError:            # the client was closed under us
            with self._lock:
                self._sends -= 1
                self._sends_done.notify_all()
            return False
        return True

    def _on_acked(self, ids: Ids, slot: int, bookie: str) -> None:
        with self._lock:
            if len(ids) == ids[-1] - ids[0] + 1:       # contiguous (Qw == E)
                self.core.on_ack_range(int(ids[0]), int(ids[-1]), slot, bookie)
            else:                                      # striped part: gaps
                self.core.on_ack_ids(np.asarray(ids), slot, bookie)
            done = self._collect_done()
        self._complete(done)

    def _on_failed(self, slot: int, bookie: str, exc: BaseException) -> None:
        kind = admission.classify_add_failure(exc)
        if kind == admission.ABORT:
            self._abort(exc)        # fenced: every pending add has an UNKNOWN outcome
            return
        if kind == admission.ENTRY_REJECTED:
            # a healthy bookie refused the request itself: replacing it would
            # not help; ids are assigned, so nothing later may be released
            self._abort(errors.unknown_outcome(errors.TooLarge(
                f"bookie {bookie} refused the add as too large ({exc}); its limit is below "
                "what it advertised: check its max_entry_bytes / max_batch_bytes",
                ledger_id=self.ledger_id)))
            return
        if isinstance(exc, errors.BookieUnavailable):
            self.ctx.transports.invalidate(bookie)
        with self._lock:
            if self._error is not None:
                return
            self._failed_bookies.add(bookie)
            self._last_bookie_error = exc     # named if no replacement is found
            change = self.core.on_failure(slot, bookie)
        if change is not None:
            try:
                self.ctx.executor.submit(self._run_change, change)
            except RuntimeError:            # the client was closed under us
                self._abort(errors.Timeout("client closed while adds were in flight",
                                                ledger_id=self.ledger_id))

    # -- ensemble change ------------------------------------------------------------------
    def _run_change(self, change: EnsembleChange | None) -> None:
        while change is not None:
            try:
                new_md, self.limits = replace_by_cas(self.ctx, self.ledger_id, change,
                                                     self._failed_bookies,
                                                     recovery=self.recovery)
            except Exception as exc:  # noqa: BLE001 - never leave adds hanging
                self._abort(change_failure(exc, self.ledger_id, self._last_bookie_error))
                return
            with self._lock:
                if self._error is not None:
                    return
                self.md = new_md
                # the held chunks BEFORE the release below: entries that reached
                # Qa on the surviving slots while the change was pending are
                # released by commit_change, yet the resends cover them (the
                # replacement must hold every id of its fragment, #1591)
                chunks = list(self._chunks)
                _released, resends, change = self.core.commit_change(new_md.current_ensemble)
                done = self._collect_done()
                ensemble = self.core.ensemble
                bad = self.core.unavailable_slots
            if self._on_metadata is not None:
                self._on_metadata(new_md)
            # resends are counted in ``_sends`` before any add completes: a
            # close() that follows the last completion waits for them
            self._resend(chunks, resends, ensemble, bad)
            self._complete(done)

    def _resend(self, chunks: list[HeldChunk], resends: list[Resend],
                ensemble: tuple[str, ...], bad: set[int]) -> None:
        """Send what the core's resends name (``resend_parts``)."""
        for part, slots in resend_parts(chunks, resends):
            self._send(part, ensemble, bad, wait=False, only_slots=slots)

    # -- completion ------------------------------------------------------------------------
    def _collect_done(self) -> list[Waiter]:
        lac = self.core.lac
        done = []
        while self._waiters and self._waiters[0].last <= lac:
            done.append(self._waiters.pop(0))
        while self._chunks and self._chunks[0].last <= lac:
            self.length += self._chunks.pop(0).nbytes
        return done

    @staticmethod
    def _complete(done: list[Waiter]) -> None:
        for w in done:
            if not w.future.done():
                w.future.set_result(w.result())

    def _abort(self, error: BaseException) -> None:
        with self._lock:
            if self._error is None:
                self._error = error if isinstance(error, errors.BKError) else errors.LedgerFenced(str(error))
            self.core.abort()
            waiters, self._waiters = self._waiters, []
            self._chunks = []
            err = self._error
        for w in waiters:
            if not w.future.done():
                w.future.set_exception(err)
