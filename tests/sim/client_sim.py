"""Deterministic simulation of the production client: one ledger's life.

Theory of operation
-------------------
The REAL client (``BookKeeper``, ``LedgerHandle``/``LedgerWriter``,
``recovery_op``'s fencing open, ``ReadHandle``) runs over ``SimNet``
(in-memory bookies behind a seeded network) and one ``MemoryMetadataStore``,
with the clock, executor and timers of one ``SimLoop`` (loop.py): a seed
fixes every delay, loss, crash and interleaving, so it replays exactly.

A run: a writer process creates a ledger (a seeded (E, Qw, Qa)) and adds
entries, synchronous and pipelined, payload ``p<k>`` for its k-th add (so
entry k must hold ``p<k>``), then maybe closes; recoverer processes open it
with recovery at seeded times (retrying a ``LedgerRecoveryError``) and read
back what they recovered.  The nemesis crashes and restarts bookies, cuts
the writer from a bookie, loses and delays messages, crashes the writer, and
crashes a recoverer right after its recovery ensemble change.  Then
everything heals, the surviving processes finish, a last recoverer closes the
ledger if nobody did, and ``check`` judges the history:

  I1 every acknowledged entry id <= the closed last entry (a fenced writer
     acknowledged after the close is named as such);
  I2 every entry up to the last one is on >= Qa bookies of its write set,
     every copy is the bytes the writer wrote, and a client reads them all;
  I3 every recovery (and every reader of the closed ledger) agrees on the
     last entry and the length; the closed metadata never changes;
  I4 acknowledgements reach the application in entry-id order;
  I5 a ledger its writer closed itself (``close()`` returned and the CLOSED
     metadata is the writer's own OPEN -> CLOSED write, not a recovery's):
     every entry up to the last one is on EVERY bookie of its write set in
     the closed metadata (Qw copies), except on a bookie to which an add of
     the writer failed (``SimNet.failed_adds``; why, in ``check``).  The
     writer's close waits for an answer to every request it sent, the
     resends of an ensemble change included, so a replacement holds all of
     its fragment (else it lacks the entries the survivors acknowledged
     while the change was pending: closed at Qa).

Focused schedules (``ClientSim(focus=...)``, ``FOCI``) aim at the rare
interleavings of the protocol planted bugs: a writer cut from the one bookie
a recovery fenced ("fence_loss"), a recoverer crashing right after its
recovery ensemble change and the recovery after it ("crashed_change"), a
second recovery running meanwhile ("race"), a writer's ensemble change
while its pipelined adds are acknowledged ("change_under_adds": the store's
CAS takes a round trip there; elsewhere it is instant, and the change's
window too short for an ack to land in it).

Planted bugs (``PLANTS``) are test seams applied for one run; each must
be caught by some seed of the default run, the protocol ones by a seed of
their focused schedules (tests/sim/test_client_sim.py).
"""
from __future__ import annotations

import contextlib
import random
from unittest import mock

import numpy as np

from pybk_spark import errors
from pybk_spark.ledger import ledger_writer
from pybk_spark.ledger.client import BookKeeper
from pybk_spark.metadata.memory_store import MemoryMetadataStore
from pybk_spark.metadata.store import ledger_key
from pybk_spark.protocol import ledger_metadata as lm
from pybk_spark.protocol import read_decisions as rd
from pybk_spark.protocol.distribution import write_set
from pybk_spark.protocol.pending_adds import PendingAdds
from pybk_spark.transport.memory import MemoryBookie

from sim.loop import SimCrash, SimExecutor, SimLoop
from sim.net import SimNet, SimTransportPool

CONFIGS = [(3, 2, 2), (3, 3, 2), (4, 3, 2), (5, 3, 3), (3, 2, 1), (4, 4, 3), (5, 5, 3)]
NUM_BOOKIES = 7
PASSWORD = b"sim"
SIM_CONF = {"add_timeout_s": 5.0, "read_timeout_s": 5.0, "max_inflight_adds": 1 << 20,
            "explicit_lac_interval_ms": 0, "metadata_retries": 20}
HEAL_AT = 200.0
EQUAL_QUORUMS = [c for c in CONFIGS if c[1] == c[2]]   # one replica short of Qw is below Qa
SPARE_ACKS = [c for c in CONFIGS if c[1] > c[2]]       # an add acknowledged without one holder
# focused schedules (ClientSim(focus=...)), aimed at the interleavings of the
# protocol planted bugs: extra loss of one kind of request (net.py's tags) and
# the share of slow messages
FOCI = {"fence_loss": ({"lacF": 0.6}, 0.0),     # bookies a recovery failed to fence, a
                                                # writer cut from the one it fenced
        "crashed_change": ({"addR": 0.3}, 0.0),  # recovery ensemble change, crash, next one
        "race": ({"addR": 0.3}, 0.0),            # ... with a second recovery meanwhile
        "change_under_adds": ({}, 0.0)}          # a writer's ensemble change, adds in flight


class InvariantViolation(AssertionError):
    pass


def payload(k: int) -> bytes:
    return b"p%d" % k


class _SimStore(MemoryMetadataStore):
    """The metadata twin on the loop's clock, leases without keepalive
    threads, and a hook seeing every ledger metadata write."""

    def __init__(self, loop: SimLoop, on_write):
        super().__init__(clock=loop.clock)
        self._loop = loop
        self._on_write = on_write
        self.cas_delay: tuple[float, float] | None = None   # a CAS's round trip (seeded)

    def wait_for_change(self, prefix, after_revision, timeout):
        """The twin's wait, on simulated time (its own deadline is real time)."""
        deadline = self._loop.now + timeout
        cond = self._shared.cond                 # notified by every write
        with cond:
            while not super().wait_for_change(prefix, after_revision, 0):
                remaining = deadline - self._loop.now
                if remaining <= 0:
                    return False
                cond.wait(remaining)
        return True

    def grant_lease(self, ttl_seconds, *, keepalive=True, **kw):
        return super().grant_lease(ttl_seconds, keepalive=False, **kw)

    def compare_and_swap(self, key, value, expected_version, *args, **kw):
        if self.cas_delay is not None and self._loop.current() is not None:
            self._loop.sleep(self._loop.rng.uniform(*self.cas_delay))
        before = self.get(key)
        out = super().compare_and_swap(key, value, expected_version, *args, **kw)
        self._on_write(key, None if before is None else before.value, value)
        return out


class ClientSim:
    def __init__(self, seed: int, *, faults: bool = True, drop_p: float | None = None,
                 focus: str | None = None):
        if focus is not None and focus not in FOCI:
            raise ValueError(f"unknown focus {focus}")
        self.seed = seed
        self.loop = loop = SimLoop(seed)
        rng = loop.rng
        self.faults = faults
        self.focus = focus
        self.E, self.Qw, self.Qa = rng.choice(
            CONFIGS if focus is None else
            SPARE_ACKS if focus in ("fence_loss", "change_under_adds") else EQUAL_QUORUMS)
        self.bookies = {f"b{i}": MemoryBookie(f"b{i}") for i in range(NUM_BOOKIES)}
        self.net = SimNet(loop, self.bookies,
                          drop_p=rng.choice([0.0, 0.02, 0.1]) if faults else 0.0,
                          slow_p=rng.choice([0.0, 0.05, 0.2]) if faults else 0.0)
        if drop_p is not None:
            self.net.drop_p = drop_p
        self.store = _SimStore(loop, self._on_metadata_write)
        for b in self.bookies:
            self.store.put(f"bookies/writable/{b}", b"{}")
        self.lid: int | None = None
        self.acked: dict[int, float] = {}          # entry id -> time the app saw the ack
        self.ack_order: list[int] = []
        self.close_time: float | None = None
        self.closed_value: bytes | None = None
        self.closed_by_writer = False              # the CLOSED write: the writer's, from OPEN
        self.writer_closed = False                 # the writer's close() returned
        self.recoveries: list[tuple[str, int, int]] = []   # (who, last, length)
        self.reads: list[tuple[str, int, list[bytes]]] = []
        self.crash_after_change_p = rng.choice([0.0, 0.5, 0.8]) if faults else 0.0
        self.problems: list[str] = []
        if focus is not None:
            loss, self.net.slow_p = FOCI[focus]
            self.net.drop_p, self.net.loss = 0.0, dict(loss)
            self.crash_after_change_p = 1.0

    # -- processes -------------------------------------------------------------------------
    def client(self, owner: str) -> BookKeeper:
        return BookKeeper(store=self.store, transports=SimTransportPool(self.net, owner),
                          conf=SIM_CONF, clock=self.loop.clock,
                          rng=random.Random(self.loop.rng.random()), background=False,
                          call_later=self.loop.call_later_for(owner),
                          executor=SimExecutor(self.loop, owner))

    def writer(self, n: int, gap: float, close: bool, sync_p: float = 0.5) -> None:
        loop, rng = self.loop, self.loop.rng
        bk = self.client("w")
        lh = bk.create_ledger(self.E, self.Qw, self.Qa, password=PASSWORD)
        self.lid = lh.ledger_id
        if self.focus == "fence_loss":       # the writer never hears this bookie's fence
            self.net.cut.add(("w", self.metadata().current_ensemble[0]))
        k = 0
        while k < n:
            loop.sleep(rng.uniform(0.01, gap))
            if rng.random() < sync_p:
                try:
                    e = lh.add_entry(payload(k))
                except errors.BKError:
                    return                       # aborted (fenced, no bookies): stop writing
                self._acked(e, k)
                k += 1
            else:
                for _ in range(rng.randint(1, 6)):
                    fut = lh.add_entry_async(payload(k))
                    fut.add_done_callback(lambda f, k=k: self._async_acked(f, k))
                    k += 1
        if close:
            with contextlib.suppress(errors.BKError):
                lh.close()
                self.writer_closed = True

    def _async_acked(self, fut, k: int) -> None:
        if fut.exception() is None and "w" not in self.loop.dead:
            self._acked(fut.result(), k)

    def _acked(self, e: int, k: int) -> None:
        if e != k:
            self.problems.append(f"add {k} got entry id {e}")
        self.loop.note(f"ack {e}")
        self.acked[e] = self.loop.now
        self.ack_order.append(e)

    def recoverer(self, who: str, attempts: int = 6) -> None:
        loop = self.loop
        bk = self.client(who)
        for _ in range(attempts):
            if self.lid is None:
                loop.sleep(1.0)
                continue
            try:
                rh = bk.open_ledger(self.lid, password=PASSWORD, recovery=True)
            except errors.BKError as exc:
                loop.note(f"{who} recovery failed {type(exc).__name__}")
                loop.sleep(loop.rng.uniform(2, 10))
                continue
            md = rh.metadata
            self.recoveries.append((who, md.last_entry_id, md.length))
            loop.note(f"{who} recovered last={md.last_entry_id}")
            try:
                got = rh.read(0, md.last_entry_id) if md.last_entry_id >= 0 else []
            except errors.BKError as exc:
                loop.note(f"{who} read failed {type(exc).__name__}")
                return
            self.reads.append((who, md.last_entry_id, [x.payload for x in got]))
            return

    def _on_metadata_write(self, key: str, before: bytes | None, value: bytes) -> None:
        if self.lid is None or key != ledger_key(self.lid):
            return
        md = lm.LedgerMetadata.from_json(value)
        task = self.loop.current()
        if md.is_closed:
            if self.closed_value is None:
                self.closed_value, self.close_time = value, self.loop.now
                self.closed_by_writer = (task is not None and task.owner == "w"
                                         and before is not None
                                         and lm.LedgerMetadata.from_json(before).state == lm.OPEN)
            elif value != self.closed_value:
                self.problems.append("closed metadata changed")
        changed = (before is not None
                   and lm.LedgerMetadata.from_json(before).ensembles != md.ensembles)
        if (md.state == lm.IN_RECOVERY and task is not None and task.owner.startswith("r")
                and changed and self.loop.rng.random() < self.crash_after_change_p):
            # a recoverer crashes right after its recovery ensemble change
            # (before it re-sends anything to the replacement), and is
            # restarted a little later (a new process: it starts over)
            again = task.owner + "+"
            self.loop.spawn(self.recoverer, again, owner=again, name="restarted recoverer",
                            delay=self.loop.rng.uniform(1, 10))
            self.loop.crash_here()

    # -- nemesis ---------------------------------------------------------------------------
    def schedule_faults(self) -> None:
        loop, rng, net = self.loop, self.loop.rng, self.net
        if not self.faults:
            return
        for _ in range(rng.randint(0, 3)):
            b = rng.choice(sorted(self.bookies))
            t = rng.uniform(0, 60)
            loop.at(t, net.down.add, b)
            loop.at(t + rng.uniform(1, 40), net.down.discard, b)
        if rng.random() < 0.3:
            b = rng.choice(sorted(self.bookies))
            t = rng.uniform(0, 60)
            loop.at(t, net.cut.add, ("w", b))
            loop.at(t + rng.uniform(5, 40), net.cut.discard, ("w", b))
        if rng.random() < 0.3:
            loop.at(rng.uniform(5, 80), loop.kill, "w")

    # -- run -------------------------------------------------------------------------------
    def start_focused(self) -> None:
        """A schedule aimed at one rare interleaving (``FOCI``): a writer
        adding fast, in pipelined bursts, that never closes (in "crashed_change"
        and "race" it crashes mid-stream, leaving acknowledged entries beyond
        the bookies' LAC for recovery to re-write); its loss of requests of one
        kind; every recovery ensemble change followed by the recoverer's crash.
        "race": a second recoverer starts while the first may be changing the
        ensemble under it.
        "change_under_adds" (no recoverer, the writer closes): the writer, cut
        from one or two bookies of its ensemble, keeps adding in pipelined bursts; the
        change's CAS takes a store round trip, during which the survivors
        acknowledge adds the change then releases (Qw > Qa), and the
        replacement must still get them (I5)."""
        loop, rng = self.loop, self.loop.rng
        if self.focus == "change_under_adds":
            self.store.cas_delay = (0.2, 1.5)
            loop.spawn(self.writer, 150, 0.4, True, 0.2, owner="w", name="writer")
            loop.at(rng.uniform(0.5, 3), self._cut_writer_from_bookies)
            return
        n, gap = 100, 0.2                       # still writing when fenced or killed
        loop.spawn(self.writer, n, gap, False, 0.0 if self.focus == "fence_loss" else 0.5,
                   owner="w", name="writer")
        first = rng.uniform(0.5, 3) if self.focus == "fence_loss" else rng.uniform(2, 10)
        if self.focus != "fence_loss":
            loop.at(rng.uniform(3, 10), loop.kill, "w")
        loop.spawn(self.recoverer, "r0", owner="r0", name="recoverer", delay=first)
        if self.focus == "race":
            loop.spawn(self.recoverer, "r1", owner="r1", name="recoverer",
                       delay=first + rng.uniform(0, 9))

    def _cut_writer_from_bookies(self) -> None:
        """"change_under_adds": the writer loses one bookie of its ensemble,
        sometimes a second one just after (its change queued behind the first)."""
        md, rng = self.metadata(), self.loop.rng
        if md is None:
            return
        for i, b in enumerate(rng.sample(list(md.current_ensemble), rng.choice([1, 2]))):
            self.loop.at(i * rng.uniform(0.05, 1.0), self.net.cut.add, ("w", b))

    def run(self) -> "ClientSim":
        loop, rng = self.loop, self.loop.rng
        if self.focus is not None:
            self.start_focused()
        else:
            n = rng.randint(5, 40)
            gap = rng.choice([0.2, 1.0, 3.0])
            loop.spawn(self.writer, n, gap, rng.random() < 0.5, owner="w", name="writer")
            for i in range(rng.choice([0, 1, 2, 2, 3])):
                loop.spawn(self.recoverer, f"r{i}", owner=f"r{i}", name="recoverer",
                           delay=rng.uniform(0, n * gap / 2 + 5))
            self.schedule_faults()
        try:
            loop.run(until=HEAL_AT)
            self.net.heal()
            loop.run()
            md = self.metadata()
            if not md.is_closed:
                loop.spawn(self.recoverer, "final", owner="final", name="final recoverer")
                loop.run()
            self.check()
        except SimCrash:
            raise InvariantViolation("a crash escaped its task") from None
        return self

    def metadata(self) -> lm.LedgerMetadata | None:
        if self.lid is None:
            return None
        return lm.LedgerMetadata.from_json(self.store.get(ledger_key(self.lid)).value)

    # -- checker ---------------------------------------------------------------------------
    def check(self) -> None:
        if self.problems:
            raise InvariantViolation("; ".join(self.problems))
        if self.lid is None:
            return
        md = self.metadata()
        if not md.is_closed:
            raise InvariantViolation("ledger not closed after the final recovery")
        last = md.last_entry_id
        lost = sorted(e for e in self.acked if e > last)
        if lost:
            late = [e for e in lost if self.close_time is not None and self.acked[e] > self.close_time]
            what = f" ({len(late)} acknowledged to the fenced writer after the close)" if late else ""
            raise InvariantViolation(f"acknowledged entries {lost} beyond closed last entry "
                                     f"{last}{what}")
        if self.ack_order != sorted(self.ack_order):
            raise InvariantViolation(f"acknowledgements out of order: {self.ack_order}")
        # I5's exception.  The simulation destroys no data: a bookie is durable
        # at once (MemoryBookie), a crash (``net.down``) or a partition only
        # makes it unreachable, and nothing wipes one; so a bookie of a write
        # set lacks an entry only if the writer's add of it never took effect
        # there: lost (dropped, the bookie down, the writer cut from it) or
        # refused (fenced), and the writer saw that add fail (so did a late
        # answer, the bookie acting all the same: harmless).  The writer then
        # replaces that bookie from its first unreleased entry on and sends it
        # nothing more, and what it had released stays at Qa copies in the old
        # fragment, as in BookKeeper (re-replicating it is the auditor's job).
        # The excuse is per bookie, not per entry: adds sent while a failed
        # bookie's replacement waits behind another change skip it, and those
        # the first change releases stay in its old fragment ("change_under_
        # adds" seed 4677: b4 fails during b5's change, which releases 33-54,
        # never sent to b4; b4 is replaced from 55).  A bookie the writer never
        # saw fail is excused nothing, and a failed one is never a
        # replacement, so a replacement that stayed healthy holds its whole
        # fragment.
        full = self.writer_closed and self.closed_by_writer
        for e in range(last + 1):
            ens = md.ensemble_for(e)
            holders = [ens[s] for s in write_set(e, len(ens), md.write_quorum)]
            copies = [self._copy(b, e) for b in holders]
            present = [c for c in copies if c is not None]
            if len(present) < md.ack_quorum:
                raise InvariantViolation(f"entry {e} on {len(present)} < Qa replicas {holders}")
            if any(c != payload(e) for c in present):
                raise InvariantViolation(f"entry {e} has copies {present}, wrote {payload(e)!r}")
            missing = [b for b, c in zip(holders, copies)
                       if c is None and ("w", b) not in self.net.failed_adds]
            if full and missing:
                raise InvariantViolation(
                    f"entry {e} of a ledger its writer closed is not on {missing} of its write "
                    f"set {holders} (Qw={md.write_quorum}), no add to which failed")
        outcomes = {(last_, length) for _, last_, length in self.recoveries}
        outcomes.add((last, md.length))
        if len(outcomes) > 1:
            raise InvariantViolation(f"recoveries disagree: {sorted(outcomes)}")
        for who, rlast, got in self.reads:
            if got != [payload(e) for e in range(rlast + 1)]:
                raise InvariantViolation(f"{who} read back {got[:5]}... of 0..{rlast}")
        if not any(who == "final" for who, _, _ in self.reads) and last >= 0:
            self._final_read(last)

    def _copy(self, bookie: str, e: int) -> bytes | None:
        led = self.bookies[bookie].ledgers.get(self.lid)
        row = led.rows.get(e) if led is not None else None
        return None if row is None else row["payload"]

    def _final_read(self, last: int) -> None:
        self.loop.spawn(self.recoverer, "check", owner="check", name="check reader")
        self.loop.run()
        got = [g for who, _, g in self.reads if who == "check"]
        if not got or got[0] != [payload(e) for e in range(last + 1)]:
            raise InvariantViolation(f"a reader could not read 0..{last} back")


# -- planted bugs (test seams, one run each) -------------------------------------------------
class _OutOfOrderAcks(PendingAdds):
    """Releases an entry as soon as it has Qa acks, before its predecessors."""

    def _advance(self):
        super()._advance()
        if self.change is None:
            best = self.lac
            for run in self._runs:
                if run.acks is None:          # a run of one id: its acks are bits
                    if run.mask.bit_count() >= self.ack_quorum:
                        best = max(best, run.first)
                    continue
                done = np.flatnonzero(run.acks.sum(axis=1) >= self.ack_quorum)
                if len(done):
                    best = max(best, run.first + int(done[-1]))
            if best > self.lac:
                self.lac = best
                while self._runs and self._runs[0].last <= self.lac:
                    self._runs.popleft()


class _FirstAnswerCovers(rd.LacCoverage):
    """Fencing declared done after the first answer (#1067): recovery's
    fence phase is the readers' LAC query (``lac_query.read_lac_coverage``
    builds an ``rd.LacCoverage``), so readers cover with one answer too."""

    @property
    def covered(self) -> bool:
        return bool(self.answered)


def _recoverers_do_not_fence(net: SimNet, lac: bool, reads: bool):
    strip = (lambda owner, fence: False if owner != "w" else fence)
    if lac:
        net.plants["lac_fence"] = strip
    if reads:
        net.plants["read_fence"] = strip


_real_resend = ledger_writer.LedgerWriter._resend


def _resend_skips_released(self, chunks, resends, ensemble, bad):
    """The held chunks taken the wrong way round: after
    ``commit_change`` released (and ``_collect_done`` dropped) those the
    survivors acknowledged while the change was pending, so the replacement
    never gets those entries of its fragment."""
    lac = self.core.lac
    return _real_resend(self, [c for c in chunks if c.last > lac], resends, ensemble, bad)


@contextlib.contextmanager
def planted(name: str | None, sim: ClientSim):
    """Apply the planted bug ``name`` to ``sim`` for the duration (recovery_op,
    read_handle and ledger_writer look ``rc``/``rd``/``lm``/``PendingAdds`` up
    at call time, so a patched attribute reaches them)."""
    with contextlib.ExitStack() as stack:
        if name == "unfenced_lac":           # recovery trusts a LAC from a non-fenced bookie
            _recoverers_do_not_fence(sim.net, lac=True, reads=True)
        elif name == "acks_out_of_order":
            stack.enter_context(mock.patch.object(ledger_writer, "PendingAdds", _OutOfOrderAcks))
        elif name == "no_coverage_wait":      # and non-fencing reads (before #2614)
            stack.enter_context(mock.patch.object(rd, "LacCoverage", _FirstAnswerCovers))
            _recoverers_do_not_fence(sim.net, lac=False, reads=True)
        elif name == "read_only_replacements":
            stack.enter_context(mock.patch.object(lm, "recovery_read_bookies",
                                                  lambda md, slot: (md.current_ensemble[slot],)))
            stack.enter_context(mock.patch.object(lm, "recovery_replaced_tail", lambda md: False))
        elif name == "close_ignores_ensemble":
            real = lm.close_by_recovery
            stack.enter_context(mock.patch.object(
                lm, "close_by_recovery", lambda md, last, length, *_a: real(md, last, length)))
        elif name == "resends_skip_released":    # chunks taken after commit_change
            stack.enter_context(mock.patch.object(ledger_writer.LedgerWriter, "_resend",
                                                  _resend_skips_released))
        elif name is not None:
            raise ValueError(f"unknown plant {name}")
        yield


PLANTS = ["unfenced_lac", "acks_out_of_order", "no_coverage_wait", "read_only_replacements",
          "close_ignores_ensemble", "resends_skip_released"]
