"""Recovery decisions (BookKeeper LedgerRecoveryOp / ReadLastConfirmedOp), no I/O.

Theory of operation
-------------------
Recovery of an IN_RECOVERY ledger runs in two phases over the LAST fragment:

1. Fence + LAC.  A fenced ReadLac is sent to every bookie of the last
   fragment.  ``FenceLacPhase`` (the readers' ``read_decisions.LacCoverage``,
   fed fenced answers) collects answers; it is done as soon as the
   answering slots *cover* the ensemble ((Qw-Qa)+1 per write quorum), never
   waiting for a hanging bookie (#1067).  The LAC is the max over bookies
   that answered the FENCED read (#2614); NoSuchLedger (and NoSuchEntry)
   answers count for coverage with LAC -1.  If coverage becomes impossible
   the phase fails.
2. Read forward.  ``recovery_start`` = max(max LAC, first entry of the last
   fragment - 1) (#2615): every id <= start is known acknowledged (and where
   an earlier recovery replaced writer bookies in the last fragment, its
   first entry - 1: those ids must be re-written to the replacements).  For each
   id > start, ``EntryProbe`` classifies the answers of its write set: any
   positive answer => EXISTS (it must be re-written to its whole write set
   with recovery adds); (Qw-Qa)+1 NoSuchEntry => MISSING (end of ledger: the
   ledger closes at the previous id); otherwise UNDECIDED (ask more bookies /
   retry; if all answered and still undecided the recovery cannot finish).
   The prober stops waiting once the status is settled (``EntryProbe.
   settled``): EXISTS and UNRECOVERABLE at once; MISSING only when no
   successful answer has already arrived unread, because a positive answer
   that already arrived wins (the entry exists and must be re-written).
   A slot may have two bookies to ask (``SlotAnswers``): when an earlier
   recovery replaced the writer's bookie at that slot, the replacement may
   not have the entries beyond its fragment's start yet, so the slot says
   "no" only when the writer's bookie says so too (else a crashed
   recovery's ensemble change makes the next recovery close before
   acknowledged entries).

Pure: no I/O, no clock, no threads.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from pybk_spark.protocol.distribution import coverage_threshold, write_set
from pybk_spark.protocol.read_decisions import ERROR, NO_ENTRY, NO_LEDGER, OK, LacCoverage

__all__ = ["OK", "NO_LEDGER", "NO_ENTRY", "ERROR", "EXISTS", "MISSING", "UNDECIDED",
           "UNRECOVERABLE", "FenceLacPhase", "LacCoverage", "recovery_start", "EntryProbe",
           "SlotAnswers", "closing_entry", "RecoveryDecision"]

EXISTS = "exists"
MISSING = "missing"
UNDECIDED = "undecided"
UNRECOVERABLE = "unrecoverable"


# Phase 1 is the LAC query of every reader, with fenced reads: one machine.
FenceLacPhase = LacCoverage


def recovery_start(max_lac: int, last_fragment_first: int, tail_replaced: bool = False) -> int:
    """Where the read forward starts (the id before the first one read).
    Normally the highest id known acknowledged, but never before the last
    fragment (#2615).  ``tail_replaced``: an earlier recovery replaced
    bookies of the writer's ensemble in the last fragment, so ids there up to
    the LAC may be missing on the replacements: re-read and re-write the
    whole last fragment."""
    if tail_replaced:
        return last_fragment_first - 1
    return max(max_lac, last_fragment_first - 1)


@dataclass
class EntryProbe:
    entry_id: int
    ensemble_size: int
    write_quorum: int
    ack_quorum: int
    found: set[int] = field(default_factory=set)
    no_entry: set[int] = field(default_factory=set)
    failed: set[int] = field(default_factory=set)

    @property
    def slots(self) -> tuple[int, ...]:
        return write_set(self.entry_id, self.ensemble_size, self.write_quorum)

    def on_answer(self, slot: int, kind: str) -> str:
        if slot in self.slots:
            {OK: self.found, NO_ENTRY: self.no_entry, NO_LEDGER: self.no_entry}.get(
                kind, self.failed).add(slot)
        return self.status

    def settled(self, success_arrived_unread: bool) -> bool:
        """Whether the prober may stop waiting for more answers.
        ``success_arrived_unread``: a successful read answer has arrived that
        was not yet fed to ``on_answer``; it may make a MISSING entry
        EXISTS, so MISSING waits for it (a positive answer that already
        arrived wins)."""
        status = self.status
        if status == MISSING:
            return not success_arrived_unread
        return status in (EXISTS, UNRECOVERABLE)

    @property
    def status(self) -> str:
        if self.found:
            return EXISTS
        if len(self.no_entry) >= coverage_threshold(self.write_quorum, self.ack_quorum):
            return MISSING
        if len(self.no_entry) + len(self.failed) >= len(self.slots):
            return UNRECOVERABLE
        return UNDECIDED


@dataclass
class SlotAnswers:
    """The answers for one slot of an entry's write set from every bookie
    that may hold it.  Verdict: OK at the first positive answer; NO_ENTRY when
    every bookie said NoSuchEntry / NoSuchLedger; ERROR when all answered,
    none positive and one failed; None while undecided."""
    bookies: int
    no: int = 0
    failed: int = 0
    found: bool = False

    def on_answer(self, kind: str) -> str | None:
        if kind == OK:
            self.found = True
        elif kind in (NO_ENTRY, NO_LEDGER):
            self.no += 1
        else:
            self.failed += 1
        return self.verdict

    @property
    def verdict(self) -> str | None:
        if self.found:
            return OK
        if self.no >= self.bookies:
            return NO_ENTRY
        if self.no + self.failed >= self.bookies:
            return ERROR
        return None


def closing_entry(first_missing: int) -> int:
    """The ledger closes at the entry before the first missing one."""
    return first_missing - 1


@dataclass(frozen=True)
class RecoveryDecision:
    """What one recovery decided before re-writing anything: ids up to
    ``start`` are known acknowledged; ``start``+1..``last`` were found on
    some bookie and are re-written to their whole write sets; it then closes
    at ``last``, unless another recovery closed first: that close stands
    (``close_by_recovery``) and may be lower, so these re-writes can leave
    copies of ids beyond the ledger's final last entry."""
    ledger_id: int
    start: int
    last: int

    @property
    def rewrites(self) -> range:
        return range(self.start + 1, self.last + 1)
