"""Read decisions (BookKeeper PendingReadOp, ReadLastConfirmedOp and the read
half of LedgerRecoveryOp), with no I/O.

Theory of operation
-------------------
A reader asks bookies; this module says what their answers mean and whom to
ask next.  The shells (``read_handle``, ``recovery_op``, the re-replication
in ``admin``) send the requests and verify digests; every rule below is
written here once.

Answer kinds: ``OK`` (rows, or a LAC), ``NO_ENTRY`` (NoSuchEntry),
``NO_LEDGER`` (NoSuchLedger), ``CORRUPT`` (rows arrived, none usable),
``ERROR`` (anything else: down, timeout, damaged bookie).  ``answer_kind``
turns a request's outcome (its typed error, or None) into one of them.

* Verified prefix (``usable_prefix``, ``verified_prefix``).  Rows answering a
  read for ids from ``e`` are usable only as a prefix: the first row must be
  ``e`` and the rows are cut at the first one whose digest does not verify
  (everything after it is dropped, even if it verifies), so what a reader
  keeps is contiguous from ``e``.  No usable row: the answer is CORRUPT.
* Merged sparse answers (``gap_free_first_copies``): striped reads ask
  several bookies for the same window; the first copy of each id (in answer
  order) is taken and the merge stops at the first id nobody returned; the
  verified prefix of that merge is then the window's answer.
* Re-replication copies (``copy_rows``): a copy task reads sets of ids, not a
  prefix; a row is kept iff its digest verifies and its id is still wanted
  (a corrupt row costs only that id, which the next source may supply).
* LAC coverage (``LacCoverage``): ReadLac goes to every bookie of the last
  fragment; the query is done as soon as the answering slots cover the
  ensemble ((Qw - Qa) + 1 per write quorum, ``distribution.is_covered``),
  never waiting for a hung bookie (#1067).  OK, NO_LEDGER and NO_ENTRY
  answer; only OK carries a LAC.  Once so many slots failed that coverage is
  impossible the query fails.  The LAC is the max of the answers, never below
  ``floor`` (the last fragment's first entry - 1: entries of earlier
  fragments are acknowledged).  The fencing open uses the same machine with
  fenced reads, so its LAC comes only from fenced answers (#2614).
* Replica choice and "entry missing" for a read (``replica_order``,
  ``ReplicaRun``): a read of ids from ``e`` (all at or below a LAC the
  reader has seen) goes to one replica of e's write set, rotated by a turn
  counter so consecutive windows spread over the replicas.  If it has not
  answered within the speculative delay, the next replica is asked as well;
  when every outstanding request failed, the next untried one.  The first
  usable answer wins.  When all replicas answered without one: every one
  CORRUPT -> BAD_DIGEST_ALL; every one NO_ENTRY/NO_LEDGER -> MISSING (the
  entry is missing only if no replica holds it: it is below the LAC, so Qa
  replicas once acknowledged it); some CORRUPT -> BAD_DIGEST; else FAILED.
  Recovery's "entry missing" is a different rule ((Qw - Qa) + 1 NoSuchEntry
  of the write set, for ids above the LAC) and lives in ``protocol.recovery``.

Pure: numpy arithmetic only; no I/O, no clock, no threads.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from pybk_spark import errors
from pybk_spark.protocol.distribution import is_covered, write_set

OK = "ok"
NO_LEDGER = "no_ledger"
NO_ENTRY = "no_entry"
CORRUPT = "corrupt"
ERROR = "error"

# verdicts of a ReplicaRun that found no usable answer
BAD_DIGEST_ALL = "bad_digest_all"
MISSING = "missing"
BAD_DIGEST = "bad_digest"
FAILED = "failed"


def answer_kind(exc: BaseException | None) -> str:
    """The kind of a bookie's answer from its outcome: None (it answered;
    rows, if any, are judged by the caller) -> OK; NoSuchLedger ->
    NO_LEDGER; NoSuchEntry -> NO_ENTRY; any other error -> ERROR."""
    if exc is None:
        return OK
    if isinstance(exc, errors.NoSuchLedger):
        return NO_LEDGER
    if isinstance(exc, errors.NoSuchEntry):
        return NO_ENTRY
    return ERROR


# -- verified prefix ---------------------------------------------------------------------------
def verified_prefix(ok: np.ndarray) -> int:
    """Rows before the first whose digest failed (``ok``: per-row mask)."""
    bad = np.flatnonzero(~np.asarray(ok, dtype=bool))
    return int(bad[0]) if len(bad) else len(ok)


def usable_prefix(first_id: int | None, want: int, verify: Callable[[], np.ndarray]) -> int:
    """How many rows of an answer for ids from ``want`` are usable: 0 unless
    the answer starts at ``want`` (``first_id``: its first row's id, None if
    empty), else its verified prefix.  ``verify`` (the digest mask) is only
    called when the answer starts at ``want``."""
    if first_id is None or first_id != want:
        return 0
    return verified_prefix(verify())


def gap_free_first_copies(ids: np.ndarray, first: int) -> np.ndarray:
    """Positions in ``ids`` (the ids of several answers, concatenated) of the
    first copy of each id, in id order, for the longest run first, first+1,
    ... that has no gap.  Empty if nobody returned ``first``."""
    ids = np.asarray(ids, dtype=np.int64)
    order = np.argsort(ids, kind="stable")
    uniq, idx = np.unique(ids[order], return_index=True)
    take = order[idx]
    gaps = uniq != np.arange(first, first + len(uniq))
    n = int(np.argmax(gaps)) if gaps.any() else len(uniq)
    return take[:n]


def copy_rows(ids: np.ndarray, ok: np.ndarray, wanted: np.ndarray) -> np.ndarray:
    """Mask of the rows a re-replication keeps from one source: digest
    verified and id still wanted."""
    return np.asarray(ok, dtype=bool) & np.isin(ids, wanted)


# -- LAC coverage ----------------------------------------------------------------------------
@dataclass
class LacCoverage:
    """ReadLac answers of the last fragment's slots (see the module doc)."""
    ensemble_size: int
    write_quorum: int
    ack_quorum: int
    floor: int = -1
    answered: set[int] = field(default_factory=set)
    failed: set[int] = field(default_factory=set)
    max_lac: int = -1

    def on_answer(self, slot: int, kind: str, lac: int = -1) -> None:
        """kind: OK (answered with ``lac``), NO_LEDGER, NO_ENTRY, or ERROR."""
        if kind == OK:
            self.answered.add(slot)
            self.max_lac = max(self.max_lac, lac)
        elif kind in (NO_LEDGER, NO_ENTRY):
            self.answered.add(slot)
        else:
            self.failed.add(slot)

    @property
    def lac(self) -> int:
        return max(self.max_lac, self.floor)

    @property
    def covered(self) -> bool:
        return is_covered(self.ensemble_size, self.write_quorum, self.ack_quorum, self.answered)

    @property
    def impossible(self) -> bool:
        alive = [s for s in range(self.ensemble_size) if s not in self.failed or s in self.answered]
        return not is_covered(self.ensemble_size, self.write_quorum, self.ack_quorum, alive)


# -- replica choice and the read verdict -------------------------------------------------------
def replica_order(entry_id: int, ensemble_size: int, write_quorum: int,
                  turn: int) -> tuple[int, ...]:
    """The slots of ``entry_id``'s write set in the order a read asks them:
    rotated by ``turn`` (the reader's round-robin counter)."""
    slots = write_set(entry_id, ensemble_size, write_quorum)
    k = turn % len(slots)
    return slots[k:] + slots[:k]


@dataclass
class ReplicaRun:
    """One read of ids from an entry, asked of the replicas in ``order``.
    The shell calls ``next_replica`` for the first request, waits at most
    ``wait_limit(...)`` for an answer, reports a silent wait with
    ``on_silence`` and each answer that is not usable with ``on_answer``;
    each of them returns the slot to ask next, or None.  A usable answer
    ends the run in the shell.  ``verdict`` once ``exhausted``."""
    order: tuple[int, ...]
    tried: int = 0
    outstanding: int = 0
    corrupt: int = 0
    no_entry: int = 0
    failed: int = 0

    def next_replica(self) -> int | None:
        if self.tried >= len(self.order):
            return None
        slot = self.order[self.tried]
        self.tried += 1
        self.outstanding += 1
        return slot

    def wait_limit(self, speculative_s: float | None) -> float | None:
        """How long to wait for an answer before asking the next replica as
        well (None: until one arrives; nobody is left to ask)."""
        return speculative_s if self.tried < len(self.order) else None

    def on_silence(self) -> int | None:
        """The speculative delay passed without an answer: ask the next one."""
        return self.next_replica()

    def on_answer(self, kind: str) -> int | None:
        """An answer that is not usable (CORRUPT, NO_ENTRY, NO_LEDGER, ERROR).
        When nothing is outstanding any more, the next untried replica."""
        self.outstanding -= 1
        if kind == CORRUPT:
            self.corrupt += 1
        elif kind in (NO_ENTRY, NO_LEDGER):
            self.no_entry += 1
        else:
            self.failed += 1
        return self.next_replica() if self.outstanding == 0 else None

    @property
    def exhausted(self) -> bool:
        return self.outstanding == 0 and self.tried >= len(self.order)

    @property
    def verdict(self) -> str:
        n = len(self.order)
        if self.corrupt == n:
            return BAD_DIGEST_ALL
        if self.no_entry == n:
            return MISSING
        if self.corrupt:
            return BAD_DIGEST
        return FAILED
