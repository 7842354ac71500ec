"""In-memory bookies and transport (unit tests and simulations only).

``MemoryBookie`` takes the real bookie's decisions: each ledger's state is a
``pybk_spark.protocol.ledger_state.LedgerState`` changed only by that module's pure
functions, as in ``bookie_server.bookie.Bookie`` (the master key is recorded
on first use and checked afterwards, ``decide_add`` / ``decide_fence`` /
``decide_write_lac``; a fence is sticky and rejects non-recovery adds with
LedgerFenced; ``apply_entries``; ReadLac answers max(LAC carried by entries,
explicit LAC)); only the journal and entry store are replaced by dicts
(durable at once).  Duplicate entry ids keep the first copy; reads return the
contiguous run held from the first id asked.

``MemoryTransportPool`` answers synchronously (futures are already done)
unless a bookie is ``down`` (BookieUnavailable), ``hung`` (Timeout at once)
or ``stalled`` (the future never completes, like a SIGSTOPped bookie).
"""
from __future__ import annotations

import threading
from concurrent.futures import Future

import pyarrow as pa

from pybk_spark import errors
from pybk_spark.protocol import ledger_state as ls
from pybk_spark.transport.base import BookieTransport, TransportPool, failed_future
from pybk_spark.wire.add_validation import (AddBatchLimits, BatchLimits, validate_batch,
                                            validate_entry)
from pybk_spark.wire.entries import ENTRY_SCHEMA, Payload, empty_batch, joined, records_to_batch
from pybk_spark.wire.results import LacResult, ReadResult


class _Ledger:
    """One ledger on a MemoryBookie: the bookie's pure state plus its rows."""

    def __init__(self, lid: int):
        self.state = ls.empty(lid)
        self.rows: dict[int, dict] = {}

    @property
    def fenced(self) -> bool:
        return self.state.fenced

    @property
    def lac(self) -> int:
        return self.state.lac


class MemoryBookie:
    def __init__(self, bookie_id: str, limits: BatchLimits | None = None):
        self.bookie_id = bookie_id
        self.limits = limits or AddBatchLimits()     # a real bookie's defaults
        self.ledgers: dict[int, _Ledger] = {}
        self.read_only = False
        self.lock = threading.Lock()

    def _led(self, lid: int) -> _Ledger:
        led = self.ledgers.get(lid)
        if led is None:
            led = self.ledgers[lid] = _Ledger(lid)
        return led

    def _known(self, lid: int) -> _Ledger:
        led = self.ledgers.get(lid)
        if led is None:
            raise errors.NoSuchLedger(ledger_id=lid)
        return led

    def _answering(self, lid: int, fence: bool, key: bytes) -> _Ledger:
        """The ledger a read answers from, fenced first when asked (under the lock)."""
        if fence:
            self._fence(lid, key)
        return self._known(lid)

    def _fence(self, lid: int, key: bytes) -> None:
        led = self._led(lid)
        led.state = ls.decide_fence(led.state, key).state

    def add(self, lid: int, key: bytes, data: Payload, recovery: bool) -> tuple[int, int]:
        batch = validate_batch(joined(data), lid, self.limits)   # the real bookie's checks
        return self._add_batch(lid, key, batch, recovery)

    def add_entry(self, key: bytes, record: bytes, recovery: bool) -> tuple[int, int]:
        """A lone add as its entry record: the real bookie's checks for one."""
        lid, _entry_id, _lac = validate_entry(record, self.limits)
        return self._add_batch(lid, key, records_to_batch([record]), recovery)

    def _add_batch(self, lid: int, key: bytes, batch, recovery: bool) -> tuple[int, int]:
        with self.lock:
            led = self.ledgers.get(lid) or _Ledger(lid)
            try:
                plan = ls.decide_add(led.state, key, recovery=recovery, read_only=self.read_only)
            except errors.BKError as exc:
                exc.context.setdefault("bookie", self.bookie_id)
                raise
            self.ledgers[lid] = led
            cols = batch.to_pydict()
            for i, e in enumerate(cols["entry_id"]):
                if e not in led.rows:
                    led.rows[e] = {k: cols[k][i] for k in cols}
            ids = cols["entry_id"]
            led.state = plan.state
            if ids:
                led.state = ls.apply_entries(led.state, max(cols["lac"]), ids[-1])
            return (ids[0], ids[-1]) if ids else (-1, -1)

    def read(self, lid: int, first: int, last: int, max_entries: int = 0,
             fence: bool = False, key: bytes = b"", max_bytes: int = 0) -> ReadResult:
        with self.lock:
            if fence:
                self._fence(lid, key)
            if first < 0 or last < first:
                raise errors.BadRequest(f"bad entry range [{first}, {last}]")
            led = self._known(lid)
            rows: list = []
            e = first
            limit = max_entries or 1 << 30
            budget, size, over = max_bytes or 1 << 62, 0, False    # payload bytes, >= 1 entry
            while e <= last and e in led.rows and len(rows) < limit:
                size += len(led.rows[e]["payload"])
                if rows and size > budget:
                    over = True
                    break
                rows.append(led.rows[e])
                e += 1
            if not rows:
                raise errors.NoSuchEntry(ledger_id=lid, entry_id=first)
            batch = pa.RecordBatch.from_pylist(rows, schema=ENTRY_SCHEMA) if rows else empty_batch()
            end = "COMPLETE" if e > last else ("LIMIT" if len(rows) >= limit or over else "MISSING")
            return ReadResult(batch, end, led.lac, led.fenced)

    def read_sparse(self, lid: int, first: int, last: int, max_entries: int = 0,
                    fence: bool = False, key: bytes = b"",
                    stripe: tuple[int, int] | None = None) -> ReadResult:
        with self.lock:
            led = self._answering(lid, fence, key)
            limit = max_entries or 1 << 30
            ids = sorted(e for e in led.rows if first <= e <= last)
            rows = [led.rows[e] for e in ids[:limit]
                    if stripe is None or e % stripe[0] == stripe[1]]
            batch = pa.RecordBatch.from_pylist(rows, schema=ENTRY_SCHEMA) if rows else empty_batch()
            end = "LIMIT" if len(ids) > limit else "COMPLETE"
            return ReadResult(batch, end, led.lac, led.fenced)

    def read_lac(self, lid: int, fence: bool = False, key: bytes = b"") -> LacResult:
        with self.lock:
            led = self._answering(lid, fence, key)
            return LacResult(led.lac, max(led.rows, default=-1), led.fenced)

    def write_lac(self, lid: int, key: bytes, lac: int) -> None:
        with self.lock:
            led = self._led(lid)
            led.state = ls.decide_write_lac(led.state, key, lac).state


def _run(fn) -> Future:
    f: Future = Future()
    try:
        f.set_result(fn())
    except errors.BKError as exc:
        f.set_exception(exc)
    return f


class MemoryTransport(BookieTransport):
    def __init__(self, pool: "MemoryTransportPool", bookie_id: str):
        self.pool = pool
        self.bookie_id = bookie_id

    def _do(self, fn) -> Future:
        if self.bookie_id in self.pool.down or self.bookie_id not in self.pool.bookies:
            return failed_future(errors.BookieUnavailable(bookie=self.bookie_id))
        if self.bookie_id in self.pool.hung:
            return failed_future(errors.Timeout(bookie=self.bookie_id))
        if self.bookie_id in self.pool.stalled:      # never answers (SIGSTOP)
            f: Future = Future()
            self.pool.stalled_futures.append(f)
            return f
        return _run(lambda: fn(self.pool.bookies[self.bookie_id]))

    def add(self, ledger_id, master_key, entries, recovery=False, timeout=None):
        return self._do(lambda b: b.add(ledger_id, master_key, entries, recovery))

    def add_entry(self, master_key, record_head, payload, recovery=False, timeout=None):
        record = record_head + payload
        return self._do(lambda b: b.add_entry(master_key, record, recovery))

    def read(self, ledger_id, first, last, *, max_entries=0, max_bytes=0, fence=False,
             master_key=b"", timeout=None, sparse=False, stripe=None):
        if sparse:
            return self._do(lambda b: b.read_sparse(ledger_id, first, last, max_entries,
                                                    fence, master_key, stripe))
        return self._do(lambda b: b.read(ledger_id, first, last, max_entries, fence, master_key,
                                         max_bytes))

    def read_lac(self, ledger_id, *, fence=False, master_key=b"", wait_for_lac_above=-2,
                 wait_ms=0, timeout=None):
        return self._do(lambda b: b.read_lac(ledger_id, fence, master_key))

    def write_lac(self, ledger_id, master_key, lac, timeout=None):
        return self._do(lambda b: b.write_lac(ledger_id, master_key, lac))


class MemoryTransportPool(TransportPool):
    def __init__(self, bookies: dict[str, MemoryBookie] | None = None):
        self.bookies: dict[str, MemoryBookie] = dict(bookies or {})
        self.down: set[str] = set()
        self.hung: set[str] = set()
        self.stalled: set[str] = set()
        self.stalled_futures: list[Future] = []

    def add_bookie(self, bookie_id: str) -> MemoryBookie:
        b = self.bookies[bookie_id] = MemoryBookie(bookie_id)
        return b

    def get(self, bookie_id: str) -> BookieTransport:
        return MemoryTransport(self, bookie_id)
