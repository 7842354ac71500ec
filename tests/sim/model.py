"""Deterministic simulation of one ledger's life: a writer, recoverers,
in-process bookies and the metadata twin, driven by one seeded scheduler.

The writer and recoverers use the REAL pure protocol core
(``PendingAdds``, ``FenceLacPhase``, ``EntryProbe``, ``recovery_start``,
ledger_metadata transforms, ``MemoryMetadataStore`` CAS); only the I/O is
simulated: every message is an event delivered after a random delay, or
dropped (the sender then sees a timeout), bookies crash and restart (their
state is durable), a partition cuts the writer from one bookie, the writer
may crash, a recovery whose re-write fails replaces the bookie (a recovery
ensemble change) and may crash right after.  Fault flags plant known bugs to
show the checker bites: ``coverage_wait=False`` the #1067/#2614 class
(fencing declared done after the first answer); ``read_writer_bookies=False``
chaos run 8's (after a crashed recovery's ensemble change, the next one
reads only the replacements and starts at the LAC);
``close_checks_ensemble=False`` a recovery closing although a concurrent one
changed the ensemble under it.

Replay a failure: PYBK_SIM_SEED=<seed> pytest tests/sim -k replay
"""
from __future__ import annotations

import heapq
import random
from dataclasses import dataclass, field

from pybk_spark import errors
from pybk_spark.metadata.memory_store import MemoryMetadataStore
from pybk_spark.metadata.store import ledger_key
from pybk_spark.protocol import ledger_metadata as lm
from pybk_spark.protocol import recovery as rc
from pybk_spark.protocol.distribution import write_set
from pybk_spark.protocol.pending_adds import PendingAdds

CONFIGS = [(3, 2, 2), (3, 3, 2), (4, 3, 2), (5, 3, 3), (3, 2, 1), (4, 4, 3), (5, 5, 3)]
NUM_BOOKIES = 7
TIMEOUT = 5.0


class InvariantViolation(AssertionError):
    pass


@dataclass
class SimLedger:
    fenced: bool = False
    entries: dict = field(default_factory=dict)   # eid -> payload
    lac: int = -1


class SimBookie:
    def __init__(self, bid: str):
        self.bid = bid
        self.up = True
        self.ledgers: dict[int, SimLedger] = {}

    def led(self, lid) -> SimLedger:
        return self.ledgers.setdefault(lid, SimLedger())

    def add(self, lid, eid, lac, payload, recovery):
        led = self.led(lid)
        if led.fenced and not recovery:
            return "fenced"
        led.entries.setdefault(eid, payload)
        led.lac = max(led.lac, lac)
        return "ok"

    def fence_read_lac(self, lid):
        led = self.ledgers.get(lid)
        if led is None:
            self.led(lid).fenced = True
            return "no_ledger", -1
        led.fenced = True
        return "ok", led.lac

    def read(self, lid, eid, fence=False):
        if fence:                       # recovery reads fence too (TLA+ defect 1)
            self.led(lid).fenced = True
        led = self.ledgers.get(lid)
        if led is None:
            return "no_ledger", None
        if eid not in led.entries:
            return "no_entry", None
        return "ok", led.entries[eid]


class Sim:
    def __init__(self, seed: int, *, coverage_wait: bool = True, faults: bool = True,
                 drop_p: float | None = None, fencing_reads: bool = True,
                 read_writer_bookies: bool = True, close_checks_ensemble: bool = True):
        self.seed = seed
        self.rng = random.Random(seed)
        self.coverage_wait = coverage_wait
        self.fencing_reads = fencing_reads      # False plants TLA+ defect 1 (pre-#2614 reads)
        # False plants chaos run 8's bug: the read-forward asks only the current
        # ensemble, not the writer's bookie a crashed recovery replaced
        self.read_writer_bookies = read_writer_bookies
        # False: a recovery closes even if another changed the ensemble under it
        self.close_checks_ensemble = close_checks_ensemble
        self.faults = faults
        self.now = 0.0
        self.q: list = []
        self.seq = 0
        self.store = MemoryMetadataStore(clock=lambda: self.now)
        self.bookies = {f"b{i}": SimBookie(f"b{i}") for i in range(NUM_BOOKIES)}
        self.E, self.Qw, self.Qa = self.rng.choice(CONFIGS)
        self.drop_p = self.rng.choice([0.0, 0.02, 0.1]) if faults else 0.0
        self.slow_p = self.rng.choice([0.0, 0.05, 0.2]) if faults else 0.0
        if drop_p is not None:
            self.drop_p = drop_p
        self.partitioned: set[str] = set()
        self.writer_acked: set[int] = set()        # released to the application
        self.closed_value: bytes | None = None
        self.recoverer_results: list[int] = []
        self.log: list[str] = []
        ens = tuple(self.rng.sample(sorted(self.bookies), self.E))
        self.lid = 1
        md = lm.new_ledger(self.lid, ens, self.Qw, self.Qa)
        self.store.put_if_absent(ledger_key(self.lid), md.to_json())
        self.writer = SimWriter(self, md)

    # -- scheduler -----------------------------------------------------------------
    def at(self, delay: float, fn, *args) -> None:
        self.seq += 1
        heapq.heappush(self.q, (self.now + delay, self.seq, fn, args))

    def send(self, src: str, bookie: str, request, on_reply, on_timeout) -> None:
        """Request/response to a bookie: delayed, maybe dropped (=> timeout).
        A request slower than TIMEOUT is still processed when it arrives, but
        the sender has already seen a timeout (unknown outcome)."""
        d1, d2 = self._delay(), self._delay()
        lost = (self.rng.random() < self.drop_p or not self.bookies[bookie].up
                or (src == "writer" and bookie in self.partitioned))
        if lost:
            self.at(TIMEOUT, on_timeout)
            return
        late = d1 + d2 > TIMEOUT
        if late:
            self.at(TIMEOUT, on_timeout)

        def deliver():
            b = self.bookies[bookie]
            if not b.up:
                if not late:
                    self.at(TIMEOUT - d1, on_timeout)
                return
            reply = request(b)
            if not late:
                self.at(d2, on_reply, reply)
        self.at(d1, deliver)

    def _delay(self) -> float:
        d = self.rng.uniform(0.1, 2.0)
        if self.rng.random() < self.slow_p:
            d += self.rng.uniform(2.0, 10.0)
        return d

    def metadata(self) -> lm.LedgerMetadata:
        v = self.store.get(ledger_key(self.lid))
        md = lm.LedgerMetadata.from_json(v.value)
        self.check_closed(v.value, md)
        return md

    def update(self, transform) -> lm.LedgerMetadata:
        raw, _ = self.store.update(ledger_key(self.lid),
                                   lambda r: transform(lm.LedgerMetadata.from_json(r)).to_json())
        md = lm.LedgerMetadata.from_json(raw)
        self.check_closed(raw, md)
        return md

    def check_closed(self, raw: bytes, md: lm.LedgerMetadata) -> None:
        if md.is_closed:
            if self.closed_value is None:
                self.closed_value = raw
            elif raw != self.closed_value:
                raise InvariantViolation("closed metadata changed")

    # -- faults --------------------------------------------------------------------
    def schedule_faults(self) -> None:
        if not self.faults:
            return
        for _ in range(self.rng.randint(0, 3)):
            b = self.rng.choice(sorted(self.bookies))
            t = self.rng.uniform(0, 60)
            self.at(t, self._crash, b)
            self.at(t + self.rng.uniform(1, 40), self._restart, b)
        if self.rng.random() < 0.3:
            b = self.rng.choice(self.writer.core.ensemble)
            t = self.rng.uniform(0, 60)
            self.at(t, self.partitioned.add, b)
            self.at(t + self.rng.uniform(5, 40), self.partitioned.discard, b)
        if self.rng.random() < 0.3:
            self.at(self.rng.uniform(5, 80), self.writer.crash)

    def _crash(self, b):
        self.bookies[b].up = False

    def _restart(self, b):
        self.bookies[b].up = True

    # -- run -----------------------------------------------------------------------
    def run(self) -> "Sim":
        n_entries = self.rng.randint(5, 40)
        gap = self.rng.choice([0.2, 1.0, 3.0])     # bursty or sparse writers
        t = 0.0
        for _ in range(n_entries):
            t += self.rng.uniform(0.01, gap)
            self.at(t, self.writer.add)
        if self.rng.random() < 0.5:
            self.at(t + self.rng.uniform(1, 20), self.writer.close)
        for _ in range(self.rng.choice([0, 1, 1, 2])):
            self.at(self.rng.uniform(0, t + 5), SimRecoverer(self).start)
        self.schedule_faults()
        steps = 0
        while self.q:
            self.now, _, fn, args = heapq.heappop(self.q)
            fn(*args)
            steps += 1
            if steps > 200000:
                raise InvariantViolation("simulation did not terminate")
        # heal everything and make sure the ledger ends up closed
        for b in self.bookies.values():
            b.up = True
        self.partitioned.clear()
        self.drop_p = self.slow_p = 0.0
        if not self.metadata().is_closed:
            rec = SimRecoverer(self)
            rec.start()
            while self.q:
                self.now, _, fn, args = heapq.heappop(self.q)
                fn(*args)
        self.check()
        return self

    def check(self) -> None:
        md = self.metadata()
        if not md.is_closed:
            raise InvariantViolation("ledger not closed after final recovery")
        last = md.last_entry_id
        lost = sorted(e for e in self.writer_acked if e > last)
        if lost:
            raise InvariantViolation(f"acknowledged entries {lost} beyond closed last entry {last}")
        for e in range(last + 1):
            ens = md.ensemble_for(e)
            holders = [ens[s] for s in write_set(e, len(ens), md.write_quorum)]
            copies = [self.bookies[b].ledgers.get(self.lid, SimLedger()).entries.get(e) for b in holders]
            present = [c for c in copies if c is not None]
            if len(present) < md.ack_quorum:
                raise InvariantViolation(f"entry {e} on {len(present)} < Qa replicas {holders}")
            if any(c != f"entry-{e}" for c in present):
                raise InvariantViolation(f"entry {e} has diverging copies {present}")
        if len(set(self.recoverer_results)) > 1:
            raise InvariantViolation(f"recoveries disagree: {self.recoverer_results}")


class SimWriter:
    def __init__(self, sim: Sim, md: lm.LedgerMetadata):
        self.sim = sim
        self.core = PendingAdds(md.write_quorum, md.ack_quorum, md.current_ensemble)
        self.dead = False
        self.failed: set[str] = set()

    def crash(self):
        self.dead = True

    def add(self):
        if self.dead:
            return
        (e,) = self.core.assign(1)
        lac = self.core.lac
        for t in self.core.targets(e):
            self._send(e, lac, t.slot, t.bookie)
        self.carried = getattr(self, "carried", {})
        self.carried[e] = lac

    def _send(self, e, lac, slot, bookie):
        sim = self.sim
        sim.send("writer", bookie,
                 lambda b: b.add(sim.lid, e, lac, f"entry-{e}", False),
                 lambda reply: self._on_reply(e, slot, bookie, reply),
                 lambda: self._on_reply(e, slot, bookie, "timeout"))

    def _on_reply(self, e, slot, bookie, reply):
        if self.dead:
            return
        if reply == "ok":
            self.sim.writer_acked.update(self.core.on_ack(e, slot, bookie))
        elif reply == "fenced":
            self.core.abort()
            self.dead = True
        else:
            self.failed.add(bookie)
            change = self.core.on_failure(slot, bookie)
            if change is not None:
                self.sim.at(self.sim.rng.uniform(0.1, 2.0), self._change, change)

    def _change(self, change):
        if self.dead:
            return
        sim = self.sim
        cands = sorted(set(sim.bookies) - set(change.ensemble) - self.failed)
        if len(cands) < len(change.slots):
            if not self.failed:           # NotEnoughBookies: pending adds fail (unknown)
                self.core.abort()
                self.dead = True
                return
            self.failed.clear()           # forgive and retry later
            sim.at(5.0, self._change, change)
            return
        repl = dict(zip(change.slots, sim.rng.sample(cands, len(change.slots))))
        try:
            md = sim.update(lambda m: lm.replace_bookies(m, change.first_entry, repl))
        except errors.LedgerFenced:
            self.core.abort()
            self.dead = True
            return
        released, resends, nxt = self.core.commit_change(md.current_ensemble)
        sim.writer_acked.update(released)
        for r in resends:
            for e in r.entry_ids().tolist():
                self._send(e, self.carried.get(e, -1), r.slot, r.bookie)
        if nxt is not None:
            sim.at(sim.rng.uniform(0.1, 2.0), self._change, nxt)

    def close(self):
        if self.dead:
            return
        if self.core.pending_count:
            self.sim.at(1.0, self.close)
            return
        lac = self.core.lac
        try:
            self.sim.update(lambda m: lm.close_by_writer(m, lac, 0))
        except (errors.LedgerFenced, errors.LedgerClosed):
            pass
        self.dead = True


class SimRecoverer:
    """One fencing open, as a chain of events."""

    def __init__(self, sim: Sim):
        self.sim = sim

    def start(self):
        sim = self.sim
        md = sim.update(lm.to_in_recovery)
        if md.is_closed:
            sim.recoverer_results.append(md.last_entry_id)
            return
        self.md = md
        self.ens = md.current_ensemble
        self.phase = rc.FenceLacPhase(len(self.ens), md.write_quorum, md.ack_quorum)
        self.fenced_done = False
        for slot, b in enumerate(self.ens):
            sim.send("recoverer", b, lambda bk: bk.fence_read_lac(sim.lid),
                     lambda reply, slot=slot: self._on_fence(slot, reply),
                     lambda slot=slot: self._on_fence(slot, ("error", -1)))

    def _on_fence(self, slot, reply):
        if self.fenced_done:
            return
        kind, lac = reply
        self.phase.on_answer(slot, {"ok": rc.OK, "no_ledger": rc.NO_LEDGER}.get(kind, rc.ERROR), lac)
        done = self.phase.covered if self.sim.coverage_wait else bool(self.phase.answered)
        if done:
            self.fenced_done = True
            self.last = rc.recovery_start(self.phase.max_lac, self.md.last_fragment_first_entry,
                                          self.sim.read_writer_bookies
                                          and lm.recovery_replaced_tail(self.md))
            self._probe(self.last + 1)
        elif self.phase.impossible:
            self.fenced_done = True
            self._retry()

    def _retry(self):
        self.sim.at(10.0, SimRecoverer(self.sim).start)

    def _probe(self, e):
        sim = self.sim
        probe = rc.EntryProbe(e, len(self.ens), self.md.write_quorum, self.md.ack_quorum)
        state = {"decided": False}
        answers = {}

        def on_read(slot, reply):
            if state["decided"]:
                return
            kind, payload = reply
            before = answers[slot].verdict
            verdict = answers[slot].on_answer({"ok": rc.OK, "no_entry": rc.NO_ENTRY,
                                               "no_ledger": rc.NO_LEDGER}.get(kind, rc.ERROR))
            if verdict is None or before is not None:
                return
            status = probe.on_answer(slot, verdict)
            if status == rc.UNDECIDED:
                return
            state["decided"] = True
            if status == rc.EXISTS:
                self._rewrite(e, payload)
            elif status == rc.MISSING:
                self._close(e - 1)
            else:
                self._retry()
        for slot in probe.slots:
            holders = (lm.recovery_read_bookies(self.md, slot) if sim.read_writer_bookies
                       else (self.ens[slot],))
            answers[slot] = rc.SlotAnswers(len(holders))
            for b in holders:
                self._send_retrying(b, lambda bk: bk.read(sim.lid, e, fence=sim.fencing_reads),
                                    lambda reply, slot=slot: on_read(slot, reply),
                                    lambda slot=slot: on_read(slot, ("error", None)))

    def _rewrite(self, e, payload):
        """Recovery adds of ``e`` to its write set; a bookie that fails is
        replaced by a recovery ensemble change (fragment at ``e``), after
        which this recoverer may crash (the next one must cope)."""
        sim = self.sim
        slots = write_set(e, len(self.ens), self.md.write_quorum)
        state = {"acks": 0, "pending": len(slots), "done": False}

        def send(slot):
            # like the real client: a timed-out recovery add fails the bookie at once
            self._send_retrying(self.ens[slot], lambda bk: bk.add(sim.lid, e, -1, payload, True),
                                lambda reply: on_add(slot, reply),
                                lambda: on_add(slot, "timeout"), attempts=1)

        def on_add(slot, reply):
            if state["done"]:
                return
            state["pending"] -= 1
            if reply == "ok":
                state["acks"] += 1
            if state["acks"] >= self.md.ack_quorum:
                state["done"] = True
                self._probe(e + 1)
                return
            if reply != "ok" and self._replace(e, slot):
                if sim.rng.random() < 0.3:       # crash right after the change
                    state["done"] = True
                    self._retry()
                    return
                state["pending"] += 1
                send(slot)
                return
            if state["pending"] == 0:
                state["done"] = True
                self._retry()
        for s in slots:
            send(s)

    def _replace(self, e, slot) -> bool:
        sim = self.sim
        spare = sorted(b for b in sim.bookies if b not in self.ens and sim.bookies[b].up)
        if not spare:
            return False
        new, seen = sim.rng.choice(spare), self.ens

        def change(m):
            if m.current_ensemble != seen:
                raise errors.IllegalOp("ensemble changed by another recoverer")
            return lm.replace_bookies(m, e, {slot: new}, by_writer=False)
        try:
            md = sim.update(change)
        except errors.BKError:
            return False
        self.md, self.ens = md, md.current_ensemble
        return True

    def _send_retrying(self, bookie, request, on_reply, on_fail, attempts=8):
        """A timed-out request is retried (the client's per-request retry)."""
        def timeout():
            if attempts > 1:
                self.sim.at(1.0, self._send_retrying, bookie, request, on_reply, on_fail, attempts - 1)
            else:
                on_fail()
        self.sim.send("recoverer", bookie, request, on_reply, timeout)

    def _close(self, last):
        try:
            md = self.sim.update(lambda m: lm.close_by_recovery(
                m, last, 0, self.md.ensembles if self.sim.close_checks_ensemble else None))
        except errors.RecoveryRaced:
            self._retry()               # another recoverer changed the ensemble: start over
            return
        self.sim.recoverer_results.append(md.last_entry_id)
