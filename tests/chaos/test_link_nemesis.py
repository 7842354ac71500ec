"""The nemesis's link faults without processes: a fake network records the
faults, an injected clock drives the loop.  Seeded (same seed, same
schedule), bounded (at most one link fault at once, each healed at its
deadline), everything healed at the end, counted by kind and shape, and
never drawn where there is no host network."""
from __future__ import annotations

import random
import signal
import threading
from types import SimpleNamespace

import pytest

from .link_nemesis import LINK_KINDS, SHAPES
from .nemesis import Nemesis


class FakeFaults:
    def __init__(self, clock):
        self.clock, self.active, self.log, self.max_active = clock, {}, [], 0
        self._n = 0

    def _add(self, *what):
        self._n += 1
        self.active[self._n] = what
        self.log.append((round(self.clock(), 3), *what))
        self.max_active = max(self.max_active, len(self.active))
        return self._n

    def partition(self, a, b):
        return self._add("partition", _n(a), _n(b))

    def drop(self, a, b):
        return self._add("drop", _n(a), _n(b))

    def isolate(self, h):
        return self._add("isolate", h.name)

    def loss(self, h, p):
        return self._add("loss", h.name)

    def relay(self, h, peers, **kw):
        return self._add("relay", h.name, _n(peers))

    def netem(self, h, **kw):
        return self._add("netem", h.name)

    def heal(self, fid):
        return self.active.pop(fid, None) is not None

    def heal_all(self):
        n = len(self.active)
        self.active.clear()
        return n


def _n(hosts):
    return tuple(h.name for h in hosts)


class Proc:
    def poll(self):
        return None


def _setup(seed, kinds, with_network=True):
    now = [0.0]
    clock = lambda: now[0]  # noqa: E731

    def sleep(s):
        now[0] += max(s, 0.01)
    faults = FakeFaults(clock)
    host = lambda n: SimpleNamespace(name=n)  # noqa: E731
    workers = SimpleNamespace(_lock=threading.Lock(),
                              procs={n: Proc() for n in ("lw-0", "loga-0", "rec-0", "ar-0")},
                              kind_of={"lw-0": "ledger-writer", "loga-0": "log-writer",
                                       "rec-0": "recoverer", "ar-0": "autorecovery"})
    cluster = SimpleNamespace(
        bookie_ids=[f"bookie-{i}" for i in range(1, 6)],
        worker_host={n: host("h-" + n) for n in workers.procs},
        role_hosts=lambda: {"etcd": [host(f"etcd-{i}") for i in (1, 2, 3)],
                            "bookie": {f"bookie-{i}": host(f"bookie-{i}") for i in range(1, 6)}},
        heal=lambda: faults.heal_all())
    if with_network:
        cluster.network = SimpleNamespace(faults=faults)
    nem = Nemesis(cluster, workers, random.Random(seed), clock=clock, sleep=sleep,
                  kinds=kinds, log=lambda m: None)
    return nem, faults


def test_link_faults_are_seeded_bounded_and_healed():
    kinds = [k for k in LINK_KINDS if k != "netem"]
    nem, faults = _setup(5, kinds)
    counts = nem.run(until=300.0)
    assert faults.max_active == 1 and not faults.active and not nem._links
    assert set(k for k, v in counts.items() if v) <= set(kinds) and sum(counts.values()) > 5
    assert sum(nem.shapes.values()) == sum(counts.values())
    assert {s.split(":")[0] for s in nem.shapes} <= set(kinds)
    again, faults2 = _setup(5, kinds)
    again.run(until=300.0)
    assert faults2.log == faults.log                    # same seed, same schedule


def test_a_shape_restricts_the_partition():
    nem, faults = _setup(3, ["partition:writer-etcd"])
    nem.run(until=120.0)
    assert set(nem.shapes) == {"partition:writer-etcd"}
    assert all(f[1] == "partition" and f[3] == ("etcd-1", "etcd-2", "etcd-3")
               for f in faults.log)
    with pytest.raises(ValueError, match="shape"):
        _setup(3, ["partition:nowhere"])
    with pytest.raises(ValueError, match="kind"):
        _setup(3, ["partitions"])
    assert "writer-etcd" in SHAPES


def test_an_autorecovery_daemon_is_cut_from_etcd_for_about_its_lease():
    nem, faults = _setup(4, ["partition:autorecovery-etcd"])
    nem.run(until=120.0)
    assert set(nem.shapes) == {"partition:autorecovery-etcd"} and faults.log
    assert all(f[1] == "partition" and f[2] == ("h-ar-0",) and f[3] == ("etcd-1", "etcd-2",
                                                                          "etcd-3")
               for f in faults.log)


def test_no_link_faults_without_a_host_network():
    nem, faults = _setup(5, LINK_KINDS, with_network=False)
    assert sum(nem.run(until=60.0).values()) == 0 and not faults.log


def test_no_etcd_restart_while_a_link_is_cut():
    """A restart waits for the member's health, which a cut link holds off:
    the nemesis would stall with the cut unhealed (seed 2026112721)."""
    restarts = []
    nem, faults = _setup(7, ["partition", "etcd_restart"])
    nem.cluster.restart_etcd = lambda: restarts.append(
        (round(nem.clock(), 3), bool(faults.active)))
    nem.run(until=300.0)
    assert restarts and not any(cut for _, cut in restarts)


def test_etcd_pauses_one_member_at_a_time_and_always_resumes_it():
    members = [SimpleNamespace(endpoint=f"etcd-{i}:2379", pid=100 + i,
                               running=lambda: True, healthy=lambda: True) for i in (1, 2, 3)]
    nem, _faults = _setup(11, ["etcd_pause"])
    nem.cluster.etcd = SimpleNamespace(members=members)
    sent = []
    nem._kill = lambda pid, sig: sent.append((round(nem.clock(), 3), pid, sig))
    nem._resume_backstop = False
    counts = nem.run(until=120.0)
    assert counts["etcd_pause"] > 3 and not nem._etcd_paused
    paused = set()
    for _t, pid, sig in sent:              # stop, cont, stop, cont, ...: never two at once
        if sig == signal.SIGSTOP:
            assert not paused
            paused.add(pid)
        else:
            assert paused == {pid}
            paused.clear()
    assert not paused and not nem.windows        # three members: no I9 window
    stops = [t for t, _pid, sig in sent if sig == signal.SIGSTOP]
    conts = [t for t, _pid, sig in sent if sig == signal.SIGCONT]
    assert all(nxt - cont >= 2.0 for cont, nxt in zip(conts, stops[1:]))   # a calm between


def test_a_lone_etcd_pause_opens_a_window_for_every_bookie():
    lone = SimpleNamespace(endpoint="etcd:2379", pid=100, running=lambda: True,
                           healthy=lambda: True)
    nem, _faults = _setup(12, ["etcd_pause"])
    nem.cluster.etcd = lone
    nem._kill = lambda pid, sig: None
    nem._resume_backstop = False
    nem.run(until=20.0)
    assert {w.bookie for w in nem.windows} == set(nem.cluster.bookie_ids)
    assert all(w.what == "etcd pause" and w.end > w.start for w in nem.windows)


def test_etcd_pause_is_drawn_by_default():
    nem, _faults = _setup(13, None)
    assert "etcd_pause" in nem.kinds
