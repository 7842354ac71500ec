"""``LedgerHandle``: the single writer of an OPEN ledger.

Theory of operation
-------------------
A payload over the ledger's entry limit (``protocol.add_admission``:
client ``max_entry_size_bytes`` bounded by the ensemble bookies' advertised
limits) is refused with ``TooLarge`` before it gets an id, and so is a whole
``add_entries`` call holding one; the handle stays usable.
Payloads are cut into chunks (``add_batch_entries`` / ``add_batch_bytes``,
and the bookies' per-request limit; the rule is ``protocol.batch_cuts``, for
``add_entries`` and for the coalescing queue of ``add_entry_async`` alike);
each chunk gets consecutive ids, the current LAC and the ledger length
before it in one core step (each entry carries its cumulative length, as in
BookKeeper), its digests are computed, and it becomes one Arrow batch sent to every bookie of
its write sets (``LedgerWriter``).  Futures complete in id order.

``add_entry_async`` returns an ``AddFuture`` (ledger/add_future.py) holding
its payload and appends it to a deque without a lock; a drain on the
client's executor takes one batch from its left (``_take_queued``, under
the submit lock, at most ``async_add_window`` batches in flight), and the
batch's completion (``_CoalescedBatch``) completes its calls' futures in one
loop before it counts as done itself, so ``close()`` returns with every
one of them completed.

``close()`` waits for outstanding adds, and up to ``add_timeout_s`` for the
Qw - Qa copies still unanswered (a warning names how many, if any: those
entries have their Qa copies, the replicas check or autorecovery restores
Qw), then CASes CLOSED with last entry =
LAC following the protocol's three outcomes (``close_by_writer``); the writer
lease key is revoked.  Exception: a handle whose writer aborted (fenced, or a
failed ensemble change) with unreleased adds closes by fencing recovery,
because those adds may still land on a bookie after the close (a
SIGSTOPped bookie that resumes can store entry LAC+1 on its whole write set);
the handle runs that recovery itself (``recovery_op.recover`` with its own
context), it does not re-enter the client's open path.
If that recovery fails, the ledger stays OPEN/IN_RECOVERY for a recoverer.

An idle handle sends an explicit LAC (driven by the client's background
ticker, ``tick()``).
"""
from __future__ import annotations

import logging
import threading
from collections import deque
from concurrent.futures import Future
from types import TracebackType
from typing import Callable, Iterable, TypeVar

import pyarrow as pa

from pybk_spark import errors
from pybk_spark.ledger.context import ClientContext
from pybk_spark.wire.digest import Digester
from pybk_spark.ledger import sync_result
from pybk_spark.ledger.add_future import AddFuture, complete_ids, fail_all
from pybk_spark.ledger.ledger_writer import LedgerWriter, Waiter
from pybk_spark.metadata.store import Lease, ledger_key
from pybk_spark.protocol import add_admission as admission
from pybk_spark.protocol import batch_cuts
from pybk_spark.protocol import ledger_metadata as lm
from pybk_spark.ledger.read_handle import ReadHandle
from pybk_spark.ledger.recovery_op import recover
from pybk_spark.wire.entries import Entry, PayloadColumn, entry_record_head

log = logging.getLogger("pybk_spark.ledger")
_F = TypeVar("_F", bound=AddFuture)


def _binary_column(values: pa.Array, ledger_id: int) -> pa.Array:
    """``values`` as the entries' payload column type (binary, no nulls),
    or ``IncorrectParameter`` saying what to pass instead."""
    if values.null_count:
        raise errors.IncorrectParameter(
            f"add_entries_async: the payload column holds {values.null_count} null(s); an entry "
            "is bytes (an empty one is b'')", ledger_id=ledger_id)
    if values.type == pa.binary():
        return values
    try:
        return values.cast(pa.binary())
    except (pa.ArrowException, ValueError, TypeError):
        raise errors.IncorrectParameter(
            f"add_entries_async: a payload column of type {values.type} is not bytes; pass a "
            "binary column or a list of bytes", ledger_id=ledger_id) from None


class LedgerHandle:
    """``ctx``: the client's dependencies; ``on_close(handle)``: called once
    the handle is closed (the client stops ticking it)."""

    def __init__(self, ctx: ClientContext, md: lm.LedgerMetadata, password: bytes,
                 lease: Lease | None = None, limits: admission.AddLimits | None = None,
                 on_close: Callable[[LedgerHandle], None] | None = None) -> None:
        self.ctx = ctx
        self._on_close = on_close
        self.ledger_id = md.ledger_id
        self._password = password
        self._key = lm.master_key(password)
        self._digester = Digester(md.digest_type, password)
        self._writer = LedgerWriter(ctx, md, self._key, recovery=False, limits=limits)
        self._lease = lease
        self._submit_lock = threading.RLock()  # ids assigned and sent in order
        # add_entry_async calls made while earlier ones are being sent are
        # coalesced into one Arrow batch per bookie (one RPC, not one per
        # entry).  Callers append their futures (each holding its payload)
        # without a lock; only a holder of _submit_lock takes from the left
        # (_take_queued).
        self._queued: deque[AddFuture] = deque()
        self._queue_lock = threading.Lock()     # the drain flag and the window count
        self._drain_scheduled = False
        self._async_inflight = 0
        self._async_window = max(1, ctx.conf.async_add_window)
        self._closed = False
        self._explicit_lac_sent = -1

    # -- properties -------------------------------------------------------------------
    @property
    def metadata(self) -> lm.LedgerMetadata:
        return self._writer.md

    @property
    def last_add_confirmed(self) -> int:
        return self._writer.lac

    @property
    def length(self) -> int:
        return self._writer.length

    @property
    def error(self) -> errors.BKError | None:
        """Why this handle's writer aborted (every later add fails with it),
        or None while it is usable."""
        return self._writer.error

    @property
    def limits(self) -> admission.AddLimits:
        """The add size limits of the current ensemble."""
        return self._writer.limits

    # -- adds ---------------------------------------------------------------------------
    def add_entry(self, payload: bytes) -> int:
        if type(payload) is not bytes:
            payload = bytes(payload)            # the caller may reuse its buffer
        limits = self._writer.limits
        if not limits.entry_fits(len(payload)):       # the rule's one home
            raise admission.too_large(len(payload), limits, ledger_id=self.ledger_id)
        fut = sync_result.new_sync_result()
        with self._submit_lock:
            if self._queued:                # earlier async adds keep their place
                self._send_queued_locked()
            if self._closed:
                raise errors.LedgerClosed("ledger handle is closed", ledger_id=self.ledger_id)
            self._send_lone(payload, fut)
        result: int = fut.result()
        return result

    def add_entry_async(self, payload: bytes) -> "Future[int]":
        """Pipelined add.  Calls are coalesced into batches (one Arrow batch and
        one request per bookie each) with at most ``async_add_window`` batches
        in flight: while they are out, new calls queue up and leave together
        (Nagle's idea).  Entry ids follow call order.  The future is an
        ``AddFuture`` (ledger/add_future.py): a ``concurrent.futures.Future``
        that makes its condition only when someone waits on it pending."""
        if type(payload) is not bytes:
            payload = bytes(payload)            # the caller may reuse its buffer
        return self.enqueue_add(AddFuture(payload))

    def enqueue_add(self, fut: _F) -> _F:
        """Queue the pipelined add ``fut`` holds (an ``AddFuture`` made with
        its payload, as ``bytes``), as ``add_entry_async`` does: for a layer
        above that hands its callers its own ``AddFuture`` subclass (a log
        writer's presents a position), with no second future or callback
        per add.  Returns ``fut``."""
        payload: bytes = fut._payload           # type: ignore[assignment]
        limits = self._writer.limits
        if not limits.entry_fits(len(payload)):       # the rule's one home
            fut.set_exception(admission.too_large(len(payload), limits,
                                                  ledger_id=self.ledger_id))
            return fut
        self._queued.append(fut)
        if not self._drain_scheduled:
            self._kick()
        return fut

    def _kick(self) -> None:
        """Schedule a drain unless one is scheduled or the window is full (a
        finishing batch then schedules one)."""
        with self._queue_lock:
            if (self._drain_scheduled or not self._queued
                    or self._async_inflight >= self._async_window):
                return
            self._drain_scheduled = True
        self._schedule_drain()

    def _schedule_drain(self) -> None:
        try:
            self.ctx.executor.submit(self._drain_queued)
        except RuntimeError:            # client executor shut down: send inline
            self._drain_queued()

    def _drain_queued(self) -> None:
        with self._submit_lock:
            self._send_queued_locked(windowed=True)

    def _take_queued(self, windowed: bool) -> tuple[list[bytes], list[AddFuture]]:
        """Pop one batch worth of queued adds (payloads, futures).  Clears the
        drain flag when nothing more may go now.  No add strands: a call
        appends, then reads the flag, and kicks a drain if it is clear; here
        the flag is cleared, then the queue read again, so a call that read
        the flag still set is seen by that read; a call stopped by a full
        window is sent when a batch finishes (``_async_batch_done``)."""
        q = self._queued
        with self._queue_lock:
            if windowed and self._async_inflight >= self._async_window:
                self._drain_scheduled = False
                return [], []
            if not q:
                self._drain_scheduled = False
                if not q:
                    return [], []
                self._drain_scheduled = True
            self._async_inflight += 1
        conf = self.ctx.conf
        pop = q.popleft
        futures = [pop() for _ in range(min(len(q), max(1, conf.add_batch_entries)))]
        payloads: list[bytes] = [f._payload for f in futures]   # type: ignore[misc]
        take = batch_cuts.first_batch(list(map(len, payloads)), conf.add_batch_entries,
                                      conf.add_batch_bytes, self._writer.limits)
        if take < len(futures):
            q.extendleft(reversed(futures[take:]))      # back in front, in order
            del futures[take:], payloads[take:]
        return payloads, futures

    def _async_batch_done(self) -> None:
        """A coalesced batch finished: its window slot is free again."""
        with self._queue_lock:
            self._async_inflight -= 1
            again = bool(self._queued) and not self._drain_scheduled
            if again:
                self._drain_scheduled = True
        if again:
            self._schedule_drain()

    def _send_queued_locked(self, windowed: bool = False) -> None:
        """Caller holds _submit_lock: send queued async adds, in order (all of
        them unless ``windowed``, e.g. before a sync add or close)."""
        while True:
            payloads, futures = self._take_queued(windowed)
            if not futures:
                return
            batch = _CoalescedBatch(self, futures)
            try:
                self._assign_and_send(payloads, batch)
            except BaseException as exc:  # noqa: BLE001 - e.g. a bookie address lookup
                # while etcd is unreachable: these adds' outcome is unknown, and
                # they must fail rather than strand in a background task
                batch.set_exception(exc if isinstance(exc, errors.BKError) else
                                    errors.Timeout(f"add not sent: {exc!r}",
                                                   ledger_id=self.ledger_id))

    def add_entries(self, payloads: Iterable[bytes]) -> list[int]:
        futs = [f for f in self.add_entries_async(payloads)]
        out: list[int] = []
        for f in futs:
            out.extend(f.result())
        return out

    def add_entries_async(self, payloads: Iterable[bytes] | pa.Array
                          ) -> list[Future[list[int]]]:
        """Raises ``TooLarge`` (nothing sent, no id assigned) when any payload
        is over the entry limit; otherwise cuts the payloads into requests
        each within the bookies' per-request limit.  ``payloads`` may be a
        binary Arrow column (entries laid back to back, e.g. the Spark
        writer's): each request's payloads are then a zero-copy slice of it
        rather than a join of separate ``bytes``."""
        blobs: list[bytes] | PayloadColumn
        if isinstance(payloads, pa.Array):
            blobs = PayloadColumn.of(_binary_column(payloads, self.ledger_id))
            sizes = blobs.sizes()
        else:
            blobs = [bytes(p) for p in payloads]
            sizes = list(map(len, blobs))
        lim = self._writer.limits
        bad = batch_cuts.first_oversized(sizes, lim)
        if bad is not None:
            raise admission.too_large(sizes[bad], lim, ledger_id=self.ledger_id)
        conf = self.ctx.conf
        start = 0
        futs: list[Future[list[int]]] = []
        for end in batch_cuts.batch_ends(sizes, conf.add_batch_entries, conf.add_batch_bytes, lim):
            futs.append(self._chunk_future(blobs[start:end] if isinstance(blobs, list)
                                           else blobs.slice(start, end)))
            start = end
        return futs

    def _chunk_future(self, chunk: list[bytes] | PayloadColumn) -> Future[list[int]]:
        fut: Future[list[int]] = Future()
        self._submit_chunk(chunk, fut)
        return fut

    def _submit_chunk(self, payloads: list[bytes] | PayloadColumn,
                      fut: Future[list[int]]) -> None:
        with self._submit_lock:
            self._send_queued_locked()          # earlier async adds keep their place
            self._assign_and_send(payloads, fut)

    def _assign_and_send(self, payloads: list[bytes] | PayloadColumn,
                         fut: Future[list[int]] | _CoalescedBatch) -> None:
        """``fut`` gets the list of ids (a ``_CoalescedBatch``: the first id)."""
        if self._closed:
            fut.set_exception(errors.LedgerClosed("ledger handle is closed", ledger_id=self.ledger_id))
            return
        with self._submit_lock:
            nbytes = (payloads.nbytes if isinstance(payloads, PayloadColumn)
                      else sum(map(len, payloads)))
            try:
                first, lac, base = self._writer.assign(len(payloads), nbytes)
            except errors.BKError as exc:
                fut.set_exception(exc)
                return
            batch = self._digester.run_batch(self.ledger_id, first, lac, base, payloads)
            last = first + len(payloads) - 1
            result: Callable[[], object] = ((lambda: first) if isinstance(fut, _CoalescedBatch)
                                            else (lambda: list(range(first, last + 1))))
            self._writer.submit(batch, Waiter(last, fut, result), nbytes=nbytes)

    def _send_lone(self, payload: bytes, fut: sync_result.Completion) -> None:
        """A sync add (caller holds ``_submit_lock``): the entry travels as
        the record this writer frames (wire/entries.py), no batch built
        unless a resend needs one."""
        try:
            entry_id, lac, base = self._writer.assign(1, len(payload))
        except errors.BKError as exc:
            fut.set_exception(exc)
            return
        length = base + len(payload)
        digest = self._digester.one(self.ledger_id, entry_id, lac, length, payload)
        head = entry_record_head(self.ledger_id, entry_id, lac, length, digest)
        self._writer.submit_entry(entry_id, head, payload,
                                  Waiter(entry_id, fut, lambda: entry_id))

    # -- explicit LAC --------------------------------------------------------------------
    def tick(self, now: float) -> None:
        """Called periodically by the client: send an explicit LAC when idle."""
        interval = self.ctx.conf.explicit_lac_interval_ms / 1000.0
        w = self._writer
        if self._closed or not interval or w.error is not None:
            return
        lac = w.lac
        if lac > self._explicit_lac_sent and now - w.last_activity >= interval:
            self._explicit_lac_sent = lac
            for b in w.md.current_ensemble:
                self.ctx.transports.get(b).write_lac(self.ledger_id, self._key, lac)

    # -- reads by the writer ----------------------------------------------------------------
    def read(self, first: int, last: int) -> list[Entry]:
        return ReadHandle(self.ctx, self.metadata, self._password, self.last_add_confirmed).read(first, last)

    # -- close ------------------------------------------------------------------------------
    def close(self) -> None:
        if self._closed:
            return
        with self._submit_lock:
            self._send_queued_locked()          # queued async adds go out first
            self._closed = True
        try:
            self._writer.wait_idle()
            if self._writer.unknown_tail:
                # aborted with adds of unknown outcome still able to land on a
                # bookie: only fencing recovery may decide where the ledger ends
                md = self.ctx.ledger_metadata(self.ledger_id)
                self._writer.md = recover(self.ctx, md, self._password).metadata
                return
            unanswered = self._writer.wait_all_sent(self.ctx.conf.add_timeout_s)  # Qw - Qa stragglers
            if unanswered:
                # legitimate (every entry has its Qa copies), but worth an operator's eye
                log.warning("ledger %d: closing with %d request(s) to bookies unanswered after "
                            "add_timeout_s=%.1f s; some entries may have fewer than Qw=%d copies "
                            "until the replicas check or autorecovery copies them",
                            self.ledger_id, unanswered, self.ctx.conf.add_timeout_s,
                            self._writer.md.write_quorum)
            lac, length = self._writer.lac, self._writer.length

            def transform(raw: bytes) -> bytes:
                md = lm.LedgerMetadata.from_json(raw)
                return lm.close_by_writer(md, lac, length).to_json()
            raw, _ = self.ctx.metadata_store.update(ledger_key(self.ledger_id), transform)
            self._writer.md = lm.LedgerMetadata.from_json(raw)
            self._writer.fail(errors.LedgerClosed("ledger closed", ledger_id=self.ledger_id))
        finally:
            if self._on_close is not None:
                self._on_close(self)
            if self._lease is not None:
                try:
                    self._lease.revoke()
                except errors.BKError:
                    pass

    def __enter__(self) -> LedgerHandle:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()



class _CoalescedBatch(AddFuture):
    """What the writer completes for one coalesced batch of ``add_entry_async``
    calls (with its first id): it completes each call's future first, so a
    waiter on the batch (``close``, through ``wait_idle``) sees them done.
    The writer may complete it twice (an abort racing a failed send): the
    first completion counts."""

    def __init__(self, handle: LedgerHandle, futures: list[AddFuture]) -> None:
        super().__init__()
        self._handle = handle
        self._futures = futures
        self._claim = threading.Lock()

    def _claimed(self) -> bool:
        return self._claim.acquire(blocking=False)

    def set_result(self, result: int) -> None:
        if self._claimed():
            self._handle._async_batch_done()
            complete_ids(self._futures, result)
            super().set_result(result)

    def set_exception(self, exception: BaseException | None) -> None:
        if self._claimed():
            assert exception is not None
            self._handle._async_batch_done()
            fail_all(self._futures, exception)
            super().set_exception(exception)
