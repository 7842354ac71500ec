"""Which entries each bookie of a fragment must hold, as numpy id arrays.

Theory of operation
-------------------
In a fragment [first, last] with ensemble size E and write quorum Qw, entry
``e`` lives on the slots ``write_set(e)`` = (e % E, ..., e % E + Qw - 1) mod E
(``protocol.distribution.holds`` says which ids a slot holds).  Everything
here is vectorised over id arrays (no per-entry Python loops):

* ``slot_entries``   ids a slot must hold;
* ``runs``           ascending ids -> [(start, end)] of consecutive runs (the
                     unit a bookie read answers);
* ``next_source``    for the ids still to copy, the untried surviving slot
                     holding most of them (re-replication reads from it first,
                     then falls back to the next one for whatever is left);
* ``ReplicaSources`` that order for one lost slot, as both copy paths (the
                     client's and bookie to bookie) walk it: the lost bookie
                     itself first when it is still up, then ``next_source``;
* ``copies_per_entry`` / ``under_replicated``  the replicas check of
                     ``--verify``: count, per entry, the slots that returned it.

Pure: numpy and the protocol's distribution; no I/O, no clock.
"""
from __future__ import annotations

from typing import Iterable, Mapping

import numpy as np

from pybk_spark.protocol.distribution import holds


def fragment_ids(first: int, last: int) -> np.ndarray:
    if last < first:
        return np.empty(0, np.int64)
    return np.arange(first, last + 1, dtype=np.int64)


def slot_entries(first: int, last: int, ensemble_size: int, write_quorum: int,
                 slot: int) -> np.ndarray:
    ids = fragment_ids(first, last)
    return ids[holds(ids, ensemble_size, write_quorum, slot)]


def runs(ids: np.ndarray) -> list[tuple[int, int]]:
    """Ascending unique ids -> [(start, end)] of consecutive runs."""
    ids = np.asarray(ids, dtype=np.int64)
    if len(ids) == 0:
        return []
    breaks = np.flatnonzero(np.diff(ids) != 1) + 1
    starts = ids[np.concatenate(([0], breaks))]
    ends = ids[np.concatenate((breaks - 1, [len(ids) - 1]))]
    return [(int(a), int(b)) for a, b in zip(starts, ends)]


def ranges_text(ids: np.ndarray, limit: int = 8) -> str:
    """Compact '0-4,7,9-12' rendering (for reports)."""
    parts = [f"{a}" if a == b else f"{a}-{b}" for a, b in runs(ids)]
    if len(parts) > limit:
        parts = parts[:limit] + [f"... ({len(parts) - limit} more runs)"]
    return ",".join(parts)


def next_source(remaining: np.ndarray, ensemble_size: int, write_quorum: int,
                excluded_slots: Iterable[int]) -> tuple[int, np.ndarray] | None:
    """The slot outside ``excluded_slots`` that holds most of ``remaining``
    (lowest slot on ties), with the ids it holds; None if no slot holds any."""
    excluded = set(excluded_slots)
    best: tuple[int, np.ndarray] | None = None
    for slot in range(ensemble_size):
        if slot in excluded:
            continue
        held = remaining[holds(remaining, ensemble_size, write_quorum, slot)]
        if len(held) and (best is None or len(held) > len(best[1])):
            best = (slot, held)
    return best


class ReplicaSources:
    """Where to read a lost slot's ids from, one source at a time: the lost
    slot itself first when ``lost_first`` (a decommissioned bookie is still
    up and holds them all), then ``next_source`` over the slots not tried.
    ``next(remaining)`` gives (slot, the ids to ask it for), or None when
    nothing remains or no untried slot holds any of it."""

    def __init__(self, ensemble_size: int, write_quorum: int, lost_slot: int,
                 lost_first: bool):
        self.ensemble_size, self.write_quorum = ensemble_size, write_quorum
        self.lost_slot = lost_slot
        self._lost_next = lost_first
        self.tried: set[int] = set()

    def next(self, remaining: np.ndarray) -> tuple[int, np.ndarray] | None:
        if not len(remaining):
            return None
        if self._lost_next:
            self._lost_next = False
            slot, ids = self.lost_slot, remaining
        else:
            nxt = next_source(remaining, self.ensemble_size, self.write_quorum,
                              self.tried | {self.lost_slot})
            if nxt is None:
                return None
            slot, ids = nxt
        self.tried.add(slot)
        return slot, ids


def copies_per_entry(first: int, last: int, present_by_slot: Mapping[int, np.ndarray]) -> np.ndarray:
    """Per id of [first, last], how many slots reported it present."""
    ids = fragment_ids(first, last)
    counts = np.zeros(len(ids), np.int64)
    for present in present_by_slot.values():
        present = np.asarray(present, dtype=np.int64)
        present = present[(present >= first) & (present <= last)]
        np.add.at(counts, present - first, 1)
    return counts


def under_replicated(first: int, last: int, ensemble_size: int, write_quorum: int,
                     present_by_slot: Mapping[int, np.ndarray]) -> dict[int, np.ndarray]:
    """slot -> ids it should hold but did not report (only slots with gaps).
    Ids reported by a slot outside their write set are ignored."""
    out = {}
    for slot in range(ensemble_size):
        want = slot_entries(first, last, ensemble_size, write_quorum, slot)
        have = np.asarray(present_by_slot.get(slot, np.empty(0, np.int64)), dtype=np.int64)
        missing = np.setdiff1d(want, have, assume_unique=True)
        if len(missing):
            out[slot] = missing
    return out
