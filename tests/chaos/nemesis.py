"""Seeded fault injection against a LocalCluster and the chaos workers.

Fault kinds (``KINDS``):
  bookie_kill      SIGKILL a bookie, restart it 1-6 s later (same data dir).
  bookie_pause     SIGSTOP a bookie (GC pause / partition), SIGCONT 1-8 s later
                   (longer than the client's 5 s add timeout now and then, so
                   the writer's ensemble change runs against a live bookie).
  bookie_torn_tail SIGKILL a bookie, then damage the bytes right after the
                   last complete record of its newest journal file (random
                   garbage, a torn header, a header promising more body than
                   exists, or a record with a wrong CRC), restart 1-4 s later.
                   Only bytes after the last durable record are touched: what
                   a crash in the middle of a group write leaves behind.
                   Destroying fdatasynced records would be a disk loss, which
                   the cookie check (not this harness) covers.
  bookie_disk_full the bookie's disk pushed over its threshold: the shared
                   conf file is rewritten with disk_usage_threshold/lwm =
                   0.001, the bookie is sent SIGHUP (documented: reload the
                   thresholds), the conf is restored as soon as the bookie has
                   re-registered read-only; 3-8 s later SIGHUP again -> the
                   real thresholds -> writable.
  etcd_restart     SIGTERM etcd and start it again on the same data dir/port.
  etcd_pause       SIGSTOP one etcd member, SIGCONT 2-10 s later: a hung member
                   (a disk stall, a paused VM), whose connections stay up while
                   every request to it waits for its timeout, so clients must
                   fail over to the others.  One at a time, never with an
                   etcd_restart, and only once every member is healthy again
                   and 2-6 s have passed since the last resume: a member just
                   resumed may still be catching up, and pausing the leader
                   then stops the quorum (seed 2026112753: a healthy bookie's
                   lease lapsed, a double fault, not a hung member).  With
                   three members no bookie may drop out of the registry (I9:
                   no window); a lone member (loopback) is all of etcd, so
                   there every bookie gets a window.
  writer_kill      SIGKILL a ledger writer or the current leader of a log
                   (the runner starts a successor, which fences the log).
  leader_takeover  start a second leader for a log while the first is alive
                   (the old one must be fenced off: its adds end unknown).
  partition, one_way, loss, stall, delay, netem
                   network faults between test hosts (link_nemesis.py); only
                   on the host topology, where every process has its own
                   host; elsewhere they are never drawn.

Bound (the rule): at most ``max_bookie_faults`` bookies are faulty at once
(killed, paused, torn or read-only), default min(Qa) - 1 over the ledger
configs, so every acknowledged entry keeps a live, writable replica and the
guarantee being checked (Qa - 1 failures lose nothing) is the one promised;
and never more than N - max(E), so an ensemble change always finds a
replacement.  etcd and client faults do not count against it (a client is
not a replica; etcd is restarted, never wiped), nor do link faults (at most
one at a time, see link_nemesis.py).  The loop is bounded by ``until`` and by
``max_faults``; pending repairs are always carried out (``heal_all``), also
on error.
"""
from __future__ import annotations

import os
import signal
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from .availability import FaultWindow
from .link_nemesis import LINK_KINDS, LINK_WEIGHTS, LinkNemesis

KINDS = ["bookie_kill", "bookie_pause", "bookie_torn_tail", "bookie_disk_full",
         "etcd_restart", "etcd_pause", "writer_kill", "leader_takeover", *LINK_KINDS]
WEIGHTS = [4, 4, 2, 2, 1, 1, 2, 1, *LINK_WEIGHTS]
BOOKIE_KINDS = {"bookie_kill", "bookie_pause", "bookie_torn_tail", "bookie_disk_full"}


@dataclass
class _Repair:
    due: float
    bookie: str
    kind: str


class Nemesis(LinkNemesis):
    def __init__(self, cluster, workers, rng, *, max_bookie_faults: int = 1,
                 clock: Callable[[], float] = time.monotonic,
                 sleep: Callable[[float], None] = time.sleep,
                 kinds: list[str] | None = None, log: Callable[[str], None] = print):
        self.cluster = cluster
        self.workers = workers          # runner.Workers (kill_writer / takeover) or None
        self.rng = rng
        self.max_bookie_faults = max(0, max_bookie_faults)
        self.clock, self.sleep, self.log = clock, sleep, log
        shapes = [k for k in kinds or () if ":" in k]
        kinds = list(dict.fromkeys(k.split(":", 1)[0] for k in kinds or ()))
        unknown = sorted(set(kinds) - set(KINDS))
        if unknown:
            raise ValueError(f"unknown fault kind(s) {unknown}: choose from {KINDS}")
        self.kinds = kinds or KINDS
        self.counts: dict[str, int] = {k: 0 for k in KINDS}
        self._repairs: list[_Repair] = []
        self._etcd_paused: list[tuple[float, object]] = []   # (due, member) to SIGCONT
        self._kill: Callable[[int, int], None] = os.kill     # a seam for the unit tests
        self._resume_backstop = True        # a real-time SIGCONT too (off in unit tests)
        self._etcd_calm_at = 0.0            # no etcd pause before this (clock)
        self.windows: list[FaultWindow] = []       # faults that may unregister a bookie (I9)
        self._open_windows: dict[object, FaultWindow] = {}
        self._link_init(shapes)
        self._stop = False

    def stop(self) -> None:
        self._stop = True

    # -- main loop ----------------------------------------------------------------------
    def run(self, until: float, max_faults: int = 10_000) -> dict[str, int]:
        try:
            injected = 0
            while not self._stop and self.clock() < until and injected < max_faults:
                self._do_repairs(self.clock())
                kinds = [k for k in self.kinds if self._allowed(k)]
                if kinds:
                    weights = [WEIGHTS[KINDS.index(k)] for k in kinds]
                    kind = self.rng.choices(kinds, weights)[0]
                    try:
                        if getattr(self, "_" + kind)():
                            self.counts[kind] += 1
                            injected += 1
                    except Exception as exc:  # noqa: BLE001 - a fault that failed is logged
                        text = repr(exc)    # an etcd timeout carries its whole log tail
                        self.log(f"nemesis: {kind} failed: "
                                 f"{text if len(text) <= 400 else text[:400] + '...'}")
                self._wait(self.rng.uniform(1.0, 4.0), until)
        finally:
            self.heal_all()
        return dict(self.counts)

    def _wait(self, seconds: float, until: float) -> None:
        end = min(self.clock() + seconds, until)
        while not self._stop and self.clock() < end:
            self._do_repairs(self.clock())
            self.sleep(min(0.2, max(0.0, end - self.clock())))

    def _allowed(self, kind: str) -> bool:
        if kind in BOOKIE_KINDS:
            return len(self._repairs) < self.max_bookie_faults
        if kind in ("writer_kill", "leader_takeover"):
            return self.workers is not None
        if kind == "etcd_restart":
            # a restart waits until the member is healthy, which a cut link can
            # hold off for its whole ready timeout (90 s): the one nemesis loop
            # would stall, and with it the heal of that very link (seed
            # 2026112721: a 9.8 s etcd-minority cut lasted 96 s); a paused
            # member would hold off the quorum the same way
            return not getattr(self, "_links", None) and not self._etcd_paused
        if kind == "etcd_pause":
            return not self._etcd_paused and self.clock() >= self._etcd_calm_at
        if kind in LINK_KINDS:
            return self._link_allowed(kind)
        return True

    # -- fault windows (availability.py) ------------------------------------------------
    def _open_window(self, key, bookie: str, what: str) -> None:
        self._open_windows.setdefault(key, FaultWindow(bookie, self.clock(), what=what))

    def _close_window(self, key) -> None:
        w = self._open_windows.pop(key, None)
        if w is not None:
            self.windows.append(FaultWindow(w.bookie, w.start, self.clock(), w.what))

    def all_windows(self) -> list[FaultWindow]:
        """Closed windows and the open ones (open-ended)."""
        return [*self.windows, *self._open_windows.values()]

    def _do_repairs(self, now: float) -> None:
        for r in [r for r in self._repairs if r.due <= now]:
            self._repair(r)
        for due, member in [p for p in self._etcd_paused if p[0] <= now]:
            self._resume_etcd(member)
        self._do_link_repairs(now)

    def _repair(self, r: _Repair, retry: bool = True) -> None:
        """A failed restart (a bookie started while a link fault cuts it off
        from etcd exits: it cannot register) is retried 2 s later, so the
        bookie keeps counting against the bound until it is back; under
        ``heal_all`` (``retry=False``) ``cluster.heal`` restarts it."""
        try:
            if r.kind == "pause":
                self.cluster.resume_bookie(r.bookie)
            elif r.kind == "disk":
                self._sighup(r.bookie)
                self.cluster.wait_registered(r.bookie, read_only=False, timeout=60)
            else:
                self.cluster.start_bookie(r.bookie)
            self.log(f"nemesis: {r.bookie} repaired ({r.kind})")
            self._close_window(r.bookie)
        except Exception as exc:  # noqa: BLE001 - heal_all retries via cluster.heal
            self.log(f"nemesis: repair of {r.bookie} ({r.kind}) failed: {exc!r}")
            if retry and r.kind != "pause":
                self._repairs.append(_Repair(self.clock() + 2.0, r.bookie, r.kind))
        finally:
            self._repairs.remove(r)

    def heal_all(self) -> None:
        for _due, member in list(self._etcd_paused):
            self._resume_etcd(member)
        self._heal_links()
        for r in list(self._repairs):
            self._repair(r, retry=False)
        self.cluster.heal()
        for key in list(self._open_windows):     # heal restarted and waited for every bookie
            self._close_window(key)

    def _victim(self) -> str:
        busy = {r.bookie for r in self._repairs}
        return self.rng.choice([b for b in self.cluster.bookie_ids if b not in busy])

    # -- faults -------------------------------------------------------------------------
    def _bookie_kill(self) -> bool:
        b = self._victim()
        self._open_window(b, b, "kill")
        self.cluster.kill_bookie(b, signal.SIGKILL)
        self._repairs.append(_Repair(self.clock() + self.rng.uniform(1, 6), b, "kill"))
        self.log(f"nemesis: SIGKILL {b}")
        return True

    def _bookie_pause(self) -> bool:
        b = self._victim()
        self._open_window(b, b, "pause")
        self.cluster.stop_bookie(b)
        self._repairs.append(_Repair(self.clock() + self.rng.uniform(1, 8), b, "pause"))
        self.log(f"nemesis: SIGSTOP {b}")
        return True

    def _bookie_torn_tail(self) -> bool:
        b = self._victim()
        self._open_window(b, b, "torn tail")
        self.cluster.kill_bookie(b, signal.SIGKILL)
        how = tear_journal_tail(self.cluster.bookie_data_dir(b), self.rng)
        self._repairs.append(_Repair(self.clock() + self.rng.uniform(1, 4), b, "torn"))
        self.log(f"nemesis: SIGKILL {b} + journal tail {how}")
        return True

    def _bookie_disk_full(self) -> bool:
        b = self._victim()
        conf = self.cluster.data_dir / "bookie.conf"
        original = conf.read_text()
        self._repairs.append(_Repair(self.clock() + self.rng.uniform(3, 8), b, "disk"))
        try:
            conf.write_text(original + "disk_usage_threshold = 0.001\ndisk_usage_lwm = 0.001\n")
            self._sighup(b)
            self.cluster.wait_registered(b, read_only=True, timeout=30)
        finally:
            conf.write_text(original)
        self.log(f"nemesis: disk of {b} over threshold (read-only)")
        return True

    def _sighup(self, b: str) -> None:
        pid = self.cluster.bookie_pid(b)
        if pid is not None:
            os.kill(pid, signal.SIGHUP)

    def _etcd_restart(self) -> bool:
        self.cluster.restart_etcd()
        self.log("nemesis: etcd restarted")
        return True

    def _etcd_members(self) -> list:
        etcd = self.cluster.etcd
        return list(getattr(etcd, "members", [etcd]))

    def _etcd_pause(self) -> bool:
        members = [m for m in self._etcd_members() if m.running()]
        if not members or not all(m.healthy() for m in self._etcd_members()):
            return False
        member = self.rng.choice(members)
        secs = self.rng.uniform(2, 10)
        if len(self._etcd_members()) == 1:          # all of etcd: every lease may lapse
            for b in self.cluster.bookie_ids:
                self._open_window(("etcd_pause", b), b, "etcd pause")
        self._kill(member.pid, signal.SIGSTOP)
        self._etcd_paused.append((self.clock() + secs, member))
        if self._resume_backstop:
            # the loop resumes it at the due time, unless a repair that waits for
            # a registration (which may need this very member) holds the loop:
            # seed 2026112725 had a 2.5 s pause last 12 s.  The timer only
            # sends SIGCONT; the loop still does the bookkeeping.
            pid = member.pid
            timer = threading.Timer(secs, lambda: self._kill(pid, signal.SIGCONT))
            timer.daemon = True
            timer.start()
        self.log(f"nemesis: SIGSTOP etcd member {member.endpoint} for {secs:.1f}s")
        return True

    def _resume_etcd(self, member) -> None:
        self._etcd_paused = [p for p in self._etcd_paused if p[1] is not member]
        if member.running():
            self._kill(member.pid, signal.SIGCONT)
        for key in [k for k in self._open_windows if isinstance(k, tuple)
                    and k[0] == "etcd_pause"]:
            self._close_window(key)
        self._etcd_calm_at = self.clock() + self.rng.uniform(2, 6)
        self.log(f"nemesis: SIGCONT etcd member {member.endpoint}")

    def _writer_kill(self) -> bool:
        name = self.workers.kill_random_writer(self.rng)
        if name:
            self.log(f"nemesis: SIGKILL writer {name}")
        return bool(name)

    def _leader_takeover(self) -> bool:
        name = self.workers.takeover(self.rng)
        if name:
            self.log(f"nemesis: new leader {name} while the old one is alive")
        return bool(name)


# -- journal tail damage ----------------------------------------------------------------------
def tear_journal_tail(data_dir: Path, rng) -> str:
    """Damage the bytes after the last complete record of the newest journal
    file of a STOPPED bookie; returns a description."""
    from bookie_server.journal.journal import HEADER, crc_of, list_files, file_name
    jdir = _journal_dir(Path(data_dir))
    if jdir is None:
        return "(no journal)"
    seqs = [s for s in list_files(str(jdir)) if (jdir / file_name(s)).stat().st_size > 0]
    if not seqs:
        return "(empty journal)"
    path = jdir / file_name(seqs[-1])
    end = _end_of_records(path, HEADER, crc_of)
    how = rng.choice(["garbage", "torn_header", "short_body", "bad_crc"])
    if how == "garbage":
        junk = bytes([rng.randrange(1, 256)]) + rng.randbytes(rng.randrange(1, 300))
    elif how == "torn_header":
        junk = HEADER.pack(100, 12345, 1)[: rng.randrange(1, HEADER.size)]
    elif how == "short_body":
        junk = HEADER.pack(4096, 0, 1) + rng.randbytes(rng.randrange(1, 100))
    else:
        body = rng.randbytes(rng.randrange(1, 200))
        junk = HEADER.pack(len(body), crc_of(1, body) ^ 0x5A5A, 1) + body
    fd = os.open(path, os.O_WRONLY)
    try:
        os.pwrite(fd, junk, end)
        os.fsync(fd)
    finally:
        os.close(fd)
    return f"{how} ({len(junk)} bytes at {path.name}:{end})"


def _journal_dir(data_dir: Path) -> Path | None:
    for cand in [data_dir / "journal", data_dir]:
        if cand.is_dir() and any(p.suffix == ".jnl" for p in cand.iterdir()):
            return cand
    found = sorted({p.parent for p in data_dir.rglob("*.jnl")})
    return found[0] if found else None


def _end_of_records(path: Path, header, crc_of) -> int:
    data = path.read_bytes()
    pos = 0
    while pos + header.size <= len(data):
        length, crc, rtype = header.unpack_from(data, pos)
        if length == 0 and crc == 0 and rtype == 0:
            break
        body = data[pos + header.size: pos + header.size + length]
        if len(body) < length or crc_of(rtype, body) != crc:
            break
        pos += header.size + length
    return pos
