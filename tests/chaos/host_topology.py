"""The chaos topology on separate test hosts: every etcd member, every bookie
and every worker process on its own network namespace
(``pybk_spark.cluster.host_cluster`` / ``hosts``), so that link faults
(``HostNetwork.faults``) can cut any pair of them.

``ChaosHosts`` is a ``HostCluster`` with the process-control surface the
nemesis and the runner use on a ``LocalCluster`` (kill/stop/resume a bookie,
its pid and data dir, read-only-aware registration waits, restart etcd, heal)
plus worker placement: ``spawn_worker(name, argv, ...)`` starts a worker on a
host of its own, reusing a worker host only once every process started on
it has exited (a successor never shares a host with the leader it fences, so
a partition of one never hits the other).  ``role_hosts`` tells the nemesis
who is where.

``unavailable_reason()`` says why this topology cannot run here (no
namespaces, no iptables, no etcd binary); the runner then falls back to the
loopback ``LocalCluster`` and prints the reason.
"""
from __future__ import annotations

import signal
import subprocess
import time
from pathlib import Path
from typing import Optional

from pybk_spark.cluster.registration import fresh_registration
from pybk_spark.cluster.host_cluster import HostCluster


def unavailable_reason() -> Optional[str]:
    from pybk_spark.cluster import hosts, link_faults
    reason = hosts.unavailable_reason() or link_faults.unavailable_reason()
    if reason is None:
        from pybk_spark.cluster.etcd_process import EtcdNotFound, find_etcd_binary
        try:
            find_etcd_binary()
        except EtcdNotFound as exc:
            reason = str(exc)
    return reason


class ChaosHosts(HostCluster):
    def __init__(self, data_dir, *, num_bookies: int = 5, bookie_conf: dict | None = None,
                 etcd_members: int = 3, **kw):
        super().__init__(data_dir, etcd_members=etcd_members, num_bookies=num_bookies,
                         bookie_conf=bookie_conf, **kw)
        self._frozen: set[str] = set()
        self._etcd_turn = 0
        self._worker_hosts: dict = {}          # host name -> [Popen, ...]
        self.worker_host: dict[str, object] = {}   # worker name -> Host

    # -- the LocalCluster surface the chaos harness uses -----------------------------------
    def stop(self) -> None:
        self.close()

    def bookie_pid(self, bookie_id: str) -> Optional[int]:
        b = self.bookies[bookie_id]
        return b.proc.pid if b.running() else None

    def bookie_data_dir(self, bookie_id: str) -> Path:
        return self.bookies[bookie_id].data_dir

    def bookie_address(self, bookie_id: str) -> str:
        return self.bookies[bookie_id].address

    def kill_bookie(self, bookie_id: str, sig: int = signal.SIGKILL) -> None:
        b = self.bookies[bookie_id]
        if b.running():
            _signal(b.proc, signal.SIGCONT)
            _signal(b.proc, sig)
        self._frozen.discard(bookie_id)
        self._reap(b, grace=15.0)

    def stop_bookie(self, bookie_id: str) -> None:
        b = self.bookies[bookie_id]
        if b.running():
            _signal(b.proc, signal.SIGSTOP)
            self._frozen.add(bookie_id)

    def resume_bookie(self, bookie_id: str) -> None:
        b = self.bookies[bookie_id]
        self._frozen.discard(bookie_id)
        if b.running():
            _signal(b.proc, signal.SIGCONT)

    def restart_etcd(self) -> None:
        """Restart one member (SIGTERM, same data dir), round robin."""
        member = self.etcd.members[self._etcd_turn % len(self.etcd.members)]
        self._etcd_turn += 1
        member.restart()

    def wait_registered(self, bookie_id: str, read_only: bool | None = None,
                        timeout: float | None = None) -> dict:
        return self._wait_registered(bookie_id, 0, timeout, read_only)

    def _wait_registered(self, bookie_id: str, since: int, timeout: float | None = None,
                         read_only: bool | None = None) -> dict:
        b = self.bookies[bookie_id]
        timeout = timeout or self.ready_timeout
        deadline = time.monotonic() + timeout
        delay = 0.05
        while True:
            if not b.running():
                raise RuntimeError(f"{bookie_id} is not running (log {b.log_path})")
            registration = fresh_registration(self.store, bookie_id, since, read_only)
            if registration is not None:
                return registration
            if time.monotonic() > deadline:
                raise RuntimeError(f"{bookie_id} not registered ({read_only=}) after "
                                   f"{timeout}s (log {b.log_path})")
            time.sleep(delay)
            delay = min(delay * 2, 0.3)

    def heal(self) -> list[str]:
        """Heal every link fault, start stopped etcd members, resume frozen
        bookies, restart dead ones, wait until all are registered."""
        healed = []
        if self.network.heal():
            healed.append("links")
        for m in self.etcd.members:
            if not m.running():
                m.start()
                healed.append(m.name)
        for bid in list(self._frozen):
            self.resume_bookie(bid)
            healed.append(bid)
        for bid, b in self.bookies.items():
            if not b.running():
                self.start_bookie(bid)
                healed.append(bid)
        for bid in self.bookies:
            self._wait_registered(bid, 0)
        return healed

    # -- placement ----------------------------------------------------------------------
    def spawn_worker(self, name: str, argv: list, **kw) -> subprocess.Popen:
        """Start a worker on a host of its own (a free worker host or a new one)."""
        host = None
        for hname, ps in self._worker_hosts.items():
            if all(p.poll() is not None for p in ps):
                host = self.network.hosts[hname]
                ps.clear()
                break
        if host is None:
            host = self.network.add_host(f"w{len(self._worker_hosts) + 1}")
            self._worker_hosts[host.name] = []
        proc = host.spawn(argv, **kw)
        self._worker_hosts[host.name].append(proc)
        self.worker_host[name] = host
        return proc

    def role_hosts(self) -> dict:
        """{"etcd": [Host], "bookie": {id: Host}}."""
        return {"etcd": list(self.etcd.hosts),
                "bookie": {bid: b.host for bid, b in self.bookies.items()}}


def _signal(proc: subprocess.Popen, sig: int) -> None:
    try:
        proc.send_signal(sig)
    except ProcessLookupError:
        pass
