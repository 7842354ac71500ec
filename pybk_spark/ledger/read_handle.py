"""Reading a ledger: ``ReadHandle`` (range reads, LAC, long-poll tail).

The LAC query to the last fragment's bookies (a handle's
``read_last_add_confirmed``, the non-recovery open, recovery's fence phase)
is ``lac_query.py``; ``verified_prefix`` here is the rule for an answer's
usable rows, which recovery's forward reads apply too.

Theory of operation
-------------------
The decisions (verified prefix, merged sparse answers, replica order and
speculative reads, when an entry is missing, LAC coverage) are
``protocol.read_decisions``; this module sends the requests, verifies
digests and turns the verdicts into typed errors.
A range [first, last] is read fragment by fragment.  For the next wanted id
``e`` the replicas are the write set of ``e`` in its fragment's ensemble; one
replica is asked for the run [e, min(last, fragment end, e + batch - 1)]
(bookies answer the contiguous run they hold).  If it has not answered after
the speculative delay, the next replica is asked as well; the first usable
answer wins.  A replica is skipped when it errors, lacks ``e``, or returns a
row whose digest does not verify (rows after the first corrupt one are
dropped); BadDigest only if every replica was corrupt, NoSuchEntry if every
replica lacks the entry.  Batches are verified and projected with Arrow.
Striped fragments (E > Qw), where no bookie holds a long contiguous run, are
read with one sparse read per bookie, merged and deduplicated with Arrow.

Pipelining: a range is cut into windows (``read_batch_entries`` /
``read_batch_bytes``) and up to ``read_windows_in_flight`` of them are
requested before the first is awaited, consecutive windows going to the next
replica of the round robin, so the bookies serve the next windows while the
reader verifies this one.  Order obligation: windows are finished strictly
front to back, and a window answered short is completed by fresh reads of its
remainder before the next window is used; batches therefore come out
contiguous and in entry-id order, exactly as without pipelining.  Windows
still in flight when the consumer stops are abandoned (their answers are
dropped).
"""
from __future__ import annotations

import collections
import concurrent.futures as cf
import dataclasses
from concurrent.futures import Future
from types import TracebackType
from typing import Any, Callable, Iterable, Iterator

import numpy as np
import pyarrow as pa

from pybk_spark import errors
from pybk_spark.ledger.context import ClientContext
from pybk_spark.ledger.lac_query import query_lac
from pybk_spark.wire.digest import Digester
from pybk_spark.protocol import ledger_metadata as lm
from pybk_spark.protocol import read_decisions as rd
from pybk_spark.transport.base import failed_future
from pybk_spark.wire.entries import Entry, one_batch, to_entries
from pybk_spark.wire.results import ReadResult

OUT_COLUMNS = ["ledger_id", "entry_id", "payload"]
STRIPED_WINDOW = 1 << 20   # (ids per striped read are bounded by max_entries)


class ReadHandle:
    def __init__(self, ctx: ClientContext, md: lm.LedgerMetadata, password: bytes,
                 lac: int) -> None:
        self.ctx = ctx
        self.metadata = md
        self.ledger_id = md.ledger_id
        self._password = password
        self._master_key = lm.master_key(password)
        self._digester = Digester(md.digest_type, password)
        self._lac = lac
        self._rr = 0
        self._stripe_reads_ok = True      # first-replica striped reads until one fails

    @property
    def last_add_confirmed(self) -> int:
        return self._lac

    @property
    def is_closed(self) -> bool:
        return self.metadata.is_closed

    def close(self) -> None:
        """Readers hold no bookie-side state; kept for symmetry with BookKeeper's API."""

    def __enter__(self) -> ReadHandle:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()

    def _refresh_metadata(self) -> None:
        md = self.ctx.ledger_metadata(self.ledger_id)
        self.metadata = md
        if md.is_closed:
            self._lac = md.last_entry_id

    # -- LAC ---------------------------------------------------------------------------
    def read_last_add_confirmed(self) -> int:
        """Max LAC over the last fragment once the answers cover it (non-fencing)."""
        self._refresh_metadata()
        if self.metadata.is_closed:
            return self._lac
        lac = query_lac(self.ctx, self.metadata, self._master_key, fence=False)
        self._lac = max(self._lac, lac)
        return self._lac

    def wait_for_lac(self, above: int, timeout: float) -> int:
        """Long poll: return as soon as the LAC exceeds ``above`` or at timeout."""
        if self._lac > above:
            return self._lac
        deadline = self.ctx.clock() + timeout
        while True:
            self._refresh_metadata()
            if self.metadata.is_closed or self._lac > above:
                return self._lac
            remaining = deadline - self.ctx.clock()
            if remaining <= 0:
                return self._lac
            wait_ms = int(min(remaining, 10.0) * 1000)
            futs = [self.ctx.transports.get(b).read_lac(
                self.ledger_id, master_key=self._master_key, wait_for_lac_above=above,
                wait_ms=wait_ms) for b in self.metadata.current_ensemble]
            for f in cf.as_completed(futs, timeout=None):
                try:
                    res = f.result()
                except errors.BKError:
                    continue
                self._lac = max(self._lac, res.lac)
                if self._lac > above:
                    return self._lac
            if not futs:
                return self._lac

    # -- reads ---------------------------------------------------------------------------
    def read(self, first: int, last: int) -> list[Entry]:
        out: list[Entry] = []
        for batch in self._raw_batches(first, last, self.ctx.conf.read_batch_entries):
            out.extend(to_entries(batch))
        return out

    def read_batches(self, first: int, last: int, max_entries: int | None = None,
                     max_bytes: int | None = None, windows_in_flight: int | None = None,
                     as_tables: bool = False) -> Iterator[pa.RecordBatch]:
        """Arrow batches (ledger_id, entry_id, payload) covering [first, last];
        each batch holds at most ``max_entries`` entries and, past its first
        entry, about ``max_bytes`` of payload, with up to ``windows_in_flight``
        windows requested ahead (defaults: the client's ``read_batch_entries``
        / ``read_batch_bytes`` / ``read_windows_in_flight``).  ``as_tables``:
        a window assembled from several bookies' answers (striped ledgers)
        may come as a ``pyarrow.Table`` of zero-copy row slices instead of
        being copied into one batch, for a consumer that copies the rows
        anyway (the Spark source decodes them)."""
        for batch in self._raw_batches(first, last, max_entries or self.ctx.conf.read_batch_entries,
                                       max_bytes or self.ctx.conf.read_batch_bytes,
                                       windows_in_flight):
            batch = batch.select(OUT_COLUMNS)
            yield batch if as_tables else one_batch(batch)

    def _check_range(self, first: int, last: int) -> None:
        if first < 0 or last < first:
            raise errors.IncorrectParameter(f"bad entry range [{first}, {last}]")
        if last > self._lac:
            self._refresh_metadata()
            if last > self._lac:
                raise errors.NoSuchEntry("entry beyond the last add confirmed",
                                         ledger_id=self.ledger_id, entry_id=last, lac=self._lac)

    def _raw_batches(self, first: int, last: int, max_entries: int,
                     max_bytes: int | None = None,
                     windows_in_flight: int | None = None) -> Iterator[pa.RecordBatch]:
        """Pipelined: up to ``read_windows_in_flight`` windows are requested
        ahead; each is finished (failover, fallbacks) when it reaches the
        front.  A window answered short (``max_bytes``, a corrupt row) is
        completed with fresh reads before the next window is used, so batches
        come out contiguous and in order.  Windows still in flight when the
        consumer stops (closes the generator) are cancelled."""
        self._check_range(first, last)
        depth = max(1, windows_in_flight or self.ctx.conf.read_windows_in_flight)
        ahead: collections.deque[_Window] = collections.deque()
        planned = nxt = first
        try:
            while nxt <= last:
                while len(ahead) < depth and planned <= last:
                    window = self._start_window(planned, min(last, planned + max_entries - 1),
                                                max_bytes)
                    ahead.append(window)
                    planned = window.last + 1
                window = ahead[0]
                if window.first == nxt:
                    batch = window.finish()
                else:                       # the rest of a window answered short
                    batch = self._start_window(nxt, window.last, max_bytes).finish()
                if batch.num_rows > window.last - nxt + 1:
                    batch = batch.slice(0, window.last - nxt + 1)
                nxt += batch.num_rows
                if nxt > window.last:
                    ahead.popleft()
                yield batch
        finally:        # the consumer stopped early (a LIMIT) or a read failed
            for window in ahead:
                window.cancel()

    def _start_window(self, first: int, last: int, max_bytes: int | None) -> "_Window":
        """Request [first, last] (cut at the fragment's end) without waiting."""
        ensemble = self.metadata.ensemble_for(first)
        qw = self.metadata.write_quorum
        last = min(last, self._fragment_end(first))
        if len(ensemble) > qw:          # striped: a bookie holds runs of Qw ids
            last = min(last, first + STRIPED_WINDOW * qw - 1)
            futs = (self._sparse_reads(first, last, ensemble, True, max_bytes)
                    if self._stripe_reads_ok else None)
            return _Window(first, last, lambda: self._finish_striped(first, last, ensemble,
                                                                     max_bytes, futs),
                           lambda: _cancel_all(futs or ()))
        run = self._start_run(first, last, max_bytes)
        return _Window(first, last, lambda: self._finish_run(run),
                       lambda: _cancel_all(list(run.pending)))

    def _finish_striped(self, first: int, last: int, ensemble: tuple[str, ...],
                        max_bytes: int | None,
                        futs: list[Future[ReadResult]] | None) -> pa.RecordBatch:
        """Striped range.  First try: each bookie was asked only for the
        entries whose write set starts at it (``stripe=(E, slot)``,
        BookKeeper's first-replica read), so each entry crosses the wire once.
        If that leaves the front entry missing or corrupt (a bookie down or
        behind), or after any failure on this handle, read every replica's
        copies (one SPARSE read per bookie) and merge.  Either way: first copy
        of each id, digest-verified, longest gap-free prefix from ``first``;
        nothing usable at the front falls back to a replica run (per-replica
        failover, speculative reads, typed errors)."""
        if futs is not None:
            merged = self._merge_sparse(first, futs)
            if merged is not None:
                return merged
            self._stripe_reads_ok = False
        merged = self._merge_sparse(first, self._sparse_reads(first, last, ensemble, False,
                                                              max_bytes))
        return merged if merged is not None else self._finish_run(
            self._start_run(first, last, max_bytes))

    def _sparse_reads(self, first: int, last: int, ensemble: tuple[str, ...], by_slot: bool,
                      max_bytes: int | None) -> list[Future[ReadResult]]:
        conf = self.ctx.conf
        budget = max_bytes or conf.read_batch_bytes
        if by_slot:                  # each bookie returns ~1/E of the window
            budget = max(1, budget // len(ensemble))
        return [self._ask(b, first, last, max_entries=last - first + 1, max_bytes=budget,
                          sparse=True, stripe=(len(ensemble), slot) if by_slot else None)
                for slot, b in enumerate(ensemble)]

    def _ask(self, bookie: str, first: int, last: int, **kw: Any) -> Future[ReadResult]:
        """One read request; a failure to even send it (the bookie's address
        lookup while etcd is down) is that replica's answer, so a window
        requested ahead never fails the reader before its turn, and the
        replica is skipped like any other failed one."""
        try:
            return self.ctx.transports.get(bookie).read(
                self.ledger_id, first, last, master_key=self._master_key,
                timeout=self.ctx.conf.read_timeout_s, **kw)
        except errors.BKError as exc:
            return failed_future(exc)

    def _merge_sparse(self, first: int, futs: list[Future[ReadResult]]
                      ) -> pa.RecordBatch | None:
        """The verified gap-free prefix from ``first`` of the answers, or None."""
        batches: list[pa.RecordBatch] = []
        for f in futs:
            try:
                batch = f.result()
            except errors.Unauthorized:
                raise
            except errors.BKError:
                self._stripe_reads_ok = False
                continue
            if batch.batch.num_rows:
                batches.append(batch.batch)
        if not batches:
            return None
        table = pa.Table.from_batches(batches)
        take = rd.gap_free_first_copies(table.column("entry_id").to_numpy(), first)
        if len(take) == 0:
            return None
        merged = _gather(batches, table, take)
        n = rd.verified_prefix(self._digester.verify_batch(merged))
        if n < merged.num_rows:
            self._stripe_reads_ok = False
            if n == 0:
                return None
            merged = merged.slice(0, n)
        return merged

    def _fragment_end(self, entry_id: int) -> int:
        later = [f for f, _ in self.metadata.ensembles if f > entry_id]
        return (min(later) - 1) if later else 1 << 62

    def _start_run(self, e: int, last: int, max_bytes: int | None) -> "_RunRead":
        """Ask the first replica (``read_decisions.replica_order``: round robin
        over the write set) for [e, last]."""
        md = self.metadata
        ensemble = md.ensemble_for(e)
        last = min(last, self._fragment_end(e))
        self._rr += 1
        run = _RunRead(e, last, max_bytes, ensemble,
                       rd.ReplicaRun(rd.replica_order(e, len(ensemble), md.write_quorum, self._rr)))
        self._launch(run, run.choice.next_replica())
        return run

    def _launch(self, run: "_RunRead", slot: int | None) -> None:
        if slot is None:
            return
        b = run.ensemble[slot]
        f = self._ask(b, run.first, run.last, max_entries=run.last - run.first + 1,
                      max_bytes=run.max_bytes or self.ctx.conf.read_batch_bytes)
        run.pending[f] = b

    def _finish_run(self, run: "_RunRead") -> pa.RecordBatch:
        """The first usable answer: a verified non-empty prefix from ``run.first``.
        Whom to ask next (a speculative read when a replica is silent past
        the delay, the next one when all asked failed) and what it means when
        none answered usably are ``read_decisions.ReplicaRun``'s decisions."""
        conf = self.ctx.conf
        spec = conf.speculative_read_timeout_ms / 1000.0 if conf.speculative_read_timeout_ms else None
        e, choice, pending = run.first, run.choice, run.pending
        last_exc: BaseException | None = None
        while pending:
            done, _ = cf.wait(list(pending), timeout=choice.wait_limit(spec),
                              return_when=cf.FIRST_COMPLETED)
            if not done:
                self._launch(run, choice.on_silence())  # speculative read to the next replica
                continue
            for f in done:
                bookie = pending.pop(f)
                exc = f.exception()
                if exc is None:
                    good = self._verified_prefix(f.result().batch, e)
                    if good is not None:
                        return good
                    kind = rd.CORRUPT
                else:
                    last_exc = exc
                    if isinstance(exc, errors.Unauthorized):
                        raise exc
                    if isinstance(exc, errors.BookieUnavailable):
                        self.ctx.transports.invalidate(bookie)
                    kind = rd.answer_kind(exc)
                self._launch(run, choice.on_answer(kind))
        verdict = choice.verdict
        if verdict == rd.BAD_DIGEST_ALL:
            raise errors.BadDigest("every replica is corrupt", ledger_id=self.ledger_id, entry_id=e)
        if verdict == rd.MISSING:
            raise errors.NoSuchEntry(ledger_id=self.ledger_id, entry_id=e)
        if verdict == rd.BAD_DIGEST:
            raise errors.BadDigest("no intact replica", ledger_id=self.ledger_id, entry_id=e)
        if isinstance(last_exc, errors.MetadataError):
            raise last_exc      # no replica could even be asked: etcd is the cause
        raise errors.ReadError(f"read failed on every replica: {last_exc}",
                               ledger_id=self.ledger_id, entry_id=e)

    def _verified_prefix(self, batch: pa.RecordBatch | pa.Table, e: int
                         ) -> pa.RecordBatch | pa.Table | None:
        """``read_decisions.usable_prefix`` of an answer for ids from ``e``."""
        return verified_prefix(batch, e, self._digester)


def verified_prefix(batch: pa.RecordBatch | pa.Table, e: int, digester: Digester
                    ) -> pa.RecordBatch | pa.Table | None:
    """The usable rows of an answer for ids from ``e`` (the rule:
    ``read_decisions.usable_prefix``), or None if there are none."""
    first = int(batch.column("entry_id")[0].as_py()) if batch.num_rows else None
    n = rd.usable_prefix(first, e, lambda: digester.verify_batch(batch))
    if n == 0:
        return None
    return batch if n == batch.num_rows else batch.slice(0, n)


SLICE_GATHER_MAX_ROWS = 256


def _gather(batches: list[pa.RecordBatch], table: pa.Table, rows: np.ndarray,
            slice_max_rows: int = SLICE_GATHER_MAX_ROWS) -> pa.RecordBatch | pa.Table:
    """Rows ``rows`` (positions in ``table``, the concatenation of ``batches``),
    in that order.  ``Table.take`` copies every payload twice (it concatenates
    the chunks, then takes); a window of few rows (large entries: Spark logs
    write ~0.5-1 MiB entries) comes as a table of zero-copy row slices, which
    ``read_batches`` copies once into one batch unless its caller takes
    tables."""
    if len(rows) > slice_max_rows:
        return one_batch(table.take(pa.array(rows)))
    starts = np.cumsum([0] + [b.num_rows for b in batches[:-1]])
    chunk = np.searchsorted(starts, rows, side="right") - 1
    pieces = [batches[c].slice(r, 1) for c, r in zip(chunk.tolist(), (rows - starts[chunk]).tolist())]
    return pa.Table.from_batches(pieces, schema=table.schema)


class _Window:
    """A read window in flight: entries [first, last]; ``finish()`` waits
    for it and returns a verified, non-empty prefix from ``first``;
    ``cancel()`` drops its outstanding requests."""
    __slots__ = ("first", "last", "finish", "cancel")

    def __init__(self, first: int, last: int, finish: Callable[[], pa.RecordBatch],
                 cancel: Callable[[], None]) -> None:
        self.first, self.last, self.finish, self.cancel = first, last, finish, cancel


def _cancel_all(futures: Iterable[Future[ReadResult]]) -> None:
    """Cancel requests nobody will wait for (the transport stops the call)."""
    for f in futures:
        f.cancel()


@dataclasses.dataclass
class _RunRead:
    """[first, last] asked of the replicas of one write set (``choice``
    decides whom and what their answers mean); ``pending``: request ->
    bookie."""
    first: int
    last: int
    max_bytes: int | None
    ensemble: tuple[str, ...]
    choice: rd.ReplicaRun
    pending: dict[Future[ReadResult], str] = dataclasses.field(default_factory=dict)
