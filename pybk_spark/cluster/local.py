"""A local cluster on loopback: one embedded etcd and N ``bookie-server``s.

Used by ``pybk standalone``, the test fixtures, the demo and the benchmarks.

Layout under ``data_dir``:
  standalone.lock  held (flock, pybk_spark/dirlock.py) by the process running
                   the cluster, from ``start`` to ``stop``: a second cluster on
                   the same dir is refused at once (``errors.DataDirInUse``
                   naming the holder's pid) before it touches anything
  etcd/            etcd's data dir (etcd.log beside it)
  bookie-<i>/      bookie i's data dir, bookie-<i>.log its stdout+stderr
  bookie.conf      the conf file every bookie is started with
  cluster.json     remembered ports and scope, so a restart on the same data
                   dir hands out the same metadata URI and bookie addresses

Bookie ids are ``bookie-<i>`` (stable across restarts; the bookie's cookie is
bound to it).  A bookie is ready when its registration appears in etcd under
``bookies/writable/<id>`` or ``bookies/readonly/<id>`` with a revision newer
than its launch (a leftover key of a killed predecessor does not count) while
its process is alive; if it dies first the error carries its log tail.
Every child is started by ``procs.spawn``: it dies with this process, even
when this process is SIGKILLed (PR_SET_PDEATHSIG; see procs).

Secured etcd (docs/operations.md, "Securing etcd"): ``etcd_tls=EtcdTLS(...)``
serves etcd's client URL over TLS; ``etcd_auth=True`` also enables etcd
authentication on the first start (users operator / bookie / client with the
least-privilege roles, passwords under ``etcd-auth/``; pybk_spark/cluster/
etcd_users.py).  Then ``uri_for(user)`` is the metadata URI carrying that
user's settings: bookies run as ``bookie``, the cluster's own store as
``operator``, and ``metadata_uri`` is the ``client`` one.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Optional

from pybk_spark import errors
from pybk_spark.dirlock import DirLock
from pybk_spark.metadata import EtcdSecurity, open_store, with_security
from pybk_spark.cluster import etcd_users, procs
from pybk_spark.cluster.etcd_process import EtcdProcess, EtcdTLS
from pybk_spark.cluster.ports import free_port, port_is_free
from pybk_spark.cluster.registration import fresh_registration


LOCK_NAME = "standalone.lock"


class BookieStartError(RuntimeError):
    pass


class _Bookie:
    def __init__(self, bookie_id: str, port: int, metrics_port: int):
        self.bookie_id = bookie_id
        self.port = port
        self.metrics_port = metrics_port
        self.proc: Optional[subprocess.Popen] = None
        self.log: Any = None


class LocalCluster:
    def __init__(self, data_dir: str | os.PathLike, num_bookies: int = 3, scope: str = "pybk",
                 bookie_conf: dict | str | os.PathLike | None = None,
                 extra_bookie_args: tuple | list = (), *, metrics: bool = True,
                 ready_timeout: float = 60.0, bookie_command: tuple | list | None = None,
                 etcd_tls: EtcdTLS | None = None, etcd_auth: bool = False):
        self.data_dir = Path(data_dir).absolute()
        self.etcd_tls = etcd_tls
        self.etcd_auth = etcd_auth
        self.num_bookies = int(num_bookies)
        self.scope = scope
        self.bookie_conf = bookie_conf
        self.extra_bookie_args = list(extra_bookie_args)
        # argv prefix launching a bookie: this interpreter's bookie_server by
        # default; tests pass a test-only entry point (tests/chaos/faulty_bookie.py),
        # the install check a clean virtualenv's `bookie-server` script
        self.bookie_command = list(bookie_command or [sys.executable, "-m", "bookie_server"])
        self.metrics = metrics
        self.ready_timeout = ready_timeout
        self.etcd: Optional[EtcdProcess] = None
        self.store: Any = None
        self._bookies: dict[str, _Bookie] = {}
        self._frozen: set[str] = set()
        self._state_path = self.data_dir / "cluster.json"
        self._lock = DirLock(self.data_dir, LOCK_NAME, what="cluster data dir")

    # -- public view ------------------------------------------------------------
    @property
    def metadata_uri(self) -> str:
        """The URI clients use (with the ``client`` user's settings when secured)."""
        return self.uri_for("client")

    def uri_for(self, user: str | None) -> str:
        """The metadata URI for ``user`` (operator, bookie, client; None = TLS only)."""
        return with_security(self.started_etcd().uri(self.scope), self.etcd_security(user))

    def started_etcd(self) -> EtcdProcess:
        """The cluster's etcd (RuntimeError before ``start()``)."""
        if self.etcd is None:
            raise RuntimeError("cluster not started")
        return self.etcd

    def etcd_security(self, user: str | None) -> EtcdSecurity:
        tls = self.etcd_tls
        base = EtcdSecurity() if tls is None else EtcdSecurity(
            etcd_ca_file=tls.ca_file, etcd_cert_file=tls.probe_cert_file,
            etcd_key_file=tls.probe_key_file)
        if not self.etcd_auth or user is None:
            return base
        return etcd_users.security_for(base, self.data_dir / "etcd-auth", user)

    @property
    def bookie_ids(self) -> list[str]:
        return list(self._bookies)

    def bookie_address(self, bookie_id: str) -> str:
        return f"127.0.0.1:{self._bookie(bookie_id).port}"

    def bookie_pid(self, bookie_id: str) -> Optional[int]:
        b = self._bookie(bookie_id)
        return b.proc.pid if b.proc is not None and b.proc.poll() is None else None

    def bookie_log(self, bookie_id: str) -> Path:
        return self.data_dir / f"{bookie_id}.log"

    def bookie_data_dir(self, bookie_id: str) -> Path:
        return self.data_dir / bookie_id

    def pids(self) -> list[int]:
        """Live child pids (etcd and bookies)."""
        out = [b.proc.pid for b in self._bookies.values()
               if b.proc is not None and b.proc.poll() is None]
        pid = self.etcd.pid if self.etcd is not None and self.etcd.running() else None
        if pid is not None:
            out.append(pid)
        return out

    # -- lifecycle ----------------------------------------------------------------
    def start(self) -> "LocalCluster":
        """Start etcd and the bookies; ``errors.DataDirInUse`` (nothing
        touched) if another process runs a cluster on ``data_dir``."""
        self.lock()
        try:
            return self._start()
        except BaseException:
            self.stop()
            raise

    def lock(self) -> None:
        """Take ``standalone.lock`` (``start`` does it too); DataDirInUse."""
        if not self._lock.held:
            self._lock.acquire()

    def _start(self) -> "LocalCluster":
        state = self._load_state()
        self.scope = state.get("scope", self.scope)
        etcd_state = state.get("etcd", {})
        cport, pport = etcd_state.get("client_port"), etcd_state.get("peer_port")
        if cport and not port_is_free(cport):
            cport = None
        if pport and not port_is_free(pport):
            pport = None
        self.etcd = EtcdProcess(self.data_dir / "etcd", client_port=cport,
                                peer_port=pport, tls=self.etcd_tls).start()
        if self.etcd_auth and not state.get("etcd_auth"):
            etcd_users.create(self.etcd.uri(self.scope), self.etcd_security(None),
                              self.data_dir / "etcd-auth")
        self.store = open_store(self.uri_for("operator"))
        known = state.get("bookies", {})
        ids = list(known) or []
        while len(ids) < self.num_bookies:
            ids.append(self._next_bookie_id(ids))
        for bid in ids:
            info = known.get(bid, {})
            self._bookies[bid] = _Bookie(bid, info.get("port", 0), info.get("metrics_port", 0))
        self._write_conf()
        launched = [(bid, self._launch(bid)) for bid in ids]
        self._save_state()
        for bid, since in launched:
            self._wait_registered(bid, since)
        return self

    def stop(self) -> None:
        """SIGTERM every bookie (then SIGKILL after a grace), then etcd."""
        for b in self._bookies.values():
            if b.proc is not None:
                _signal(b.proc, signal.SIGCONT)
                _signal(b.proc, signal.SIGTERM)
        for b in self._bookies.values():
            self._reap(b, grace=15.0)
        if self.store is not None:
            self.store.close()
            self.store = None
        if self.etcd is not None:
            self.etcd.stop()
        self._lock.release()

    def __enter__(self) -> "LocalCluster":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    # -- bookie control -----------------------------------------------------------
    def start_bookie(self, bookie_id: str) -> None:
        """(Re)start a bookie that is not running, on its remembered port."""
        b = self._bookie(bookie_id)
        if b.proc is not None and b.proc.poll() is None:
            return
        self._reap(b, grace=0)
        since = self._launch(bookie_id)
        self._save_state()
        self._wait_registered(bookie_id, since)

    def add_bookie(self) -> str:
        bid = self._next_bookie_id(list(self._bookies))
        self._bookies[bid] = _Bookie(bid, 0, 0)
        self.num_bookies = len(self._bookies)
        self.start_bookie(bid)
        return bid

    def kill_bookie(self, bookie_id: str, sig: int = signal.SIGKILL) -> None:
        """Send ``sig`` and wait for the process to exit (SIGKILL = crash)."""
        b = self._bookie(bookie_id)
        if b.proc is None:
            return
        _signal(b.proc, signal.SIGCONT)
        _signal(b.proc, sig)
        self._frozen.discard(bookie_id)
        self._reap(b, grace=15.0)

    def stop_bookie(self, bookie_id: str) -> None:
        """SIGSTOP: the bookie freezes (a hung / partitioned bookie)."""
        b = self._bookie(bookie_id)
        if b.proc is not None:
            _signal(b.proc, signal.SIGSTOP)
            _wait_stopped(b.proc.pid)
            self._frozen.add(bookie_id)

    def resume_bookie(self, bookie_id: str) -> None:
        b = self._bookie(bookie_id)
        self._frozen.discard(bookie_id)
        if b.proc is not None:
            _signal(b.proc, signal.SIGCONT)

    def heal(self) -> list[str]:
        """Undo fault injection: start etcd if down, resume frozen bookies,
        restart dead ones, wait until all are registered.  Returns the ids
        that needed help (used by the test fixtures after every test)."""
        healed = []
        if self.etcd is not None and not self.etcd.running():
            self.etcd.start()
            healed.append("etcd")
        for bid in list(self._frozen):
            self.resume_bookie(bid)
            healed.append(bid)
        for bid, b in self._bookies.items():
            if b.proc is None or b.proc.poll() is not None:
                self.start_bookie(bid)
                healed.append(bid)
        for bid in self._bookies:
            self._wait_registered(bid, 0)
        return healed

    def restart_etcd(self) -> None:
        """Stop etcd (SIGTERM) and start it again on the same data dir and port."""
        self.started_etcd().restart()

    def wait_registered(self, bookie_id: str, read_only: bool | None = None,
                        timeout: float | None = None) -> dict:
        """Poll until ``bookie_id`` is registered (optionally in a given mode)."""
        return self._wait_registered(bookie_id, 0, read_only=read_only, timeout=timeout)

    # -- internals ----------------------------------------------------------------
    def _bookie(self, bookie_id: str) -> _Bookie:
        try:
            return self._bookies[bookie_id]
        except KeyError:
            raise errors.IncorrectParameter(f"no bookie {bookie_id!r} in this cluster") from None

    @staticmethod
    def _next_bookie_id(existing: list[str]) -> str:
        used = {int(b.rsplit("-", 1)[1]) for b in existing if b.rsplit("-", 1)[-1].isdigit()}
        i = 0
        while i in used:
            i += 1
        return f"bookie-{i}"

    def _used_ports(self) -> set[int]:
        used = {self.etcd.client_port, self.etcd.peer_port} if self.etcd else set()
        for b in self._bookies.values():
            used |= {b.port, b.metrics_port}
        return used - {0}

    def _conf_path(self) -> Optional[Path]:
        if self.bookie_conf is None or isinstance(self.bookie_conf, dict):
            return self.data_dir / "bookie.conf"
        return Path(self.bookie_conf)

    def _write_conf(self) -> None:
        if self.bookie_conf is not None and not isinstance(self.bookie_conf, dict):
            return
        lines = ["# written by pybk_spark.cluster.local.LocalCluster"]
        for key, value in (self.bookie_conf or {}).items():
            if isinstance(value, bool):
                value = "true" if value else "false"
            lines.append(f"{key} = {value}")
        (self.data_dir / "bookie.conf").write_text("\n".join(lines) + "\n")

    def _launch(self, bookie_id: str) -> int:
        """Spawn the bookie; returns the etcd revision before the launch."""
        b = self._bookies[bookie_id]
        if not b.port or not port_is_free(b.port):
            b.port = free_port(avoid=self._used_ports())
        if self.metrics and (not b.metrics_port or not port_is_free(b.metrics_port)):
            b.metrics_port = free_port(avoid=self._used_ports())
        since = self.store.current_revision()
        data = self.bookie_data_dir(bookie_id)
        data.parent.mkdir(parents=True, exist_ok=True)
        args = [*self.bookie_command,
                "--conf", str(self._conf_path()),
                "--port", str(b.port),
                "--data-dir", str(data),
                "--metadata-uri", self.uri_for("bookie"),
                "--bookie-id", bookie_id]
        if self.metrics:
            args += ["--metrics-port", str(b.metrics_port)]
        args += self.extra_bookie_args
        b.log = open(self.bookie_log(bookie_id), "ab")
        b.proc = procs.spawn(args, stdout=b.log, stderr=subprocess.STDOUT,
                             stdin=subprocess.DEVNULL)
        return since

    def _wait_registered(self, bookie_id: str, since: int, read_only: bool | None = None,
                         timeout: float | None = None) -> dict:
        b = self._bookies[bookie_id]
        deadline = time.monotonic() + (timeout or self.ready_timeout)
        delay = 0.02
        while True:
            if b.proc is None or b.proc.poll() is not None:
                code = None if b.proc is None else b.proc.returncode
                tail = self._log_tail(bookie_id)
                reasons = [ln for ln in tail.splitlines() if ln.startswith("bookie-server: ")]
                reason = f": {reasons[-1]}" if reasons else ""
                raise BookieStartError(f"{bookie_id} exited (code {code}) before registering"
                                       f"{reason} (log {self.bookie_log(bookie_id)})\n"
                                       f"log tail:\n{tail}")
            registration = fresh_registration(self.store, bookie_id, since, read_only)
            if registration is not None:
                return registration
            if time.monotonic() > deadline:
                raise BookieStartError(f"{bookie_id} not registered after "
                                       f"{timeout or self.ready_timeout}s; log tail:\n"
                                       f"{self._log_tail(bookie_id)}")
            time.sleep(delay)
            delay = min(delay * 2, 0.2)

    def _reap(self, b: _Bookie, grace: float) -> None:
        if b.proc is not None:
            procs.terminate(b.proc, grace)
            b.proc = None
        if b.log is not None:
            b.log.close()
            b.log = None

    def _log_tail(self, bookie_id: str, lines: int = 40) -> str:
        try:
            text = self.bookie_log(bookie_id).read_text(errors="replace")
            return "\n".join(text.splitlines()[-lines:])
        except OSError:
            return "(no log)"

    def _load_state(self) -> dict:
        try:
            return json.loads(self._state_path.read_text())
        except (OSError, ValueError):
            return {}

    def _save_state(self) -> None:
        etcd = self.started_etcd()
        state = {"scope": self.scope, "etcd_auth": self.etcd_auth,
                 "etcd": {"client_port": etcd.client_port, "peer_port": etcd.peer_port},
                 "bookies": {bid: {"port": b.port, "metrics_port": b.metrics_port}
                             for bid, b in self._bookies.items()}}
        tmp = self._state_path.with_suffix(".tmp")
        tmp.write_text(json.dumps(state, indent=2, sort_keys=True))
        os.replace(tmp, self._state_path)


def _thread_state(pid: int, tid: str) -> str:
    """The state letter of one thread (``R``, ``S``, ``T``, ...) from /proc."""
    with open(f"/proc/{pid}/task/{tid}/stat") as f:
        return f.read().rsplit(")", 1)[1].split()[0]


def _wait_stopped(pid: int, timeout: float = 5.0) -> None:
    """Return once every thread of ``pid`` is stopped (state T in /proc), so
    a caller's next request cannot be served by a bookie still stopping; a
    process that is gone (or no /proc) returns at once."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            states = [_thread_state(pid, t) for t in os.listdir(f"/proc/{pid}/task")]
        except OSError:
            return
        if all(st in ("T", "t", "Z", "X") for st in states):
            return
        time.sleep(0.001)


def _signal(proc: subprocess.Popen, sig: int) -> None:
    try:
        if proc.poll() is None:
            proc.send_signal(sig)
    except (ProcessLookupError, OSError):
        pass
