"""Deterministic simulation of the production log writer and reader.

Theory of operation
-------------------
The same world as ``ClientSim`` (client_sim.py: the real client on one
seeded loop, in-memory bookies, the metadata twin, the same nemesis), with
``LogWriter``/``LogReader`` on top.  Leader ``L0`` opens log ``log`` and
appends records ``L0-<k>`` (a seeded roll policy rolls every 3-10 records);
at a seeded time ``L1`` opens it too (its open fences and recovers the tail:
``L0`` is deposed) and appends ``L1-<k>``; either may crash.  A tailing
reader follows the log meanwhile.  After the heal a last leader opens the
log (recovering whatever was left open) and closes it, and a fresh reader
reads it whole.  Checked:

  L1 every acknowledged record is in the final log (none lost);
  L2 no record appears twice;
  L3 each leader's records appear in the order it appended them, and
     acknowledged positions increase with that order (nothing reordered);
  L4 what the tailing reader saw is a prefix of the final log.

The final log is read by a fresh reader to the end (past every segment of
the closed log), not for a fixed time: a slow schedule's reads take long.

``RetainedLogSim`` runs the same schedules on a log with a small
``retention.bytes``, so every roll of the real ``LogWriter`` also drops old
segments (protocol/log_retention.py) while leaders fence each other and the
nemesis strikes.  L1 then holds for every record acknowledged in a segment
retention has not dropped (absolute index >= the final
``truncated_ledgers``); what the tailing reader saw is some records that
retention dropped, then a prefix of the final log; and no record is
acknowledged in a ledger that retention had already dropped.
"""
from __future__ import annotations

from pybk_spark import errors
from pybk_spark.logs.log_reader import LogReader
from pybk_spark.logs.log_writer import RollPolicy, open_log_writer

from sim.client_sim import HEAL_AT, PASSWORD, ClientSim, InvariantViolation

LOG = "log"


class LogSim(ClientSim):
    def __init__(self, seed: int, **kw):
        super().__init__(seed, **kw)
        self.log_acked: dict[bytes, tuple] = {}      # payload -> position
        self.acked_when: dict[bytes, tuple] = {}     # payload -> (sim time, ledger id)
        self.appended: dict[str, list[bytes]] = {}   # leader -> payloads acked, in order
        self.tailed: list[bytes] = []
        self.final: list[bytes] | None = None
        self.roll_every = self.loop.rng.choice([3, 5, 10])

    def leader(self, who: str, n: int, gap: float) -> None:
        loop, rng = self.loop, self.loop.rng
        bk = self.client(who)
        w = None
        for _ in range(5):
            try:
                w = open_log_writer(bk, LOG, ensemble=self.E, write_quorum=self.Qw,
                                       ack_quorum=self.Qa, password=PASSWORD,
                                       roll_policy=RollPolicy(max_entries=self.roll_every),
                                       clock=loop.clock)
                break
            except errors.BKError as exc:
                loop.note(f"{who} open failed {type(exc).__name__}")
                loop.sleep(rng.uniform(2, 10))
        if w is None:
            return
        loop.note(f"{who} leads")
        self.appended.setdefault(who, [])
        failures = 0
        for k in range(n):
            if who == "final":
                break
            loop.sleep(rng.uniform(0.01, gap))
            record = b"%s-%d" % (who.encode(), k)
            try:
                pos = w.append(record)
            except errors.BKError as exc:
                loop.note(f"{who} append failed {type(exc).__name__}")
                failures += 1
                if isinstance(exc, errors.LedgerFenced) or failures > 3:
                    return
                continue
            if who in loop.dead:
                return
            at = (pos.ledger_index, pos.entry_id)
            loop.note(f"{who} acked {record.decode()} at {at}")
            self.log_acked[record] = at
            self.acked_when[record] = (loop.now, pos.ledger_id)
            self.appended[who].append(record)
        try:
            w.close()
        except errors.BKError as exc:
            loop.note(f"{who} close failed {type(exc).__name__}")

    def tail(self, who: str, until: float, out: list, to_the_end: bool = False) -> None:
        """Follow the log until ``until`` (sim time); ``to_the_end``: stop
        once the reader is past every segment (the final check, after the
        last leader closed the log), ``until`` then only a safety cap."""
        loop = self.loop
        bk = self.client(who)
        reader = None
        while loop.now < until:
            try:
                if reader is None:
                    # (re)opened from the start; the log may not exist yet:
                    # its first leader's open can fail and be retried later
                    reader = LogReader(bk, LOG, "earliest", password=PASSWORD,
                                       poll_timeout_s=1.0)
                    out.clear()
                _index, lid, batch = reader.read_batch(timeout_s=1.0)
            except errors.BKError as exc:
                loop.note(f"{who} read failed {type(exc).__name__}")
                loop.sleep(1.0)
                reader = None
                continue
            if batch is not None:
                out.extend(batch.column("payload").to_pylist())
            elif to_the_end and lid == -1:
                return

    def run(self) -> "LogSim":
        loop, rng = self.loop, self.loop.rng
        n, gap = rng.randint(5, 30), rng.choice([0.2, 1.0, 3.0])
        loop.spawn(self.leader, "L0", n, gap, owner="L0", name="leader")
        if rng.random() < 0.7:
            loop.spawn(self.leader, "L1", n, gap, owner="L1", name="leader",
                       delay=rng.uniform(1, n * gap + 5))
        loop.spawn(self.tail, "T", HEAL_AT, self.tailed, owner="T", name="tail",
                   delay=rng.uniform(0, 10))
        self.schedule_faults()
        if self.faults and rng.random() < 0.3:
            loop.at(rng.uniform(5, 80), loop.kill, "L0")
        loop.run(until=HEAL_AT)
        self.net.heal()
        loop.run()
        loop.spawn(self.leader, "final", 0, 0.0, owner="final", name="final leader")
        loop.run()
        final: list = []
        # read to the end, however slow this schedule's network (seed 2006937:
        # 30 s of sim time ended before the last segment, a false "lost")
        loop.spawn(self.tail, "check", loop.now + 3600, final, True, owner="check",
                   name="check reader")
        loop.run()
        self.final = final
        self.check_log()
        return self

    def check_log(self) -> None:
        final = self.final or []
        if len(set(final)) != len(final):
            dup = sorted({r for r in final if final.count(r) > 1})
            raise InvariantViolation(f"records appear twice: {dup[:5]}")
        lost = sorted(r for r in self.log_acked if r not in set(final))
        if lost:
            raise InvariantViolation(f"acknowledged records lost: {lost[:8]}")
        where = {r: i for i, r in enumerate(final)}
        for who, recs in self.appended.items():
            idx = [where[r] for r in recs]
            if idx != sorted(idx):
                raise InvariantViolation(f"{who}'s records reordered in the log")
            pos = [self.log_acked[r] for r in recs]
            if pos != sorted(pos):
                raise InvariantViolation(f"{who}'s acknowledged positions not increasing: {pos}")
        for who in self.appended:
            ks = [int(r.rsplit(b"-", 1)[1]) for r in final if r.rsplit(b"-", 1)[0] == who.encode()]
            if ks != sorted(ks):
                raise InvariantViolation(f"{who}'s records out of order in the log: {ks}")
        if self.tailed != final[:len(self.tailed)]:
            raise InvariantViolation(f"the tailing reader saw {self.tailed[:6]}..., not a prefix "
                                     f"of the log {final[:6]}...")


class RetainedLogSim(LogSim):
    """LogSim on a log whose retention keeps only its newest few records."""

    def run(self) -> "RetainedLogSim":
        from pybk_spark.logs import log, truncation
        store = self.client("setup").metadata_store
        log.read_or_create_log(store, LOG, self.loop.rng)
        # records are 4-8 bytes, 3-10 a segment: keep 0-2 closed segments or so
        truncation.set_log_retention(store, LOG, nbytes=self.loop.rng.choice([0, 8, 24]))
        self.dropped_at: dict[int, float] = {}      # ledger id -> sim time retention dropped it
        apply = truncation.apply_retention

        def recorded(*args, **kw):
            dropped = apply(*args, **kw)
            for ledger_id in dropped:
                self.dropped_at.setdefault(ledger_id, self.loop.now)
            return dropped
        truncation.apply_retention = recorded       # what LogWriter's rolls call
        try:
            return super().run()
        finally:
            truncation.apply_retention = apply

    def check_log(self) -> None:
        from pybk_spark.logs.log import read_log
        final = self.final or []
        md = read_log(self.client("check").metadata_store, LOG)[0]
        kept = set(final)
        dropped = {r for r, (index, _) in self.log_acked.items() if index < md.truncated_ledgers}
        lost = sorted(r for r, (index, _) in self.log_acked.items()
                      if index >= md.truncated_ledgers and r not in kept)
        if lost:
            raise InvariantViolation(f"acknowledged records lost (not dropped by retention, "
                                     f"{md.truncated_ledgers} segments dropped): {lost[:8]}")
        if dropped & kept:
            raise InvariantViolation(f"records of dropped segments still read: "
                                     f"{sorted(dropped & kept)[:5]}")
        late = sorted(r for r, (t, lid) in self.acked_when.items()
                      if lid in self.dropped_at and self.dropped_at[lid] <= t)
        if late:
            raise InvariantViolation(f"acknowledged in a ledger retention had already dropped: "
                                     f"{late[:5]}")
        seen = self.tailed
        cut = 0
        while cut < len(seen) and seen[cut] not in kept:
            cut += 1
        self.log_acked = {r: at for r, at in self.log_acked.items() if r in kept}
        self.appended = {who: [r for r in recs if r in kept] for who, recs in self.appended.items()}
        self.tailed = seen[cut:]
        super().check_log()
