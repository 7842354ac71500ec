"""I9, availability: a bookie that no fault touched stays registered; and
I10: a lone autorecovery daemon does not stand by behind nobody.

The safety invariants (checker.py) cannot see a healthy bookie drop out of
the registry: writers only meet it as ``NotEnoughBookies``, which no
invariant reads (a keep-alive held by an etcd member cut off from its
peers can let a serving bookie's lease expire), so the harness judges it
here.

Theory of operation
-------------------
* ``RegistryWatch`` (I/O, a thread of the runner) reads ``bookies/`` every
  ``interval_s`` with ONE range read (one etcd revision, linearizable), so a
  mode switch (the new key is created before the old one is deleted) is never
  seen as a gap; it records ``(t, ids)``: the ids registered writable or
  read-only, or ``(t, None)`` when the read failed (etcd restarting, the
  runner's member cut off).  ``t`` is ``time.monotonic()``, the clock the
  nemesis records its faults on.
* The nemesis records ``FaultWindow(bookie, start, end)`` for every fault
  that may rightly unregister a bookie: kill, pause and torn tail (from the
  fault until its repair, which waits for the bookie to register again), and
  link faults that cut or degrade the bookie's own path to etcd (a
  bookie<->etcd partition; packet loss or netem on its host) until healed.
  A disk-full fault is no such window: the bookie switches mode, and a
  switch never leaves the id unregistered.  An etcd restart or an etcd
  minority cut is no such window either: the leases live in the majority.
* ``registration_gaps`` (pure) finds each gap: a run of samples in which a
  bookie that had been seen registered is absent (failed reads inside a run
  do not break it: nothing was learnt).  A gap is excused when it overlaps
  one of that bookie's windows, widened by ``grace_s`` after the window's
  end (a lease that lapsed during a pause takes up to ttl/3 to be renewed
  after the resume), and ends within that widening.  Any other gap is an I9
  violation: an unexcused gap, or a faulted bookie not back ``grace_s``
  after its repair.
* I10 reads the autorecovery workers' round notes (``leadership_of``:
  leader, standby, unknown or error).  With ONE daemon, "standby" means
  ``audit/leader`` is held by no other process: by this one's own earlier
  lease, which must end within its ttl.  ``standby_stalls`` (pure) finds each
  run of standby rounds with no leader round between; one longer than
  ``limit_s`` is a violation (a lease dropped without being revoked keeps
  the key alive, and the daemon stands by for good).  Rounds
  that could not reach etcd ("unknown", "error") are not judged: that is
  the fault, not the daemon.  With several daemons a standby round is the
  normal case, so only the figures are reported.
"""
from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from typing import Callable, Iterable, Optional

from pybk_spark.metadata import keys

from .checker import Violation

MODES = ("writable", "readonly")


@dataclass(frozen=True)
class FaultWindow:
    bookie: str
    start: float
    end: float = float("inf")       # inf: not repaired (yet)
    what: str = ""


@dataclass(frozen=True)
class Gap:
    bookie: str
    start: float                    # the first sample that found it absent
    end: float                      # the last one
    excused_by: str = ""            # the window that explains it ("" = none)

    @property
    def seconds(self) -> float:
        return self.end - self.start


def registered_ids(listing: Iterable[tuple[str, object]]) -> frozenset:
    """The bookie ids of a ``list_prefix("bookies/")`` answer that are
    registered (writable or read-only; damage markers are not registrations)."""
    out = set()
    for key, _ in listing:
        parts = key.split("/")
        if len(parts) == 3 and parts[0] + "/" == keys.BOOKIES_PREFIX and parts[1] in MODES:
            out.add(parts[2])
    return frozenset(out)


def registration_gaps(samples: list[tuple[float, Optional[frozenset]]],
                      windows: Iterable[FaultWindow], grace_s: float) -> list[Gap]:
    """Every gap of every bookie seen registered in ``samples`` (time order),
    each with the window that excuses it, if any."""
    by_bookie: dict[str, list[FaultWindow]] = {}
    for w in windows:
        by_bookie.setdefault(w.bookie, []).append(w)
    seen: set[str] = set()
    open_gap: dict[str, float] = {}
    last_absent: dict[str, float] = {}
    raw: list[tuple[str, float, float]] = []
    for t, ids in samples:
        if ids is None:
            continue
        for b in ids:
            if b in open_gap:
                raw.append((b, open_gap.pop(b), last_absent.pop(b)))
        for b in seen - ids:
            open_gap.setdefault(b, t)
            last_absent[b] = t
        seen |= ids
    raw.extend((b, start, last_absent[b]) for b, start in open_gap.items())

    def excuse(b: str, start: float, end: float) -> str:
        for w in by_bookie.get(b, ()):
            if start <= w.end + grace_s and end >= w.start and end <= w.end + grace_s:
                return w.what or "fault"
        return ""
    return [Gap(b, s, e, excuse(b, s, e)) for b, s, e in sorted(raw, key=lambda g: g[1])]


def check_registration(samples, windows, grace_s: float, t0: float = 0.0) -> list[Violation]:
    """I9 violations: the unexcused gaps (times relative to ``t0``)."""
    return [Violation("I9 availability", f"{g.bookie} was not registered from "
                      f"t={g.start - t0:.1f}s to t={g.end - t0:.1f}s ({g.seconds:.1f}s) with no "
                      f"fault of its own, or more than {grace_s:g}s after its repair")
            for g in registration_gaps(samples, windows, grace_s) if not g.excused_by]


def registration_totals(samples, windows, grace_s: float) -> dict:
    gaps = registration_gaps(samples, windows, grace_s)
    excused = [g for g in gaps if g.excused_by]
    return {"polls": len(samples), "failed_polls": sum(ids is None for _, ids in samples),
            "gaps_excused": len(excused),
            "gaps_unexcused": sum(not g.excused_by for g in gaps),
            "longest_excused_gap_s": round(max((g.seconds for g in excused), default=0.0), 1)}


def leadership_of(row: dict) -> str:
    """One autorecovery round's row (``AutoRecovery.run_round``) as leader,
    standby, unknown (etcd did not answer the refresh) or error."""
    if row.get("leader"):
        return "leader"
    if row.get("leadership") == "unknown":
        return "unknown"
    return "error" if "error" in row else "standby"


def standby_stalls(rounds: Iterable[tuple[float, str]]) -> list[tuple[float, float]]:
    """(start, end) of each run of standby rounds (``(t, leadership)``,
    time order) with no leader round between; unknown and error rounds
    neither start nor end one.  A run still open at the last round ends
    there."""
    out, start, last = [], None, None
    for t, state in rounds:
        if state == "leader":
            if start is not None:
                out.append((start, t))
            start = None
        elif state == "standby":
            start = t if start is None else start
            last = t
    if start is not None and last is not None:
        out.append((start, last))
    return out


def check_autorecovery(ops: Iterable[dict], daemons: int, limit_s: float,
                       t0: float = 0.0) -> list[Violation]:
    """I10 violations (one daemon only): standby stalls over ``limit_s``."""
    if daemons != 1:
        return []
    rounds = sorted((op["t"], op.get("leadership", "")) for op in ops
                    if op.get("op") == "autorecovery")
    return [Violation("I10 autorecovery leadership",
                      f"the only autorecovery daemon stood by from t={a - t0:.1f}s to "
                      f"t={b - t0:.1f}s ({b - a:.1f}s) with no other process leading")
            for a, b in standby_stalls(rounds) if b - a > limit_s]


class RegistryWatch:
    """Samples the registry on a thread until ``stop()``; ``open_store()``
    returns a metadata store (made again after a failure)."""

    def __init__(self, open_store: Callable[[], object], interval_s: float = 0.25,
                 clock: Callable[[], float] = time.monotonic):
        self.open_store, self.interval_s, self.clock = open_store, interval_s, clock
        self.samples: list[tuple[float, Optional[frozenset]]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="registry-watch", daemon=True)

    def start(self) -> "RegistryWatch":
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(30)

    def _run(self) -> None:
        store = None
        while not self._stop.wait(self.interval_s):
            t = self.clock()
            try:
                if store is None:
                    store = self.open_store()
                ids = registered_ids(store.list_prefix(keys.BOOKIES_PREFIX))
            except Exception:  # noqa: BLE001 - etcd restarting or cut off: nothing learnt
                ids = None
            self.samples.append((t, ids))
