"""The writer's pending-add state machine (BookKeeper PendingAddOp + the
ensemble-change half of LedgerHandle), with no I/O.

Theory of operation
-------------------
Inputs: ``assign`` (new entries), the acks (``ack_one``: one id, the only
one-id path, which ``on_ack`` and a one-id ``on_ack_range`` take too;
``on_ack_range`` / ``on_ack_ids``: a batch's) and ``on_failure`` (bookie
answers), ``commit_change`` / ``abort`` (outcome of the metadata CAS done by
the caller).
Outputs: entry ids released to the application (always ascending, gap-free),
``EnsembleChange`` decisions, ``Send`` actions (where a new entry goes) and,
after a change, ``Resend`` ranges (per replaced slot: the unreleased ids it
must now receive; the writer sends exactly those parts of its batches).

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

Representation: pending entries are kept per assigned run (``_Run``: first id
plus an ``(n, E)`` boolean ack matrix), so assigning, acking and releasing a
1000-entry chunk are a handful of vectorised numpy steps, not 1000 Python
objects; a run of one id keeps its acks as an integer bit mask, so a
synchronous add costs a few integer operations.  An ack marks only slots of
the entry's own write set.
"""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass

import numpy as np

from pybk_spark.protocol.distribution import holds, write_quorums


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


@dataclass(frozen=True)
class Resend:
    """After an ensemble change: send the replacement ``bookie`` at ``slot``
    every entry of [first, last] whose write set holds ``slot`` (one range
    per slot, not one object per entry: a batching writer sends the parts of
    its batches that fall in the range)."""
    slot: int
    bookie: str
    first: int
    last: int
    ensemble_size: int
    write_quorum: int

    def entry_ids(self) -> np.ndarray:
        """The ids to resend (ascending)."""
        ids = np.arange(self.first, self.last + 1, dtype=np.int64)
        held: np.ndarray = ids[holds(ids, self.ensemble_size, self.write_quorum, self.slot)]
        return held


class _Run:
    """Consecutive ids [first, first + n) assigned together; ``acks[i, s]`` is
    True once slot s (of entry first+i's write set) acked it.  A run of one
    id (a synchronous add) keeps its acks as the bits of ``mask`` instead
    (``acks`` None): plain integer steps, no arrays, on the hot path."""

    __slots__ = ("first", "last", "acks", "mask")

    def __init__(self, first: int, count: int, ensemble_size: int):
        self.first = first
        self.last = first + count - 1
        self.acks: np.ndarray | None = (None if count == 1 else
                                        np.zeros((count, ensemble_size), dtype=bool))
        self.mask = 0


class PendingAdds:
    def __init__(self, write_quorum: int, ack_quorum: int, ensemble: tuple[str, ...],
                 last_released: int = -1):
        self.write_quorum = write_quorum
        self.ack_quorum = ack_quorum
        self.ensemble = tuple(ensemble)
        self._write_sets: list[tuple[int, ...]] | None = None
        self.lac = last_released
        self.next_entry_id = last_released + 1
        self._runs: deque[_Run] = deque()
        self.change: EnsembleChange | None = None
        self._queued: set[int] = set()

    # -- derived ------------------------------------------------------------------
    @property
    def ensemble_size(self) -> int:
        return len(self.ensemble)

    @property
    def pending(self) -> list[int]:
        """Ids assigned and not yet released (ascending)."""
        return [e for r in self._runs for e in range(max(r.first, self.lac + 1), r.last + 1)]

    @property
    def pending_count(self) -> int:
        return sum(r.last - max(r.first, self.lac + 1) + 1 for r in self._runs)

    @property
    def unavailable_slots(self) -> set[int]:
        out = set(self._queued)
        if self.change is not None:
            out.update(self.change.slots)
        return out

    def _slot_unavailable(self, slot: int) -> bool:    # ``unavailable_slots``, without a set
        return slot in self._queued or (self.change is not None and slot in self.change.slots)

    def write_set(self, entry_id: int) -> tuple[int, ...]:
        # only E distinct write sets exist; computed once (hot path)
        sets = self._write_sets
        if sets is None or len(sets) != len(self.ensemble):
            sets = self._write_sets = write_quorums(len(self.ensemble), self.write_quorum)
        return sets[entry_id % len(sets)]

    def holds(self, entry_ids: np.ndarray, slot: int) -> np.ndarray:
        """Mask: which of ``entry_ids`` have ``slot`` in their write set."""
        return holds(entry_ids, len(self.ensemble), self.write_quorum, slot)

    # -- inputs ---------------------------------------------------------------------
    def assign(self, count: int) -> list[int]:
        """Allocate ``count`` consecutive entry ids (carrying LAC = self.lac)."""
        first = self.assign_run(count)
        return list(range(first, first + count))

    def assign_run(self, count: int) -> int:
        """Like ``assign``, returning only the first id (hot path)."""
        first = self.next_entry_id
        self._runs.append(_Run(first, count, len(self.ensemble)))
        self.next_entry_id += count
        return first

    def target_slots(self, entry_id: int) -> tuple[int, ...]:
        """The slots of ``entry_id``'s write set to send it to now (skips
        slots being replaced): the cached write set itself when none is
        (hot path: a synchronous add)."""
        if not self._queued and self.change is None:
            return self.write_set(entry_id)
        return tuple(s for s in self.write_set(entry_id) if not self._slot_unavailable(s))

    def targets(self, entry_id: int) -> list[Send]:
        """Where to send a freshly assigned entry now (skips slots being replaced)."""
        return [Send(entry_id, s, self.ensemble[s]) for s in self.target_slots(entry_id)]

    def on_ack(self, entry_id: int, slot: int, bookie: str) -> list[int]:
        """``ack_one``, returning the ids it released."""
        start = self.lac
        self.ack_one(entry_id, slot, bookie)
        return list(range(start + 1, self.lac + 1))

    def on_ack_range(self, first: int, last: int, slot: int, bookie: str) -> list[int]:
        """A bookie acknowledged every id of [first, last] it holds."""
        if first == last:
            return self.on_ack(first, slot, bookie)
        if self.ensemble[slot] != bookie or self._slot_unavailable(slot):
            return []
        lo = max(first, self.lac + 1)
        for run in self._runs:
            a, b = max(lo, run.first), min(last, run.last)
            if a > b:
                continue
            if run.acks is None:        # a run of one id (a synchronous add)
                if slot in self.write_set(a):
                    run.mask |= 1 << slot
                continue
            if a == b:
                if slot in self.write_set(a):
                    run.acks[a - run.first, slot] = True
                continue
            ids = np.arange(a, b + 1)
            run.acks[a - run.first:b - run.first + 1, slot] |= self.holds(ids, slot)
        return self._release()

    def ack_one(self, entry_id: int, slot: int, bookie: str) -> None:
        """A bookie acknowledged one id (a lone add's answer; read ``lac``
        for what it released).  The hot path of a synchronous add: when no
        change is pending and the id is the oldest pending one, a run of its
        own, its ack is a bit set and a count, with no list built."""
        if entry_id <= self.lac or self.ensemble[slot] != bookie:
            return                      # a straggler's answer (Qw > Qa), or a stale bookie
        if self.write_quorum < len(self.ensemble) and slot not in self.write_set(entry_id):
            return
        runs = self._runs
        if self.change is not None or self._queued:
            if self._slot_unavailable(slot):
                return
        elif runs and (run := runs[0]).first == entry_id and run.acks is None:
            run.mask |= 1 << slot
            # every id below the oldest pending one is released, so only it
            # can move the LAC (a front run beyond LAC + 1 follows an abort)
            if run.mask.bit_count() >= self.ack_quorum and self.lac + 1 == entry_id:
                self.lac = entry_id
                runs.popleft()
                if runs:
                    self._advance()
            return
        for run in runs:
            if run.first <= entry_id <= run.last:
                if run.acks is None:
                    run.mask |= 1 << slot
                else:
                    run.acks[entry_id - run.first, slot] = True
                self._advance()
                return

    def on_ack_ids(self, entry_ids: np.ndarray, slot: int, bookie: str) -> list[int]:
        """A bookie acknowledged exactly ``entry_ids`` (ascending, any gaps)."""
        if self.ensemble[slot] != bookie or self._slot_unavailable(slot) or not len(entry_ids):
            return []
        ids = np.asarray(entry_ids, dtype=np.int64)
        ids = ids[(ids > self.lac) & self.holds(ids, slot)]
        for run in self._runs:
            lo, hi = np.searchsorted(ids, [run.first, run.last + 1])
            if lo < hi:
                if run.acks is None:
                    run.mask |= 1 << slot
                else:
                    run.acks[ids[lo:hi] - run.first, slot] = True
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

    def commit_change(self, new_ensemble: tuple[str, ...]
                      ) -> tuple[list[int], list[Resend], EnsembleChange | None]:
        """The CAS for ``self.change`` succeeded with ``new_ensemble``.
        Returns (released ids, resends, next change to perform or None).
        Resends: per replaced slot (not failed again meanwhile), every
        unreleased id whose write set holds it, as one ``Resend`` range."""
        change = self.change
        assert change is not None, "no pending ensemble change"
        self.ensemble = tuple(new_ensemble)
        self.change = None
        resends: list[Resend] = []
        first, last = self.lac + 1, self.next_entry_id - 1
        if self._runs and first <= last:
            resends = [Resend(s, self.ensemble[s], first, last, len(self.ensemble),
                              self.write_quorum)
                       for s in change.slots if s not in self._queued]
        released = self._release()
        nxt = None
        if self._queued:
            nxt = self._decide(set(self._queued))
            self._queued.clear()
        return released, resends, nxt

    @property
    def assigned_beyond_lac(self) -> bool:
        """Ids were handed out that were never released.  After an abort their
        adds have an unknown outcome: they may still land on bookies, so only
        fencing recovery may decide where the ledger ends."""
        return self.next_entry_id - 1 > self.lac

    def abort(self) -> list[int]:
        """The ledger can no longer be written (fenced / closed / no bookies):
        every pending entry fails (outcome unknown).  Returns their ids."""
        ids = self.pending
        self._runs.clear()
        self.change = None
        self._queued.clear()
        return ids

    # -- internals ------------------------------------------------------------------
    def _decide(self, slots: set[int]) -> EnsembleChange:
        boundary = self.lac + 1
        cols = sorted(slots)
        forget = ~sum(1 << c for c in cols)
        for run in self._runs:
            if run.acks is None:
                run.mask &= forget
            else:
                run.acks[:, cols] = False
        self.change = EnsembleChange(boundary, tuple(cols), self.ensemble)
        return self.change

    def _release(self) -> list[int]:
        """``_advance``, returning the ids it released."""
        start = self.lac
        self._advance()
        return list(range(start + 1, self.lac + 1))

    def _advance(self) -> None:
        """Move the LAC over every complete id (none while a change is pending)."""
        if self.change is not None:
            return
        runs = self._runs
        while runs:
            run = runs[0]
            if not run.first <= self.lac + 1 <= run.last:
                break                       # lac+1 was never assigned (after abort)
            if run.acks is None:                 # a run of one id (a synchronous add)
                if run.mask.bit_count() < self.ack_quorum:
                    break
                self.lac = run.last
                runs.popleft()
                continue
            offset = self.lac + 1 - run.first
            if offset == len(run.acks) - 1:      # one id left
                if np.count_nonzero(run.acks[offset]) < self.ack_quorum:
                    break
                self.lac = run.last
                runs.popleft()
                continue
            done = run.acks[offset:].sum(axis=1) >= self.ack_quorum
            incomplete = np.flatnonzero(~done)
            if len(incomplete):
                self.lac = run.first + offset + int(incomplete[0]) - 1
                break
            self.lac = run.last
            runs.popleft()
