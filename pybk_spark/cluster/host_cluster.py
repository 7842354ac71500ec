"""A cluster on separate test hosts: an N-member etcd and M bookies, each on
its own network namespace (``pybk_spark.cluster.hosts``); the test process,
in the root namespace, is the client.

Layout: hosts ``etcd-1..N`` run one etcd member each (``EtcdCluster``), hosts
``bookie-1..M`` one ``bookie-server`` each, started as the systemd unit
starts it (``bookie_command``, the flags of deploy/systemd/bookie-server.service:
tests/bookie/test_systemd_units.py compares them): listening on every
interface of its host (``--bind-address 0.0.0.0``) and registering
``--advertised-address <host address>``, which the client can reach, with the
multi-endpoint metadata URI ``etcd://<e1>:2379,<e2>:2379,<e3>:2379/<scope>``.  Data lives under
``data_dir``: ``etcd/<member>/`` and ``bookie-<i>/`` (logs beside them).
``racks`` (bookie id -> rack label, e.g. ``/rack-a``) gives a bookie its own
conf file, ``<bookie id>.conf`` = the shared keys plus ``rack``; the others
share ``bookie.conf`` (rack ``/default-rack``).

A bookie is ready when its registration appears under
``bookies/writable/<id>`` with a revision newer than its launch while its
process is alive (the same rule as ``LocalCluster``).  ``close()`` stops the
bookies (SIGTERM, then SIGKILL), then etcd, then removes the hosts.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Optional

from pybk_spark.metadata import open_store
from pybk_spark.cluster import hosts, procs
from pybk_spark.cluster.etcd_process import EtcdNotFound, find_etcd_binary
from pybk_spark.cluster.registration import fresh_registration
from pybk_spark.cluster.etcd_cluster import EtcdCluster
from pybk_spark.cluster.hosts import Host, HostNetwork

BOOKIE_PORT = 3181


def unavailable_reason() -> str | None:
    """Why a HostCluster cannot run here (no test hosts, no etcd binary), or None."""
    reason = hosts.unavailable_reason()
    if reason:
        return f"test hosts unavailable: {reason}"
    try:
        find_etcd_binary()
    except EtcdNotFound as exc:
        return str(exc)
    return None


def bookie_command(conf: str, port: int, bind_address: str, advertised_address: str,
                   data_dir: str, metadata_uri: str, bookie_id: str) -> list[str]:
    """The bookie command line, flag for flag the systemd unit's ExecStart."""
    return [sys.executable, "-m", "bookie_server",
            "--conf", conf,
            "--port", str(port),
            "--bind-address", bind_address,
            "--advertised-address", advertised_address,
            "--data-dir", data_dir,
            "--metadata-uri", metadata_uri,
            "--bookie-id", bookie_id]


class HostBookie:
    def __init__(self, bookie_id: str, host: Host, data_dir: Path,
                 advertised_address: str | None = None):
        self.bookie_id = bookie_id
        self.host = host
        self.data_dir = data_dir
        self.advertised_address = advertised_address or host.address
        self.proc: Optional[subprocess.Popen] = None
        self.log: Any = None

    @property
    def address(self) -> str:
        return f"{self.advertised_address}:{BOOKIE_PORT}"

    @property
    def log_path(self) -> Path:
        return self.data_dir.parent / f"{self.bookie_id}.log"

    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None


class HostCluster:
    def __init__(self, data_dir: str | os.PathLike, *, etcd_members: int = 3,
                 num_bookies: int = 3, scope: str = "pybk", bookie_conf: dict | None = None,
                 network: HostNetwork | None = None, ready_timeout: float = 90.0,
                 racks: dict[str, str] | None = None):
        self.data_dir = Path(data_dir).absolute()
        self.scope = scope
        self.bookie_conf = dict(bookie_conf or {})
        self.racks = dict(racks or {})
        self.ready_timeout = ready_timeout
        self._own_network = network is None
        self.network = network or HostNetwork()
        self._n_etcd = etcd_members
        self._n_bookies = num_bookies
        self.etcd: Optional[EtcdCluster] = None
        self.store: Any = None
        self.bookies: dict[str, HostBookie] = {}

    @property
    def metadata_uri(self) -> str:
        if self.etcd is None:
            raise RuntimeError("the host cluster is not started: call start() first")
        return self.etcd.uri(self.scope)

    @property
    def bookie_ids(self) -> list[str]:
        return list(self.bookies)

    # -- lifecycle ----------------------------------------------------------------------
    def start(self) -> "HostCluster":
        try:
            if self._own_network:
                self.network.start()
            self.data_dir.mkdir(parents=True, exist_ok=True)
            etcd_hosts = [self.network.add_host(f"etcd-{i + 1}") for i in range(self._n_etcd)]
            self.etcd = EtcdCluster(etcd_hosts, self.data_dir / "etcd",
                                    ready_timeout=self.ready_timeout).start()
            self.store = open_store(self.metadata_uri)
            self._write_conf()
            for i in range(self._n_bookies):
                bid = f"bookie-{i + 1}"
                self.bookies[bid] = HostBookie(bid, self.network.add_host(bid),
                                               self.data_dir / bid)
            launched = [(bid, self._launch(bid)) for bid in self.bookies]
            for bid, since in launched:
                self._wait_registered(bid, since)
        except BaseException:
            self.close()
            raise
        return self

    def close(self) -> None:
        for b in self.bookies.values():
            if b.proc is not None and b.running():
                b.proc.send_signal(signal.SIGTERM)
        for b in self.bookies.values():
            self._reap(b, grace=15.0)
        if self.store is not None:
            self.store.close()
            self.store = None
        if self.etcd is not None:
            self.etcd.stop()
        if self._own_network:
            self.network.close()

    def __enter__(self) -> "HostCluster":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.close()

    # -- bookie control -----------------------------------------------------------------
    def kill_bookie(self, bookie_id: str) -> None:
        self._reap(self.bookies[bookie_id], grace=0)

    def start_bookie(self, bookie_id: str) -> None:
        b = self.bookies[bookie_id]
        if b.running():
            return
        self._reap(b, grace=0)
        self._wait_registered(bookie_id, self._launch(bookie_id))

    def add_bookie(self, bookie_id: str, advertised_address: str | None = None,
                   wait: bool = True, rack: str | None = None) -> HostBookie:
        """One more bookie on a new host ``bookie_id``; ``advertised_address``
        (default: its host's address) is what it registers, ``rack`` its rack."""
        if rack is not None:
            self.racks[bookie_id] = rack
            self._write_conf()
        b = self.bookies[bookie_id] = HostBookie(bookie_id, self.network.add_host(bookie_id),
                                                 self.data_dir / bookie_id, advertised_address)
        since = self._launch(bookie_id)
        if wait:
            self._wait_registered(bookie_id, since)
        return b

    def wait_registered(self, bookie_id: str, timeout: float | None = None) -> dict:
        return self._wait_registered(bookie_id, 0, timeout)

    # -- internals ----------------------------------------------------------------------
    def _conf_path(self, bookie_id: str | None = None) -> Path:
        if bookie_id in self.racks:
            return self.data_dir / f"{bookie_id}.conf"
        return self.data_dir / "bookie.conf"

    def _write_conf(self) -> None:
        lines = ["# written by pybk_spark.cluster.host_cluster.HostCluster"]
        for key, value in self.bookie_conf.items():
            if isinstance(value, bool):
                value = "true" if value else "false"
            lines.append(f"{key} = {value}")
        self._conf_path().write_text("\n".join(lines) + "\n")
        for bookie_id, rack in self.racks.items():
            self._conf_path(bookie_id).write_text("\n".join(lines + [f"rack = {rack}"]) + "\n")

    def _launch(self, bookie_id: str) -> int:
        """Spawn the bookie on its host; returns the etcd revision before the launch."""
        b = self.bookies[bookie_id]
        since = self.store.current_revision()
        args = bookie_command(str(self._conf_path(bookie_id)), BOOKIE_PORT, "0.0.0.0",
                              b.advertised_address, str(b.data_dir), self.metadata_uri,
                              bookie_id)
        b.log = open(b.log_path, "ab")
        b.proc = b.host.spawn(args, stdout=b.log, stderr=subprocess.STDOUT)
        return since

    def _wait_registered(self, bookie_id: str, since: int, timeout: float | None = None) -> dict:
        b = self.bookies[bookie_id]
        timeout = timeout or self.ready_timeout
        deadline = time.monotonic() + timeout
        delay = 0.05
        while True:
            if not b.running():
                code = None if b.proc is None else b.proc.returncode
                raise RuntimeError(f"{bookie_id} exited (code {code}) before registering; "
                                   f"log tail:\n{_tail(b.log_path)}")
            registration = fresh_registration(self.store, bookie_id, since, read_only=False)
            if registration is not None:
                return registration
            if time.monotonic() > deadline:
                raise RuntimeError(f"{bookie_id} not registered after {timeout}s; "
                                   f"log tail:\n{_tail(b.log_path)}")
            time.sleep(delay)
            delay = min(delay * 2, 0.3)

    @staticmethod
    def _reap(b: HostBookie, grace: float) -> None:
        if b.proc is not None:
            procs.terminate(b.proc, grace)
            b.proc = None
        if b.log is not None:
            b.log.close()
            b.log = None


def _tail(path: Path, lines: int = 40) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"
