"""Fencing open: recover an OPEN/IN_RECOVERY ledger and close it.

Theory of operation (pure decisions in ``protocol.recovery`` and
``protocol.read_decisions``; dependencies from the ``ClientContext``)
----------------------------------------------------------------------
1. CAS the metadata to IN_RECOVERY (``to_in_recovery``; a writer's later
   ensemble change or close then fails).
2. Fenced ReadLac to every bookie of the last fragment (the readers' LAC
   query, ``lac_query.read_lac_coverage``, with ``fence=True``); stop
   waiting as soon as the answers cover the ensemble (#1067); LAC only from
   fenced answers (#2614).
3. start = max(LAC, last fragment first - 1) (#2615); last fragment first - 1
   if an earlier recovery replaced writer bookies there (``lm.
   recovery_replaced_tail``: those ids must reach the replacements).  Probe ids > start:
   each bookie of the id's write set is asked for the run from that id (the
   rows returned also settle later ids) with a FENCING read: a bookie that
   answered NoSuchEntry can no longer accept that id (TLA+ defect 1).  Where
   an earlier recovery replaced the writer's bookie of a slot, both are
   asked, and the slot counts as "no" only if both say so
   (``lm.recovery_read_bookies``; the writer's ensemble is recorded by step 1).
   An answer's rows count only as their verified prefix from the id
   (``read_decisions.usable_prefix``); the probe stops waiting once settled
   (``EntryProbe.settled``: an answer that already arrived is read first,
   since a positive one wins).  EXISTS -> keep the row; MISSING -> stop;
   UNRECOVERABLE -> LedgerRecoveryError (retry later).
4. Report the decision (``rc.RecoveryDecision``: start and the last found
   id) to the client's ``recovery_listener``, if any, before re-writing:
   a recovery that loses the close race (or dies) leaves its re-writes
   beyond the converged close, and the chaos checker must be able to tell
   those copies from a write through a fence.
5. Re-write every found entry to its whole write set with recovery adds
   through ``LedgerWriter(recovery=True)`` (ensemble changes allowed while
   IN_RECOVERY), rows unchanged (LAC, length, digest as the writer made
   them), and wait for Qa acks of each.
6. CAS CLOSED at the last found id with the ``length`` that entry carries
   (nothing found after ``start``: the length of entry ``start``, read back;
   start -1: 0) (``close_by_recovery``: if another recoverer closed first,
   its value stands: all converge).  If a concurrent
   recovery changed the ensemble after this one read it, this one's
   re-writes may sit on bookies the metadata no longer names: it starts over
   (``RecoveryRaced``, at most ``RACE_RETRIES`` times).
7. A recovery that fails (``LedgerRecoveryError``: a bookie lost while
   re-writing, an entry it cannot read) re-reads the metadata: if another
   recoverer or the writer closed the ledger meanwhile, that close is the
   answer (all converge on the first close); otherwise the error stands.
"""
from __future__ import annotations

import concurrent.futures as cf
from concurrent.futures import Future
from typing import Iterable, Iterator

import pyarrow as pa

from pybk_spark import errors
from pybk_spark.ledger.context import ClientContext
from pybk_spark.wire.digest import Digester
from pybk_spark.ledger.ledger_writer import LedgerWriter, Waiter
from pybk_spark.metadata.store import ledger_key
from pybk_spark.protocol import ledger_metadata as lm
from pybk_spark.protocol import read_decisions as rd
from pybk_spark.protocol import recovery as rc
from pybk_spark.ledger.lac_query import read_lac_coverage
from pybk_spark.ledger.read_handle import ReadHandle, verified_prefix
from pybk_spark.wire.entries import one_batch
from pybk_spark.wire.results import ReadResult

RACE_RETRIES = 5


def recover(ctx: ClientContext, md: lm.LedgerMetadata, password: bytes) -> ReadHandle:
    for _attempt in range(RACE_RETRIES):
        try:
            return _recover_once(ctx, md, password)
        except errors.RecoveryRaced:
            md = ctx.ledger_metadata(md.ledger_id)      # NoSuchLedger if deleted meanwhile
        except errors.LedgerRecoveryError:
            closed = _closed_meanwhile(ctx, md.ledger_id)
            if closed is None:
                raise
            return ReadHandle(ctx, closed, password, closed.last_entry_id)
    raise errors.LedgerRecoveryError("concurrent recoveries kept changing the ensemble",
                                     ledger_id=md.ledger_id)


def _closed_meanwhile(ctx: ClientContext, ledger_id: int) -> lm.LedgerMetadata | None:
    """After this recovery failed: the ledger's metadata if someone else (a
    concurrent recovery, the writer) closed it meanwhile.  Every recovery
    converges on the first close, so that close is this open's answer too."""
    try:
        md = ctx.ledger_metadata(ledger_id)
    except errors.BKError:
        return None
    return md if md.is_closed else None


def _recover_once(ctx: ClientContext, md: lm.LedgerMetadata, password: bytes) -> ReadHandle:
    store = ctx.metadata_store
    key = lm.master_key(password)
    if md.is_closed:
        return ReadHandle(ctx, md, password, md.last_entry_id)
    raw, _ = store.update(ledger_key(md.ledger_id),
                          lambda r: lm.to_in_recovery(lm.LedgerMetadata.from_json(r)).to_json())
    md = lm.LedgerMetadata.from_json(raw)
    if md.is_closed:
        return ReadHandle(ctx, md, password, md.last_entry_id)

    max_lac = fence_and_read_lac(ctx, md, key)
    start = rc.recovery_start(max_lac, md.last_fragment_first_entry,
                              lm.recovery_replaced_tail(md))
    rows = read_forward(ctx, md, key, Digester(md.digest_type, password), start)
    last = start + (rows.num_rows if rows is not None else 0)
    listener = ctx.recovery_listener
    if listener is not None:
        listener(rc.RecoveryDecision(md.ledger_id, start, last))
    length = closing_length(ctx, md, password, start, rows)
    if last > start:
        md = rewrite(ctx, md, key, start, rows)
    wrote_through = md.ensembles
    raw, _ = store.update(ledger_key(md.ledger_id), lambda r: lm.close_by_recovery(
        lm.LedgerMetadata.from_json(r), last, length, wrote_through).to_json())
    md = lm.LedgerMetadata.from_json(raw)
    return ReadHandle(ctx, md, password, md.last_entry_id)


def fence_and_read_lac(ctx: ClientContext, md: lm.LedgerMetadata, key: bytes) -> int:
    """Step 2: the readers' LAC query with fenced reads; the max LAC of the
    fenced answers (-1 if none carried one) once they cover the ensemble."""
    phase = read_lac_coverage(ctx, md, key, fence=True)
    if not phase.covered:
        raise errors.LedgerRecoveryError("could not fence enough bookies",
                                         ledger_id=md.ledger_id, answered=len(phase.answered))
    return phase.max_lac


def read_forward(ctx: ClientContext, md: lm.LedgerMetadata, key: bytes, digester: Digester,
                 start: int) -> pa.RecordBatch | None:
    """Rows of every existing entry after ``start`` up to the first missing."""
    ensemble = md.current_ensemble
    E, Qw, Qa = len(ensemble), md.write_quorum, md.ack_quorum
    batch_n = max(1, ctx.conf.read_batch_entries)
    known_upto = start
    pieces: list[pa.RecordBatch] = []
    e = start + 1
    while True:
        if e <= known_upto:
            e += 1
            continue
        probe = rc.EntryProbe(e, E, Qw, Qa)
        futs: dict[Future[ReadResult], int] = {}
        slot_answers: dict[int, rc.SlotAnswers] = {}
        for s in probe.slots:
            holders = lm.recovery_read_bookies(md, s)
            slot_answers[s] = rc.SlotAnswers(len(holders))
            for b in holders:
                futs[ctx.transports.get(b).read(
                    md.ledger_id, e, e + batch_n - 1, max_entries=batch_n, master_key=key,
                    fence=True, timeout=ctx.conf.read_timeout_s)] = s
        best: pa.RecordBatch | None = None
        seen: set[Future[ReadResult]] = set()
        for f in _completed_preferring_done(futs):
            if f in seen:
                continue
            seen.add(f)
            slot = futs[f]
            exc = f.exception()
            kind = rd.answer_kind(exc)
            if exc is None:
                good = verified_prefix(f.result().batch, e, digester)
                if good is None:
                    kind = rd.ERROR
                elif best is None or good.num_rows > best.num_rows:
                    best = good
            before = slot_answers[slot].verdict
            verdict = slot_answers[slot].on_answer(kind)
            if verdict is not None and before is None:
                probe.on_answer(slot, verdict)
            # never wait for the other replicas once settled (a hung one would
            # block), but an answer that already arrived is read first
            if probe.settled(any(g.done() and g.exception() is None and g not in seen
                                 for g in futs)):
                break
        status = probe.status
        if status == rc.MISSING:
            break
        if status != rc.EXISTS:
            raise errors.LedgerRecoveryError("cannot decide whether an entry exists",
                                             ledger_id=md.ledger_id, entry_id=e)
        # EXISTS: some replica answered with a verified entry e, kept in best
        assert best is not None, "EXISTS without a verified answer"
        pieces.append(best)
        known_upto = e + best.num_rows - 1
        e = known_upto + 1
    if not pieces:
        return None
    return one_batch(pa.Table.from_batches(pieces))


def closing_length(ctx: ClientContext, md: lm.LedgerMetadata, password: bytes, start: int,
                   rows: pa.RecordBatch | None) -> int:
    """The ledger's length at its recovered end: the cumulative ``length``
    the last found entry carries; if none was found after ``start``, that of
    entry ``start`` (acknowledged, so readable: one read); 0 for an empty
    ledger."""
    if rows is not None and rows.num_rows:
        return int(rows.column("length")[rows.num_rows - 1].as_py())
    if start < 0:
        return 0
    try:
        got = ReadHandle(ctx, md, password, start).read(start, start)
    except errors.BKError as exc:
        raise errors.LedgerRecoveryError(f"cannot read entry {start} for the ledger's length: "
                                         f"{exc}", ledger_id=md.ledger_id) from exc
    return got[0].length


def rewrite(ctx: ClientContext, md: lm.LedgerMetadata, key: bytes, start: int,
            rows: pa.RecordBatch) -> lm.LedgerMetadata:
    """Recovery adds of ``rows`` (ids start+1..) to their whole write sets.
    Returns the metadata as this recovery left it (its own ensemble changes)."""
    writer = LedgerWriter(ctx, md, key, recovery=True, last_released=start)
    first, _lac, _length = writer.assign(rows.num_rows)
    assert first == start + 1
    fut: Future[None] = Future()
    writer.submit(rows, Waiter(start + rows.num_rows, fut, lambda: None))
    try:
        fut.result()
    except errors.RecoveryRaced:
        raise
    except errors.BKError as exc:
        raise errors.LedgerRecoveryError(f"recovery adds failed: {exc}",
                                         ledger_id=md.ledger_id) from exc
    return writer.md


def _completed_preferring_done(futs: Iterable[Future[ReadResult]]
                               ) -> Iterator[Future[ReadResult]]:
    """Already-finished futures first (deterministic order), then as they finish."""
    done = [f for f in futs if f.done()]
    yield from done
    rest = [f for f in futs if f not in done]
    if rest:
        yield from cf.as_completed(rest)
