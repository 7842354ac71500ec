"""What a bookie knows it lost: damaged journal records and stored batches.

Theory of operation
-------------------
A bookie that acknowledged an entry and then lost it to media damage must
neither serve damaged bytes nor answer NoSuchEntry as if it never had the
entry (protocol-pitfalls #3, #9: recovery would read that as "end of
ledger").  ``LostSet`` holds, per ledger, the id ranges it may have lost
(``last == OPEN``: every id above ``first``); ``Bookie.read`` answers
BookieIOError for an id in a lost range that is not stored (recovery counts
that as an error, never as "missing").  With ``unattributed`` damage (a
ledger none of whose records since the checkpoint survived cannot be named)
it also answers BookieIOError instead of NoSuchLedger, and instead of
NoSuchEntry for any id above a ledger's highest stored id.

Where the ranges come from:
  * Journal replay (``ReplayTracker``): the damaged record's body is
    unreadable, so the ranges are bounds.  At each damage point the tracker
    notes every ledger's highest stored id ``m``; per ledger then: ids above
    ``m`` up to the highest id replayed after the damage that are not
    stored (gaps), and for a ledger replayed before the damage but not after
    it, every id above ``m`` (``OPEN``: its tail may be in the damaged bytes).
    Ranges may include ids the bookie never held (a striped ensemble,
    E > Qw): the auditor keeps only the bookie's write-set ids.  Damage also
    sets ``unattributed``.
  * The scrubber (``scrubber.py``, ``quarantine``): a stored batch that
    fails its checks is taken out of the index, its rows whose digests still
    match are re-stored; the ids of the others are exact.

Publication (``sync_marker``): the set is published under
``bookies/damaged/<bookie_id>`` (format and rules:
``pybk_spark/protocol/damage_marker.py``).  New
damage is merged into the marker by CAS; otherwise the bookie adopts the
marker: the auditor (``pybk_spark/admin/operations/damage_repair.py``) copies the
entries back from the other replicas and then CASes repaired ranges out (or
deletes the marker), which is how they leave the bookie's set.  The set is
persisted in ``checkpoint.json`` (``lost``) with the index it describes, and
everything restored at start is re-published (the union is idempotent).

No clock; I/O only in ``sync_marker`` (metadata store) and on the entry
store's index (``store_gaps``, ``quarantine``).
"""
from __future__ import annotations

import logging
import threading
from typing import TYPE_CHECKING, Any, Callable, Iterable, Optional

import numpy as np
import pyarrow as pa

from bookie_server.storage.run_index import runs_of

from pybk_spark import errors
from pybk_spark.protocol.damage_marker import (  # noqa: F401  (re-exported)
    MARKER_PREFIX, OPEN, marker_key, marker_value, merge, parse_marker)

if TYPE_CHECKING:
    from bookie_server.journal.journal_replay import Damage
    from bookie_server.storage.entry_store import EntryStore
    from pybk_spark.metadata.store import MetadataStore

log = logging.getLogger("bookie.damage")


class LostSet:
    """Per ledger, the id ranges this bookie may have lost (thread-safe)."""

    def __init__(self, ranges: Iterable[tuple[int, int, int]] = (), unattributed: bool = False):
        self._lock = threading.Lock()
        self._ranges = merge(ranges)
        self.unattributed = unattributed
        self._pending = bool(self._ranges) or unattributed     # not yet in the marker

    def __bool__(self) -> bool:
        return bool(self._ranges) or self.unattributed

    def ranges(self) -> list[tuple[int, int, int]]:
        with self._lock:
            return list(self._ranges)

    def covers(self, ledger_id: int, entry_id: int) -> bool:
        with self._lock:
            for lid, first, last in self._ranges:
                if lid == ledger_id and first <= entry_id and (last == OPEN or entry_id <= last):
                    return True
        return False

    def has_ledger(self, ledger_id: int) -> bool:
        with self._lock:
            return any(lid == ledger_id for lid, _f, _l in self._ranges)

    def add(self, ranges: Iterable[tuple[int, int, int]], unattributed: bool = False) -> None:
        ranges = list(ranges)
        with self._lock:
            self._ranges = merge(self._ranges + ranges)
            self.unattributed = self.unattributed or unattributed
            self._pending = self._pending or bool(ranges) or unattributed

    def report(self, ranges: list[tuple[int, int, int]], unattributed: bool = False) -> None:
        """Log (``event=entries_missing``) and add."""
        for lid, first, last in ranges:
            log.error("event=entries_missing ledger=%d first=%d last=%d", lid, first, last)
        if unattributed:
            log.error("event=entries_missing ledger=unknown reason=%r",
                      "a ledger whose every record since the checkpoint was damaged "
                      "cannot be named; the auditor checks every ledger on this bookie")
        self.add(ranges, unattributed)

    def to_json(self) -> dict[str, Any]:
        with self._lock:
            return {"ranges": [list(r) for r in self._ranges], "unattributed": self.unattributed}

    @staticmethod
    def from_json(doc: Optional[dict[str, Any]]) -> "LostSet":
        doc = doc or {}
        return LostSet([tuple(r) for r in doc.get("ranges", [])],
                       bool(doc.get("unattributed", False)))

    def sync_marker(self, store: MetadataStore, bookie_id: str) -> None:
        """Publish new damage into the marker (CAS merge), else adopt the
        marker (the auditor removed what it repaired).  Raises BKError when
        the store is unreachable (the caller retries later)."""
        key = marker_key(bookie_id)
        while True:
            with self._lock:
                pending, mine, unattr = self._pending, list(self._ranges), self.unattributed
            cur = store.get(key)
            theirs, their_unattr = parse_marker(cur.value if cur is not None else None)
            if not pending:
                with self._lock:
                    if not self._pending:
                        self._ranges, self.unattributed = merge(theirs), their_unattr
                        return
                continue
            value = marker_value(theirs + mine, unattr or their_unattr)
            try:
                if cur is None:
                    store.put_if_absent(key, value)
                elif value != cur.value:
                    store.compare_and_swap(key, value, cur.version)
            except errors.MetadataVersion:
                continue
            with self._lock:
                # damage added while we wrote stays pending for the next sync
                if self._ranges == mine and self.unattributed == unattr:
                    self._pending = False
                self._ranges = merge(self._ranges + theirs)
                self.unattributed = self.unattributed or their_unattr
            log.warning("event=damage_published key=%s ranges=%d unattributed=%s",
                        key, len(merge(theirs + mine)), unattr or their_unattr)
            return


class ReplayTracker:
    """Bounds of what damaged journal records held (see the module docstring).
    ``max_entry(ledger)`` and ``ledgers()`` read the entry store."""

    def __init__(self, max_entry: Callable[[int], int], ledgers: Callable[[], Iterable[int]]):
        self._max_entry = max_entry
        self._ledgers = ledgers
        self.damages: list[Damage] = []
        self._seen: set[int] = set()                  # ledgers replayed so far
        self._points: list[tuple[dict[int, int], set[int]]] = []   # (ledger -> max id at damage, ledgers before)
        self._after_max: list[dict[int, int]] = []            # per damage: ledger -> max id replayed after

    def on_damage(self, damage: Damage) -> None:
        self.damages.append(damage)
        snap = {lid: self._max_entry(lid) for lid in self._ledgers()}
        self._points.append((snap, set(self._seen)))
        self._after_max.append({})

    def on_record(self, ledger_id: int, last_id: Optional[int]) -> None:
        self._seen.add(ledger_id)
        if self._after_max and last_id is not None:
            for after in self._after_max:
                if after.get(ledger_id, -1) < last_id:
                    after[ledger_id] = last_id

    def ranges(self, gaps: Callable[[int, int, int], list[tuple[int, int]]]
               ) -> list[tuple[int, int, int]]:
        """``gaps(ledger, lo, hi)``: the not-stored ranges of [lo, hi]."""
        out: list[tuple[int, int, int]] = []
        for (snap, before), after in zip(self._points, self._after_max):
            for lid in before | set(after):
                lo = snap.get(lid, -1) + 1
                if lid in after:
                    out.extend((lid, a, b) for a, b in gaps(lid, lo, after[lid]))
                else:
                    out.append((lid, lo, OPEN))
        return merge(out)


def gaps_in(starts: np.ndarray, ends: np.ndarray, lo: int, hi: int) -> list[tuple[int, int]]:
    """The ranges of [lo, hi] not covered by sorted, disjoint runs."""
    out = []
    cur = lo
    sel = (ends >= lo) & (starts <= hi)
    for a, b in zip(starts[sel].tolist(), ends[sel].tolist()):
        if a > cur:
            out.append((cur, a - 1))
        cur = max(cur, b + 1)
    if cur <= hi:
        out.append((cur, hi))
    return out


def store_gaps(store: EntryStore, ledger_id: int, lo: int, hi: int) -> list[tuple[int, int]]:
    """The ranges of [lo, hi] the entry store does not hold for a ledger."""
    with store.lock:
        idx = store.ledgers.get(ledger_id)
        if idx is None:
            return [(lo, hi)] if lo <= hi else []
        starts, ends, _refs, _rows = idx.table_parts()
        return gaps_in(starts, ends, lo, hi)


def quarantine(store: EntryStore, ref_id: int, ledger_id: int,
               good: Optional[pa.RecordBatch]) -> list[tuple[int, int, int]]:
    """Take a damaged stored batch out of the index and re-store its intact
    rows (``good``: digests verified; the write cache, so the next checkpoint
    writes them to a segment).  Returns the lost (ledger, first, last)."""
    runs = store.quarantine(ref_id)
    if not runs:
        return []
    ids = np.concatenate([np.arange(a, b + 1, dtype=np.int64) for a, b in runs])
    if good is not None:
        keep = np.isin(good.column(1).to_numpy(), ids)
        good = good if keep.all() else good.filter(pa.array(keep))
        if good.num_rows:
            store.add(ledger_id, good)
        ids = np.setdiff1d(ids, good.column(1).to_numpy())
    return [(ledger_id, int(a), int(b)) for a, b in zip(*runs_of(ids)[:2])]
