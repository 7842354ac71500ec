"""A three (or N) member etcd cluster, one member per test host.

Each member is an ``EtcdProcess`` started inside its host's namespace
(``Host.spawn``) on ``<host address>:2379`` (clients) and ``:2380`` (peers),
all listed in ``--initial-cluster``.  Data dirs live under ``data_root/<name>``
so a killed member restarts with its data and rejoins as itself.

``uri(scope)`` is the multi-endpoint metadata URI
``etcd://a:2379,b:2379,c:2379/scope`` that clients and bookies are given.
``leader()`` asks the members' ``Maintenance.Status`` (HTTP gateway) and
returns the member the live ones agree on.  Readiness is "``/health`` is
true", which needs a quorum: a new cluster starts every member without
waiting, then waits on each.  ``tls=`` (one ``EtcdTLS`` whose certificate
names every member's address) serves every member's client URL over TLS.
"""
from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Optional, Sequence

from pybk_spark.cluster.etcd_process import EtcdProcess, EtcdTLS


class EtcdCluster:
    def __init__(self, hosts: Sequence, data_root: str | os.PathLike, *,
                 token: str = "pybk-etcd-cluster", ready_timeout: float = 60.0,
                 tls: EtcdTLS | None = None):
        if not hosts:
            raise ValueError("an etcd cluster needs at least one host")
        self.data_root = Path(data_root)
        self.hosts = list(hosts)
        names = [h.name if h.name.startswith("etcd") else f"etcd-{h.name}" for h in self.hosts]
        initial = ",".join(f"{n}=http://{h.address}:2380" for n, h in zip(names, self.hosts))
        self.members: list[EtcdProcess] = [
            EtcdProcess(self.data_root / n, name=n, host=h.address, initial_cluster=initial,
                        cluster_token=token, spawn=h.spawn, ready_timeout=ready_timeout,
                        tls=tls)
            for n, h in zip(names, self.hosts)]

    # -- addresses ----------------------------------------------------------------------
    @property
    def endpoints(self) -> list[str]:
        return [m.endpoint for m in self.members]

    def uri(self, scope: str = "pybk") -> str:
        return f"etcd://{','.join(self.endpoints)}/{scope}"

    def member(self, name_or_index) -> EtcdProcess:
        if isinstance(name_or_index, int):
            return self.members[name_or_index]
        for m in self.members:
            if name_or_index in (m.name, m.host):
                return m
        raise KeyError(name_or_index)

    # -- lifecycle ----------------------------------------------------------------------
    def start(self) -> "EtcdCluster":
        try:
            for m in self.members:
                m.start(wait=False)
            for m in self.members:
                m.wait_ready()
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        for m in self.members:
            m.stop()

    def __enter__(self) -> "EtcdCluster":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    def running(self) -> list[EtcdProcess]:
        return [m for m in self.members if m.running()]

    def wait_healthy(self, timeout: float = 60.0) -> None:
        """Every running member reports healthy (a leader and a quorum)."""
        deadline = time.monotonic() + timeout
        delay = 0.05
        while True:
            if all(m.healthy() for m in self.running()):
                return
            if time.monotonic() > deadline:
                raise TimeoutError(f"etcd cluster not healthy after {timeout}s")
            time.sleep(delay)
            delay = min(delay * 2, 0.5)

    # -- leadership ---------------------------------------------------------------------
    def leader(self, timeout: float = 30.0) -> EtcdProcess:
        """The current leader, as the running members report it."""
        deadline = time.monotonic() + timeout
        delay = 0.05
        while True:
            found = self._leader_now()
            if found is not None:
                return found
            if time.monotonic() > deadline:
                raise TimeoutError(f"no etcd leader after {timeout}s")
            time.sleep(delay)
            delay = min(delay * 2, 0.5)

    def _leader_now(self) -> Optional[EtcdProcess]:
        ids: dict[int, EtcdProcess] = {}
        leaders = set()
        for m in self.running():
            try:
                st = m.status()
            except (OSError, ValueError, KeyError):
                continue
            ids[st["member_id"]] = m
            if st["leader"]:
                leaders.add(st["leader"])
        if len(leaders) == 1:
            return ids.get(leaders.pop())
        return None
