"""Auditor and recovery-selection decisions (BookKeeper's Auditor,
lostBookieRecoveryDelay, openLedgerRereplicationGracePeriod), without I/O.

Theory of operation
-------------------
Lost bookies.  A bookie is *known* if it has a cookie or appears in some
ledger's fragment that holds entries; it is *missing* while it is known but
not registered (writable or read-only).  The first time the auditor sees it
missing it records the wall-clock time under ``audit/missing/<id>``
(put-if-absent, so concurrent auditors agree on the first sighting); when it
registers again, or is no longer known (``pybk decommission`` retired it),
the record is deleted.  It is *lost* once missing for at least
``lost_bookie_recovery_delay`` seconds, or when an operator decommissioned
it (``audit/decommissioned/<id>``) or named it with ``--bookie``.

Fragments to repair.  Every *complete* fragment (any fragment of a CLOSED
ledger; any fragment but the last of an OPEN / IN_RECOVERY one) with a lost
bookie in its ensemble gets one ``FragmentWork`` per lost bookie.  The last
fragment of a not-closed ledger is still being written: it is left alone
(``DEFER``) while the writer's lease is alive and the bookie has been lost
for less than the grace period; afterwards (or at once when the writer is
gone) the ledger is fenced and recovered (``FENCE``), which closes it, and a
later audit pass repairs its now-complete fragments.

Replacements.  ``plan_replacements`` asks the placement policy for a
bookie outside the fragment's current ensemble and outside every lost bookie,
updating the ensemble as it goes so two lost bookies of one fragment never
get the same replacement.

Dead-writer recovery.  ``select_for_recovery`` keeps not-closed ledgers
(optionally those of one log) whose writer lease is gone (``force`` ignores
the lease) and that are at least ``min_idle_s`` old.

Ordering obligations for the I/O side: copy every entry to the replacement
(recovery adds, durable) BEFORE the CAS that swaps the bookie in the
fragment; the CAS transform re-decides on the fresh metadata.

Pure: no I/O, no clock (times are arguments), no threads.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Iterable, Mapping

from pybk_spark import errors
from pybk_spark.ledger.placement import DECOMMISSIONED_PREFIX  # noqa: F401  (re-exported)
from pybk_spark.metadata.audit_control import MISSING_PREFIX  # noqa: F401  (re-exported)
from pybk_spark.protocol import ledger_metadata as lm

REPAIR = "REPAIR"
DEFER = "DEFER"
FENCE = "FENCE"


# -- lost bookies -------------------------------------------------------------------------
def known_bookies(cookie_ids: Iterable[str], ledgers: Iterable[lm.LedgerMetadata]) -> set[str]:
    """Bookies with a cookie or with a fragment that holds entries (an empty
    fragment's bookies hold nothing of that ledger)."""
    out = set(cookie_ids)
    for md in ledgers:
        for _first, _last, bookies in md.fragments():
            out |= set(bookies)
    return out


@dataclass(frozen=True)
class MissingChanges:
    mark: frozenset       # newly missing: record first-seen time now
    clear: frozenset      # registered again, or no longer known (retired): drop the record


def track_missing(known: Iterable[str], registered: Iterable[str],
                  first_seen: Mapping[str, float]) -> MissingChanges:
    reg, known = set(registered), set(known)
    missing = known - reg
    return MissingChanges(mark=frozenset(missing - set(first_seen)),
                          clear=frozenset(set(first_seen) & reg | set(first_seen) - known))


def lost_bookies(first_seen: Mapping[str, float], now: float, delay_s: float,
                 decommissioned: Iterable[str] = (), named: Iterable[str] = ()) -> dict[str, float]:
    """bookie -> time it counts as lost since (decommissioned/named: their mark
    time if any, else ``now``)."""
    out = {b: t for b, t in first_seen.items() if now - t >= delay_s}
    for b in list(decommissioned) + list(named):
        out.setdefault(b, first_seen.get(b, now))
    return out


# -- fragments ---------------------------------------------------------------------------------
@dataclass(frozen=True)
class FragmentWork:
    ledger_id: int
    first: int
    last: int
    ensemble: tuple[str, ...]
    slot: int
    lost: str
    replacement: str = ""

    def key(self) -> str:
        return f"{self.ledger_id}:{self.first}:{self.lost}"


@dataclass
class LedgerAudit:
    ledger_id: int
    work: list[FragmentWork] = field(default_factory=list)
    open_action: str = ""          # "", DEFER or FENCE for the last, still-written fragment
    reason: str = ""


def audit_ledger(md: lm.LedgerMetadata, lost_since: Mapping[str, float], now: float,
                 grace_s: float, writer_alive: bool) -> LedgerAudit:
    out = LedgerAudit(md.ledger_id)
    lost = set(lost_since)
    if not lost & md.all_bookies():
        return out
    for first, last, bookies in md.fragments():
        hit = [(slot, b) for slot, b in enumerate(bookies) if b in lost]
        if not hit:
            continue
        if last == -1:             # open-ended: the fragment still being written
            since = min(lost_since[b] for _s, b in hit)
            if writer_alive and now - since < grace_s:
                out.open_action = DEFER
                out.reason = (f"writer alive; last fragment waits {grace_s - (now - since):.0f}s "
                              "more (grace period)")
            else:
                out.open_action = FENCE
                out.reason = "writer gone" if not writer_alive else "grace period over"
            continue
        for slot, b in hit:
            out.work.append(FragmentWork(md.ledger_id, first, last, tuple(bookies), slot, b))
    return out


def plan_replacements(work: list[FragmentWork], lost: Iterable[str],
                      choose: Callable[[tuple[str, ...], int, set], str]
                      ) -> tuple[list[FragmentWork],
                                 list[tuple[FragmentWork, errors.NotEnoughBookies]]]:
    """(work with ``replacement`` filled, [(work, refusal)] that could not
    be placed).  ``choose(ensemble, slot, exclude)`` is the placement
    policy; it raises NotEnoughBookies when it cannot (that item is left
    unplaced, with the error: its ensemble and excluded bookies say why)."""
    lost = set(lost)
    current: dict[tuple[int, int], list[str]] = {}
    planned, unplaced = [], []
    for w in work:
        ens = current.setdefault((w.ledger_id, w.first), list(w.ensemble))
        try:
            new = choose(tuple(ens), w.slot, lost | set(ens))
        except errors.NotEnoughBookies as exc:
            unplaced.append((w, exc))
            continue
        ens[w.slot] = new
        planned.append(FragmentWork(w.ledger_id, w.first, w.last, w.ensemble, w.slot, w.lost, new))
    return planned, unplaced


# -- dead-writer recovery ------------------------------------------------------------------------
@dataclass(frozen=True)
class RecoveryChoice:
    ledger_id: int
    recover: bool
    reason: str


def select_for_recovery(md: lm.LedgerMetadata, writer_alive: bool, now_ms: int,
                        min_idle_s: float, force: bool) -> RecoveryChoice:
    if md.is_closed:
        return RecoveryChoice(md.ledger_id, False, "closed")
    if writer_alive and not force:
        return RecoveryChoice(md.ledger_id, False, "writer alive (lease held)")
    age_s = (now_ms - md.ctime_ms) / 1000.0
    if md.ctime_ms and age_s < min_idle_s:
        return RecoveryChoice(md.ledger_id, False, f"younger than --min-idle ({age_s:.0f}s)")
    why = md.state.lower() + (", writer alive but --force" if writer_alive else ", writer gone")
    return RecoveryChoice(md.ledger_id, True, why)
