"""The steps of a writer's ensemble change that need none of its state.

``LedgerWriter._run_change`` drives a change: the core
(``protocol.pending_adds``) decided which slots to replace and from which
entry; this module does the parts that only read the client and metadata:

* ``replace_by_cas``: picks a replacement for every slot of the change
  (placement policy; never a bookie that failed a request of this ledger,
  nor one replacing another slot of the same change) and CASes
  ``replace_bookies`` through ``store.update``, which re-reads and
  re-decides on conflict.  An ensemble that someone else changed fences the
  writer (a recovery writer: ``RecoveryRaced``, that recovery starts over);
  a ledger that is no longer OPEN (IN_RECOVERY for a recovery writer)
  raises.  Returns the new metadata and the add limits of its ensemble.
* ``change_failure``: the error a failed change aborts the writer with
  (adds were sent, so a missing replacement is an unknown outcome).
* ``HeldChunk`` / ``resend_parts``: what the writer holds until released,
  and which part of it goes to which replaced slots after the change.
"""
from __future__ import annotations

from collections.abc import Collection, Iterator
from dataclasses import dataclass

import pyarrow as pa

from pybk_spark import errors
from pybk_spark.ledger.context import ClientContext
from pybk_spark.ledger.placement import writable_bookies
from pybk_spark.metadata.store import ledger_key
from pybk_spark.protocol import add_admission as admission
from pybk_spark.protocol import ledger_metadata as lm
from pybk_spark.protocol.pending_adds import EnsembleChange, Resend
from pybk_spark.transport.base import LoneEntry
from pybk_spark.wire.entries import records_to_batch


@dataclass
class HeldChunk:
    """Entries [first, last] sent together, held until released: what a
    change resends (``batch`` None: a lone add, held as ``lone``)."""
    first: int
    last: int
    batch: pa.RecordBatch | None
    nbytes: int = 0
    lone: LoneEntry | None = None

    def rows(self) -> pa.RecordBatch:
        """The chunk's entries as a batch (a lone add's decoded for a resend)."""
        if self.batch is None:
            assert self.lone is not None
            self.batch = records_to_batch([self.lone.head + self.lone.payload])
        return self.batch


def resend_parts(chunks: list[HeldChunk], resends: list[Resend]
                 ) -> Iterator[tuple[pa.RecordBatch, set[int]]]:
    """What the core's resends name: for each range, the part of every held
    chunk inside it, with the slots resending that range (the writer's slot
    filter keeps each bookie's own ids)."""
    by_range: dict[tuple[int, int], set[int]] = {}
    for r in resends:
        by_range.setdefault((r.first, r.last), set()).add(r.slot)
    for (first, last), slots in by_range.items():
        for ch in chunks:
            lo, hi = max(first, ch.first), min(last, ch.last)
            if lo > hi:
                continue
            rows = ch.rows()
            part = rows if (lo, hi) == (ch.first, ch.last) else \
                rows.slice(lo - ch.first, hi - lo + 1)
            yield part, slots


def replace_by_cas(ctx: ClientContext, ledger_id: int, change: EnsembleChange,
                   failed: Collection[str], *, recovery: bool
                   ) -> tuple[lm.LedgerMetadata, admission.AddLimits]:
    """Replace ``change.slots`` in the ledger's metadata by CAS; ``failed``:
    the bookies that failed a request of this ledger."""
    store = ctx.metadata_store
    policy = ctx.placement
    for _ in range(ctx.conf.metadata_retries):
        bookies = writable_bookies(store)
        exclude = {b: "failed a request of this ledger" for b in failed}
        repl: dict[int, str] = {}
        ens = list(change.ensemble)
        for slot in change.slots:
            b = policy.replace(tuple(ens), slot, bookies, exclude={
                **exclude, **{r: "replaces another bookie of this change"
                              for r in repl.values()}})
            repl[slot] = b
        by_writer = not recovery

        def transform(raw: bytes) -> bytes:
            md = lm.LedgerMetadata.from_json(raw)
            if md.current_ensemble != change.ensemble:
                raise _Stale()
            return lm.replace_bookies(md, change.first_entry, repl, by_writer=by_writer).to_json()  # noqa: B023
        try:
            raw, _version = store.update(ledger_key(ledger_id), transform)
        except _Stale:
            if recovery:        # a concurrent recovery: this one starts over
                raise errors.RecoveryRaced("ledger ensemble changed by another recovery",
                                           ledger_id=ledger_id) from None
            raise errors.LedgerFenced("ledger ensemble changed by someone else",
                                      ledger_id=ledger_id) from None
        except errors.IllegalOp:
            if by_writer:
                raise
            md = ctx.ledger_metadata(ledger_id)     # NoSuchLedger if deleted
            if md.state != lm.IN_RECOVERY:
                raise errors.LedgerFenced("ledger no longer in recovery", ledger_id=ledger_id) from None
            continue
        new_md = lm.LedgerMetadata.from_json(raw)
        limits = admission.limits(ctx.conf.max_entry_size_bytes, ctx.conf.max_message_bytes,
                                  [bookies.get(b, {}) for b in new_md.current_ensemble])
        return new_md, limits
    raise errors.MetadataVersion("too many retries of an ensemble change")


def change_failure(exc: Exception, ledger_id: int,
                   last_bookie_error: BaseException | None) -> errors.BKError:
    """The error a writer whose change failed with ``exc`` aborts with;
    ``last_bookie_error`` is named when no replacement was found."""
    if isinstance(exc, errors.NotEnoughBookies):
        # adds were sent: some bookies may hold them (unknown outcome)
        why = (f"; last bookie error: {type(last_bookie_error).__name__}: {last_bookie_error}"
               if last_bookie_error else "")
        return errors.unknown_outcome(errors.NotEnoughBookies(
            f"ensemble change failed: {exc}{why}", ledger_id=ledger_id))
    if isinstance(exc, errors.BKError):
        if not exc.outcome_known or isinstance(exc, errors.RecoveryRaced):
            return exc
        return errors.LedgerFenced(f"ensemble change failed: {exc}", ledger_id=ledger_id)
    return errors.LedgerFenced(f"ensemble change failed: {exc!r}", ledger_id=ledger_id)


class _Stale(Exception):
    """The ensemble in metadata is no longer the one the change was decided against."""
