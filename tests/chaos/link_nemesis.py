"""Network faults of the chaos nemesis (only on the host topology:
``host_topology.ChaosHosts``, every process on its own test host).

Kinds (``LINK_KINDS``), each drawn from the nemesis's seeded rng, bounded in
time and healed by the nemesis itself (``HostNetwork.faults``):

  partition  both directions, one of these shapes (``SHAPES``):
             writer-bookies     a writer <-> 1-2 bookies (its ensemble change
                                or its blocking; never a false ack)
             writer-etcd        a writer <-> every etcd member while it still
                                reaches the bookies, 0.5-1.6 x its lease (a
                                zombie writer: its lease lapses, a recoverer
                                fences it, its next add must end
                                LedgerFenced/unknown)
             bookie-etcd        a bookie <-> every etcd member for its
                                registration ttl + 1-6 s (its registration
                                lapses while it serves)
             etcd-minority      one etcd member (and sometimes a writer with
                                it) <-> the other members: the minority's
                                clients fail typed, no CAS succeeds there
             recoverer-bookies  a recoverer <-> one bookie (recovery must
                                finish on (Qw - Qa) + 1 coverage)
             autorecovery-etcd  an autorecovery daemon <-> every etcd member,
                                0.3-1.2 x its leader lease (its refresh goes
                                unanswered while the lease may live on: I10)
             2-10 s.
  one_way    replies lost: a bookie's or every etcd member's packets to a
             writer are dropped, the writer's requests still arrive (the
             unknown outcome).  2-8 s.
  loss       5-30 % of the packets into and out of a writer or a bookie are
             dropped at random.  3-10 s.
  stall      a writer cut off from every other host for longer than its
             writer lease (``writer_lease_ttl_s`` + 1-6 s).
  delay      without netem: a userspace TCP relay in the writer's host
             (``tcp_relay.py``: iptables REDIRECT of its connections to the
             relay, which forwards each chunk after a seeded delay), shapes:
             jitter    a writer's connections to every bookie delayed
                       20-300 ms +- jitter; with probability 0-50 % a
                       connection runs 2-5 x slower, so data sent on
                       different connections arrives out of order.  3-10 s.
             stall     a writer's bytes to every bookie and etcd member held
                       for its lease + 1-6 s, then delivered (a writer stalled
                       past its lease: its lease lapses, a recoverer may fence
                       it, then its old adds arrive); healed 1-3 s after.
  netem      delay 20-300 ms +- jitter with 0-25 % reordering toward a
             writer or a bookie, 3-10 s; only where the kernel has netem
             (``link_faults.netem_unavailable_reason()``; this one has not:
             ``delay`` does the same in userspace).

A kind may name one shape: ``partition:writer-etcd`` or ``delay:stall``
(``--faults``) draws only that shape; ``partition`` draws any.

Bound: at most ``max_link_faults`` (default 1) link faults at once, and the
next one no sooner than 2-6 s after the last one healed (drawn when it is
made), so the cut processes get back to work (a writer opens a ledger
again) before the next cut; they do not count against the bookie-fault
bound (a cut link loses no replica's data).  ``counts`` gets the kind, ``shapes`` the ``kind:shape``.
"""
from __future__ import annotations

import collections
from dataclasses import dataclass

from bookie_server.config import BookieConfig
from pybk_spark.config import ClientConfig

from .workers import AUTORECOVERY_LEADER_TTL_S

LINK_KINDS = ["partition", "one_way", "loss", "stall", "delay", "netem"]
LINK_WEIGHTS = [6, 3, 2, 1, 2, 1]
SHAPES = ["writer-bookies", "writer-etcd", "bookie-etcd", "etcd-minority",
          "recoverer-bookies", "autorecovery-etcd"]
DELAY_SHAPES = ["jitter", "stall"]
WRITER_KINDS = ("ledger-writer", "log-writer")


@dataclass
class _LinkRepair:
    due: float
    fault_id: int
    what: str


class LinkNemesis:
    """Mixed into ``Nemesis``: uses its cluster, workers, rng, clock and log."""

    max_link_faults = 1

    def _link_init(self, shapes: list[str]) -> None:
        """``shapes``: the "kind:shape" entries of --faults (restrictions)."""
        self.link_shapes: dict[str, list[str]] = {}
        for ks in shapes:
            kind, shape = ks.split(":", 1)
            if shape not in {"partition": SHAPES, "delay": DELAY_SHAPES}.get(kind, ()):
                raise ValueError(f"unknown fault shape {ks!r}: partition:<one of {SHAPES}> "
                                 f"or delay:<one of {DELAY_SHAPES}>")
            self.link_shapes.setdefault(kind, []).append(shape)
        self._links: list[_LinkRepair] = []
        self._quiet_until = float("-inf")
        self.shapes: collections.Counter = collections.Counter()

    @property
    def _net(self):
        return getattr(self.cluster, "network", None)

    def _link_allowed(self, kind: str) -> bool:
        if self._net is None or self.workers is None or len(self._links) >= self.max_link_faults:
            return False
        if self.clock() < self._quiet_until:
            return False
        if kind == "netem":
            from pybk_spark.cluster.link_faults import netem_unavailable_reason
            return netem_unavailable_reason() is None
        return True

    # -- bookkeeping ------------------------------------------------------------------
    def _cut(self, fid: int, seconds: float, what: str, shape: str,
             bookies: tuple = ()) -> bool:
        """``bookies``: the bookies whose own path to etcd this fault cuts or
        degrades (their registration may lapse: availability.py)."""
        for b in bookies:
            self._open_window(("link", fid, b), b, what)
        due = self.clock() + seconds
        self._links.append(_LinkRepair(due, fid, what))
        self._quiet_until = max(self._quiet_until, due + self.rng.uniform(2, 6))
        self.shapes[shape] += 1
        self.log(f"nemesis: {what} for {seconds:.1f}s")
        return True

    def _do_link_repairs(self, now: float) -> None:
        for r in [r for r in self._links if r.due <= now]:
            self._heal_link(r)

    def _heal_link(self, r: _LinkRepair) -> None:
        try:
            self._net.faults.heal(r.fault_id)
            self.log(f"nemesis: healed {r.what}")
            for key in [k for k in self._open_windows
                        if isinstance(k, tuple) and k[:2] == ("link", r.fault_id)]:
                self._close_window(key)
        except Exception as exc:  # noqa: BLE001 - heal_all retries via cluster.heal
            self.log(f"nemesis: heal of {r.what} failed: {exc!r}")
        finally:
            self._links.remove(r)

    def _heal_links(self) -> None:
        for r in list(self._links):
            self._heal_link(r)

    # -- who is where -------------------------------------------------------------------
    def _workers_of(self, kinds) -> list[str]:
        w = self.workers
        with w._lock:
            return sorted(n for n, p in w.procs.items() if p.poll() is None
                          and w.kind_of.get(n) in kinds and n in self.cluster.worker_host)

    def _host_of(self, worker: str):
        return self.cluster.worker_host[worker]

    def _bookie_hosts(self, k: int) -> list:
        hosts = self.cluster.role_hosts()["bookie"]
        return [hosts[b] for b in self.rng.sample(sorted(hosts), k)]

    def _bookie_id(self, host) -> str:
        return next(b for b, h in self.cluster.role_hosts()["bookie"].items()
                    if h.name == host.name)

    def _etcd_hosts(self) -> list:
        return self.cluster.role_hosts()["etcd"]

    # -- faults -------------------------------------------------------------------------
    def _partition(self) -> bool:
        shape = self.rng.choice(self.link_shapes.get("partition", SHAPES))
        f = self._net.faults
        secs = self.rng.uniform(2, 10)
        if shape == "recoverer-bookies":
            recs = self._workers_of(("recoverer",))
            if not recs:
                return False
            r = self.rng.choice(recs)
            b = self._bookie_hosts(1)
            fid = f.partition([self._host_of(r)], b)
            return self._cut(fid, secs, f"{r} | {b[0].name}", "partition:" + shape)
        if shape == "autorecovery-etcd":
            daemons = self._workers_of(("autorecovery",))
            if not daemons:
                return False
            d = self.rng.choice(daemons)
            fid = f.partition([self._host_of(d)], self._etcd_hosts())
            return self._cut(fid, self.rng.uniform(0.3, 1.2) * AUTORECOVERY_LEADER_TTL_S,
                             f"{d} | etcd", "partition:" + shape)
        if shape == "bookie-etcd":
            b = self._bookie_hosts(1)
            fid = f.partition(b, self._etcd_hosts())
            lapse = BookieConfig().registration_ttl_s + self.rng.uniform(1, 6)  # outlasts the lease
            return self._cut(fid, lapse, f"{b[0].name} | etcd", "partition:" + shape,
                             bookies=(self._bookie_id(b[0]),))
        if shape == "etcd-minority":
            etcd = self._etcd_hosts()
            lone = self.rng.choice(etcd)
            side = [lone]
            writers = self._workers_of(WRITER_KINDS)
            if writers and self.rng.random() < 0.5:
                w = self.rng.choice(writers)
                side.append(self._host_of(w))
            fid = f.partition(side, [h for h in etcd if h is not lone])
            names = ",".join(h.name for h in side)
            return self._cut(fid, secs, f"etcd minority {names} | rest of etcd",
                             "partition:" + shape)
        writers = self._workers_of(WRITER_KINDS)
        if not writers:
            return False
        w = self.rng.choice(writers)
        if shape == "writer-etcd":
            fid = f.partition([self._host_of(w)], self._etcd_hosts())
            lease = ClientConfig().writer_lease_ttl_s          # half of them outlive it
            return self._cut(fid, self.rng.uniform(0.5, 1.6) * lease,
                             f"{w} | etcd (zombie writer)", "partition:" + shape)
        bs = self._bookie_hosts(self.rng.choice([1, 1, 2]))
        fid = f.partition([self._host_of(w)], bs)
        return self._cut(fid, secs, f"{w} | {','.join(h.name for h in bs)}",
                         "partition:" + shape)

    def _one_way(self) -> bool:
        writers = self._workers_of(WRITER_KINDS)
        if not writers:
            return False
        w = self.rng.choice(writers)
        secs = self.rng.uniform(2, 8)
        if self.rng.random() < 0.7:
            src, shape = self._bookie_hosts(1), "bookie->writer"
        else:
            src, shape = self._etcd_hosts(), "etcd->writer"
        fid = self._net.faults.drop(src, [self._host_of(w)])
        return self._cut(fid, secs, f"replies {','.join(h.name for h in src)} -> {w} dropped",
                         "one_way:" + shape)

    def _target(self):
        """A writer's host or a bookie's host (with a label)."""
        writers = self._workers_of(WRITER_KINDS)
        if writers and self.rng.random() < 0.5:
            w = self.rng.choice(writers)
            return self._host_of(w), w, "writer"
        h = self._bookie_hosts(1)[0]
        return h, h.name, "bookie"

    def _if_bookie(self, host, role: str) -> tuple:
        return (self._bookie_id(host),) if role == "bookie" else ()

    def _loss(self) -> bool:
        host, label, role = self._target()
        p = self.rng.uniform(0.05, 0.3)
        fid = self._net.faults.loss(host, p)
        return self._cut(fid, self.rng.uniform(3, 10), f"{label} loses {p:.0%} of packets",
                         "loss:" + role, bookies=self._if_bookie(host, role))

    def _stall(self) -> bool:
        writers = self._workers_of(WRITER_KINDS)
        if not writers:
            return False
        w = self.rng.choice(writers)
        secs = ClientConfig().writer_lease_ttl_s + self.rng.uniform(1, 6)
        fid = self._net.faults.isolate(self._host_of(w))
        return self._cut(fid, secs, f"{w} stalled (cut off from every host, past its lease)",
                         "stall:writer")

    def _delay(self) -> bool:
        writers = self._workers_of(WRITER_KINDS)
        if not writers:
            return False
        shape = self.rng.choice(self.link_shapes.get("delay", DELAY_SHAPES))
        w = self.rng.choice(writers)
        bookies = list(self.cluster.role_hosts()["bookie"].values())
        seed = self.rng.randrange(1 << 31)
        if shape == "stall":
            held = ClientConfig().writer_lease_ttl_s + self.rng.uniform(1, 6)
            fid = self._relay(self._host_of(w), bookies + self._etcd_hosts(), seed=seed,
                              delay_ms=5, stall_s=held)
            return self._cut(fid, held + self.rng.uniform(1, 3),
                             f"{w} stalled: its bytes to bookies and etcd held {held:.1f}s "
                             f"(past its lease), then delivered (relay seed {seed})",
                             "delay:stall")
        delay = self.rng.uniform(20, 300)
        jitter = self.rng.uniform(0, delay / 2)
        reorder = self.rng.choice([0.0, 0.2, 0.5])
        fid = self._relay(self._host_of(w), bookies, seed=seed, delay_ms=delay,
                          jitter_ms=jitter, reorder=reorder)
        return self._cut(fid, self.rng.uniform(3, 10),
                         f"{w} -> bookies delayed {delay:.0f}+-{jitter:.0f} ms, "
                         f"{reorder:.0%} of connections 2-5x slower (relay seed {seed})",
                         "delay:jitter")

    def _relay(self, host, peers, **kw) -> int:
        """The relay fault (tcp_relay.apply); a fake network's ``relay`` in
        the unit tests."""
        fake = getattr(self._net.faults, "relay", None)
        if fake is not None:
            return fake(host, peers, **kw)
        from .tcp_relay import apply
        log_dir = getattr(self, "relay_log_dir", None)
        return apply(self._net.faults, host, peers, log_path=log_dir and
                     f"{log_dir}/relay-{host.name}.log", **kw)

    def _netem(self) -> bool:
        host, label, role = self._target()
        delay = self.rng.uniform(20, 300)
        jitter = self.rng.uniform(0, delay / 2)
        reorder = self.rng.choice([0.0, 0.1, 0.25])
        fid = self._net.faults.netem(host, delay_ms=delay, jitter_ms=jitter, reorder=reorder)
        return self._cut(fid, self.rng.uniform(3, 10),
                         f"netem toward {label}: {delay:.0f}+-{jitter:.0f} ms, "
                         f"reorder {reorder:.0%}", "netem:" + role,
                         bookies=self._if_bookie(host, role))
