"""The writer's pending-add state machine (BookKeeper PendingAddOp + the
ensemble-change half of LedgerHandle), with no I/O.

Theory of operation
-------------------
Inputs: ``assign`` (new entries), ``on_ack`` / ``on_failure`` (bookie answers),
``commit_change`` / ``abort`` (outcome of the metadata CAS done by the caller).
Outputs: entry ids released to the application (always ascending, gap-free),
``EnsembleChange`` decisions, and ``Send`` actions (entries to (re)send).

Ordering obligations:
  * An entry is released only when Qa slots of its write set acked it AND all
    lower ids were released; LAC = the last released id.
  * Acks are counted per (slot, bookie id): an ack from a bookie that no
    longer holds the slot is ignored.
  * ``on_failure`` decides the change in ONE step (BookKeeper #4651): the
    fragment boundary is the first entry not yet released at that moment,
    the failed slot's acks for pending entries are forgotten and further acks
    from it are ignored.
  * While a change is pending nothing is released (BookKeeper #1591): an ack
    may only be released through an ensemble that is durable in metadata.
    ``commit_change`` (after the CAS succeeded) installs the new ensemble,
    returns the resends to the replacements and releases what is complete.
  * More failures during a pending change are queued and decided after it.
"""
from __future__ import annotations

from dataclasses import dataclass

from pybk_spark.protocol.distribution import AckSet, write_quorums


@dataclass(frozen=True)
class EnsembleChange:
    first_entry: int                 # new fragment starts here (first unreleased id)
    slots: tuple[int, ...]           # slots to replace
    ensemble: tuple[str, ...]        # ensemble the decision was made against


@dataclass(frozen=True)
class Send:
    entry_id: int
    slot: int
    bookie: str


class PendingAdds:
    def __init__(self, write_quorum: int, ack_quorum: int, ensemble: tuple[str, ...],
                 last_released: int = -1):
        self.write_quorum = write_quorum
        self.ack_quorum = ack_quorum
        self.ensemble = tuple(ensemble)
        self._write_sets: list[tuple[int, ...]] | None = None
        self.lac = last_released
        self.next_entry_id = last_released + 1
        self.pending: dict[int, AckSet] = {}
        self.change: EnsembleChange | None = None
        self._queued: set[int] = set()

    # -- derived ------------------------------------------------------------------
    @property
    def ensemble_size(self) -> int:
        return len(self.ensemble)

    @property
    def unavailable_slots(self) -> set[int]:
        out = set(self._queued)
        if self.change is not None:
            out.update(self.change.slots)
        return out

    def write_set(self, entry_id: int) -> tuple[int, ...]:
        # only E distinct write sets exist; computed once (hot path)
        sets = self._write_sets
        if sets is None or len(sets) != len(self.ensemble):
            sets = self._write_sets = write_quorums(len(self.ensemble), self.write_quorum)
        return sets[entry_id % len(sets)]

    # -- inputs ---------------------------------------------------------------------
    def assign(self, count: int) -> list[int]:
        """Allocate ``count`` consecutive entry ids (carrying LAC = self.lac)."""
        ids = list(range(self.next_entry_id, self.next_entry_id + count))
        for e in ids:
            self.pending[e] = AckSet(self.write_set(e), self.ack_quorum)
        self.next_entry_id += count
        return ids

    def targets(self, entry_id: int) -> list[Send]:
        """Where to send a freshly assigned entry now (skips slots being replaced)."""
        bad = self.unavailable_slots
        return [Send(entry_id, s, self.ensemble[s]) for s in self.write_set(entry_id)
                if s not in bad]

    def on_ack(self, entry_id: int, slot: int, bookie: str) -> list[int]:
        acks = self.pending.get(entry_id)
        if acks is None or self.ensemble[slot] != bookie or slot in self.unavailable_slots:
            return []
        acks.ack(slot)
        return self._release()

    def on_ack_range(self, first: int, last: int, slot: int, bookie: str) -> list[int]:
        """A bookie acknowledged the contiguous range [first, last]."""
        if self.ensemble[slot] != bookie or slot in self.unavailable_slots:
            return []
        for e in range(max(first, self.lac + 1), last + 1):
            acks = self.pending.get(e)
            if acks is not None:
                acks.ack(slot)
        return self._release()

    def on_failure(self, slot: int, bookie: str) -> EnsembleChange | None:
        """A bookie failed (error / timeout).  Returns the change to perform, or
        None (stale report, or queued behind a pending change)."""
        if self.ensemble[slot] != bookie or slot in self.unavailable_slots:
            return None
        if self.change is not None:
            self._queued.add(slot)
            return None
        return self._decide({slot})

    def commit_change(self, new_ensemble: tuple[str, ...]) -> tuple[list[int], list[Send], EnsembleChange | None]:
        """The CAS for ``self.change`` succeeded with ``new_ensemble``.
        Returns (released ids, resends, next change to perform or None)."""
        change = self.change
        assert change is not None, "no pending ensemble change"
        self.ensemble = tuple(new_ensemble)
        self.change = None
        replaced = set(change.slots)
        resends = [Send(e, s, self.ensemble[s]) for e in sorted(self.pending)
                   for s in self.write_set(e) if s in replaced and s not in self._queued]
        released = self._release()
        nxt = None
        if self._queued:
            nxt = self._decide(set(self._queued))
            self._queued.clear()
        return released, resends, nxt

    def abort(self) -> list[int]:
        """The ledger can no longer be written (fenced / closed / no bookies):
        every pending entry fails (outcome unknown).  Returns their ids."""
        ids = sorted(self.pending)
        self.pending.clear()
        self.change = None
        self._queued.clear()
        return ids

    # -- internals ------------------------------------------------------------------
    def _decide(self, slots: set[int]) -> EnsembleChange:
        boundary = self.lac + 1
        for e, acks in self.pending.items():
            for s in slots:
                acks.forget(s)
        self.change = EnsembleChange(boundary, tuple(sorted(slots)), self.ensemble)
        return self.change

    def _release(self) -> list[int]:
        if self.change is not None:
            return []
        out = []
        while True:
            acks = self.pending.get(self.lac + 1)
            if acks is None or not acks.complete:
                return out
            del self.pending[self.lac + 1]
            self.lac += 1
            out.append(self.lac)
