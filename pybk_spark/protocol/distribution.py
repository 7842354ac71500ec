"""Round-robin distribution: write sets, ack quorums and quorum coverage.

Theory of operation
-------------------
A ledger fragment has an ensemble of E bookies (slots 0..E-1).  Entry ``e`` is
written to its *write set*: the Qw slots starting at ``e % E`` (wrapping).
There are therefore exactly E distinct write quorums, one per start slot.

* Ack quorum: an entry is durable once Qa slots of its write set acked it.
* Coverage (BookKeeper's RRQuorumCoverageSet): a set of slots that *answered*
  covers the ensemble when every one of the E write quorums holds at least
  (Qw - Qa) + 1 answering slots.  Then no write quorum has Qa slots left that
  did not answer, so an old writer can no longer reach Qa anywhere (fencing),
  and the highest LAC among the answers bounds every acknowledged entry.
  "Answered" includes NoSuchLedger / NoSuchEntry; errors and silence do not.
* Holders: ``holds`` says which of many entries a slot holds (vectorised,
  from the E distinct write sets); every writer, resend and re-replication
  mask is this one.

Recovery's "entry missing" ((Qw - Qa) + 1 NoSuchEntry of the entry's write
set) is ``recovery.EntryProbe``'s rule.

Pure arithmetic: no I/O, no clock, no threads.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from functools import lru_cache
from typing import Iterable

import numpy as np


def write_set(entry_id: int, ensemble_size: int, write_quorum: int) -> tuple[int, ...]:
    """Slots holding ``entry_id``: Qw slots starting at entry_id % E."""
    start = entry_id % ensemble_size
    return tuple((start + i) % ensemble_size for i in range(write_quorum))


@lru_cache(maxsize=256)
def _holder_by_start(ensemble_size: int, write_quorum: int, slot: int) -> np.ndarray:
    """Indexed by ``e % E``: whether ``slot`` is in ``write_set(e)``."""
    table = np.array([slot in write_set(r, ensemble_size, write_quorum)
                      for r in range(ensemble_size)], dtype=bool)
    table.flags.writeable = False
    return table


def holds(entry_ids: np.ndarray, ensemble_size: int, write_quorum: int,
          slot: int) -> np.ndarray:
    """Mask: which of ``entry_ids`` (an integer array) have ``slot`` in their
    write set."""
    mask: np.ndarray = _holder_by_start(ensemble_size, write_quorum, slot)[
        np.asarray(entry_ids) % ensemble_size]
    return mask


def write_quorums(ensemble_size: int, write_quorum: int) -> list[tuple[int, ...]]:
    """The E distinct write quorums of an ensemble (one per start slot)."""
    return [write_set(s, ensemble_size, write_quorum) for s in range(ensemble_size)]


def coverage_threshold(write_quorum: int, ack_quorum: int) -> int:
    return write_quorum - ack_quorum + 1


def is_covered(ensemble_size: int, write_quorum: int, ack_quorum: int,
               answered: Iterable[int]) -> bool:
    """True iff every write quorum holds >= (Qw-Qa)+1 answering slots."""
    got = set(answered)
    need = coverage_threshold(write_quorum, ack_quorum)
    return all(sum(1 for s in q if s in got) >= need
               for q in write_quorums(ensemble_size, write_quorum))


@dataclass
class AckSet:
    """Acks for one entry: complete once ``ack_quorum`` distinct slots of the
    write set acked.  Slots outside the write set are ignored."""

    write_set: tuple[int, ...]
    ack_quorum: int
    acked: set[int] = field(default_factory=set)

    def ack(self, slot: int) -> bool:
        if slot in self.write_set:
            self.acked.add(slot)
        return self.complete

    def forget(self, slot: int) -> None:
        self.acked.discard(slot)

    @property
    def complete(self) -> bool:
        return len(self.acked) >= self.ack_quorum
