"""A Spark standalone cluster on test hosts: a master and N workers, each on
its own network namespace (``pybk_spark.cluster.hosts``), a host for drivers
(``spark-submit`` runs there), and optionally a Spark Connect server.

Everything is started from the pyspark pip package (``SPARK_HOME`` = the
``pyspark`` package directory; its ``sbin/start-master.sh`` is not shipped,
so the daemons are ``bin/spark-class org.apache.spark.deploy.master.Master``
/ ``...worker.Worker``, and the Connect server is ``bin/spark-submit --class
org.apache.spark.sql.connect.service.SparkConnectServer``, which is what
``sbin/start-connect-server.sh --wait`` runs).

Layout (hosts added to the given ``HostNetwork``):

    spark-master     Master   spark://<addr>:7077, web UI :8080 (/json)
    spark-worker-i   Worker   --cores 1 --memory <worker_memory>, web UI :8081
    spark-driver     spark-submit (client mode) and the Connect server
                     (sc://<addr>:15002); spark.driver.host = its address

Every process gets ``SPARK_LOCAL_IP`` / ``SPARK_LOCAL_HOSTNAME`` = its host's
address (no name lookups), the test process's ``PYTHONPATH`` (so workers'
Python imports the same pybk_spark the tests do; a real deployment installs
pybk-spark on every worker) and ``PYSPARK_PYTHON`` = this interpreter.
Drivers run with ``cwd`` = a scratch directory outside the repository, so
nothing is imported from the working directory.  Data and logs live under
``data_dir`` (``<host>.log``, ``work/`` for the workers' executor dirs,
``submit/`` for drivers' cwd); every host sees the same filesystem, which is
what makes ``data_dir`` usable for streaming checkpoints.

Readiness, never sleeps: the master is ready when ``/json`` on its web UI
says ``ALIVE``; a worker when the master's ``/json`` lists it ``ALIVE``; the
Connect server when a TCP connection to its port is accepted while the
process is alive.  HTTP to the master bypasses any proxy settings (only our
own addresses are targets).

Clean-up: every process is started with ``Host.spawn`` (``procs.spawn``:
PDEATHSIG, own session).  ``close()`` SIGTERMs the Connect server, workers
and master (a worker kills its executors on SIGTERM), then SIGKILLs
whatever is still inside the Spark hosts' namespaces (executors, Python
workers: ``ip netns pids``), so nothing outlives the cluster; the hosts go
when their ``HostNetwork`` closes.
"""
from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any, Optional, Sequence

from pybk_spark.cluster import procs
from pybk_spark.cluster.hosts import Host, HostNetwork

MASTER_PORT = 7077
MASTER_UI_PORT = 8080
WORKER_UI_PORT = 8081
CONNECT_PORT = 15002
CONNECT_SERVER_CLASS = "org.apache.spark.sql.connect.service.SparkConnectServer"

# no proxy, ever: the master's address is one of ours
_HTTP = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def spark_home() -> Path:
    """The pyspark package directory (it holds ``bin/`` and ``jars/``)."""
    import pyspark  # why: ~1.3 s to import, and only this needs the package itself
    return Path(pyspark.__file__).resolve().parent


class SparkCluster:
    def __init__(self, network: HostNetwork, data_dir: str | os.PathLike, *,
                 workers: int = 2, worker_memory: str = "1g", executor_memory: str = "512m",
                 daemon_memory: str = "256m", ready_timeout: float = 240.0):
        self.network = network
        self.data_dir = Path(data_dir).absolute()
        self.n_workers = workers
        self.worker_memory = worker_memory
        self.executor_memory = executor_memory
        self.daemon_memory = daemon_memory
        self.ready_timeout = ready_timeout
        self.master_host: Optional[Host] = None
        self.worker_hosts: list[Host] = []
        self.driver_host: Optional[Host] = None
        self._procs: dict[str, subprocess.Popen] = {}
        self._logs: dict[str, Any] = {}

    # -- addresses ----------------------------------------------------------------------
    @property
    def master(self) -> Host:
        """The master's host (RuntimeError before ``start()``)."""
        if self.master_host is None:
            raise RuntimeError("the Spark cluster is not started: call start() first")
        return self.master_host

    @property
    def driver(self) -> Host:
        """The driver's host (RuntimeError before ``start()``)."""
        if self.driver_host is None:
            raise RuntimeError("the Spark cluster is not started: call start() first")
        return self.driver_host

    @property
    def master_url(self) -> str:
        return f"spark://{self.master.address}:{MASTER_PORT}"

    @property
    def connect_url(self) -> str:
        return f"sc://{self.driver.address}:{CONNECT_PORT}"

    @property
    def hosts(self) -> list[Host]:
        return [h for h in (self.master_host, *self.worker_hosts, self.driver_host) if h]

    def log_path(self, name: str) -> Path:
        return self.data_dir / f"{name}.log"

    # -- lifecycle ----------------------------------------------------------------------
    def start(self) -> "SparkCluster":
        try:
            self.data_dir.mkdir(parents=True, exist_ok=True)
            (self.data_dir / "submit").mkdir(exist_ok=True)
            self.master_host = self.network.add_host("spark-master")
            self.worker_hosts = [self.network.add_host(f"spark-worker-{i + 1}")
                                 for i in range(self.n_workers)]
            self.driver_host = self.network.add_host("spark-driver")
            self._spawn("spark-master", self.master_host, self._spark_class(
                "org.apache.spark.deploy.master.Master", "--host", self.master_host.address,
                "--port", MASTER_PORT, "--webui-port", MASTER_UI_PORT), self._daemon_env())
            self._until(lambda: (self.master_state() or {}).get("status") == "ALIVE",
                        "spark-master", "the master's /json to say ALIVE")
            for h in self.worker_hosts:
                (self.data_dir / "work" / h.name).mkdir(parents=True, exist_ok=True)
                self._spawn(h.name, h, self._spark_class(
                    "org.apache.spark.deploy.worker.Worker", self.master_url,
                    "--host", h.address, "--webui-port", WORKER_UI_PORT, "--cores", 1,
                    "--memory", self.worker_memory,
                    "--work-dir", self.data_dir / "work" / h.name), self._daemon_env())
            for h in self.worker_hosts:
                self._until(lambda: h.address in self.alive_workers(), h.name,  # noqa: B023 (waits here)
                            f"{h.name} to be ALIVE in the master's /json")
        except BaseException:
            self.close()
            raise
        return self

    def start_connect(self) -> str:
        """Start the Spark Connect server on the driver host; returns its ``sc://`` URL."""
        if "spark-connect" in self._procs and self._procs["spark-connect"].poll() is None:
            return self.connect_url
        h = self.driver
        argv = [spark_home() / "bin" / "spark-submit", "--class", CONNECT_SERVER_CLASS,
                "--name", "Spark Connect server", *self._driver_conf(),
                "--conf", f"spark.connect.grpc.binding.address={h.address}",
                "--conf", f"spark.connect.grpc.binding.port={CONNECT_PORT}"]
        self._spawn("spark-connect", h, argv, extra_env={"SPARK_CONNECT_MODE": "0"})
        self._until(lambda: _accepts(h.address, CONNECT_PORT), "spark-connect",
                    f"the Connect server to accept on {h.address}:{CONNECT_PORT}")
        return self.connect_url

    def stop_connect(self) -> None:
        """Stop the Connect server: it is one long-running application and
        holds its executors (every worker core) until it stops."""
        proc = self._procs.pop("spark-connect", None)
        if proc is not None:
            procs.terminate(proc, 20.0)
        log = self._logs.pop("spark-connect", None)
        if log is not None:
            log.close()

    def close(self) -> None:
        for name in sorted(self._procs, key=_stop_order):
            p = self._procs[name]
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for name in sorted(self._procs, key=_stop_order):
            procs.terminate(self._procs[name], 20.0)
        self._procs.clear()
        for h in self.hosts:                    # executors, Python workers, drivers
            for pid in h.pids():
                try:
                    os.kill(pid, signal.SIGKILL)
                except OSError:
                    pass
        for log in self._logs.values():
            log.close()
        self._logs.clear()

    def __enter__(self) -> "SparkCluster":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.close()

    # -- the master's view --------------------------------------------------------------
    def master_state(self) -> Optional[dict]:
        """The master's ``/json`` (None while it does not answer)."""
        url = f"http://{self.master.address}:{MASTER_UI_PORT}/json"
        try:
            with _HTTP.open(url, timeout=5) as resp:
                return json.loads(resp.read())
        except (OSError, ValueError, urllib.error.URLError):
            return None

    def alive_workers(self) -> list[str]:
        """Host addresses of the workers the master lists ALIVE."""
        state = self.master_state() or {}
        return [w.get("host") for w in state.get("workers", []) if w.get("state") == "ALIVE"]

    # -- drivers ------------------------------------------------------------------------
    def submit(self, script: str | os.PathLike, *args, conf: dict | None = None,
               timeout: float = 600.0, name: str | None = None) -> subprocess.CompletedProcess:
        """``spark-submit --master spark://... script args`` on the driver host, in
        client mode, cwd a scratch dir outside the repository.  Returns the
        completed process (stdout/stderr as text).  On timeout the submit's
        process group (its own session) is killed and TimeoutError raised."""
        name = name or Path(script).stem
        argv = [spark_home() / "bin" / "spark-submit", *self._driver_conf(conf),
                "--name", name, Path(script).absolute(), *args]
        out_path = self.data_dir / "submit" / f"{name}.out"
        err_path = self.data_dir / "submit" / f"{name}.err"
        with open(out_path, "w") as out, open(err_path, "w") as err:
            proc = self.driver.spawn([str(a) for a in argv], env=self._env(self.driver),
                                          stdout=out, stderr=err, cwd=self.data_dir / "submit")
            try:
                rc = proc.wait(timeout)
            except subprocess.TimeoutExpired:
                _kill_group(proc)               # spark-submit's JVM and its Python driver
                raise TimeoutError(f"spark-submit {name} did not finish in {timeout}s; "
                                   f"stderr tail:\n{_tail(err_path)}") from None
            finally:
                procs.unregister(proc)
        return subprocess.CompletedProcess(argv, rc, out_path.read_text(), err_path.read_text())

    def _driver_conf(self, conf: dict | None = None) -> list[str]:
        h = self.driver
        settings = {
            "spark.driver.host": h.address,
            "spark.driver.bindAddress": h.address,
            "spark.driver.memory": "512m",
            "spark.executor.memory": self.executor_memory,
            "spark.pyspark.python": sys.executable,
            "spark.pyspark.driver.python": sys.executable,
            "spark.ui.enabled": "false",
            "spark.sql.shuffle.partitions": "2",
            "spark.log.level": "WARN",
            **(conf or {}),
        }
        argv = ["--master", self.master_url, "--deploy-mode", "client"]
        for key, value in settings.items():
            argv += ["--conf", f"{key}={value}"]
        return argv

    # -- internals ----------------------------------------------------------------------
    @staticmethod
    def _spark_class(cls: str, *args) -> list:
        return [spark_home() / "bin" / "spark-class", cls, *args]

    def _daemon_env(self) -> dict:
        # master and workers only: the launcher also applies it to the Connect
        # server (a driver), which then has too little heap to start
        return {"SPARK_DAEMON_MEMORY": self.daemon_memory}

    def _env(self, host: Host, extra: dict | None = None) -> dict:
        env = dict(os.environ)
        env.update(SPARK_HOME=str(spark_home()), PYSPARK_PYTHON=sys.executable,
                   PYSPARK_DRIVER_PYTHON=sys.executable, SPARK_LOCAL_IP=host.address,
                   SPARK_LOCAL_HOSTNAME=host.address,
                   SPARK_LOG_DIR=str(self.data_dir), SPARK_WORKER_DIR=str(self.data_dir / "work"),
                   GRPC_ENABLE_FORK_SUPPORT="false")
        env.pop("SPARK_REMOTE", None)
        env.pop("SPARK_CONNECT_MODE_ENABLED", None)
        env.update(extra or {})
        return env

    def _spawn(self, name: str, host: Host, argv: Sequence, extra_env: dict | None = None) -> None:
        log = open(self.log_path(name), "ab")
        self._logs[name] = log
        self._procs[name] = host.spawn([str(a) for a in argv], env=self._env(host, extra_env),
                                       stdout=log, stderr=subprocess.STDOUT,
                                       cwd=self.data_dir)

    def _until(self, pred, name: str, what: str) -> None:
        deadline = time.monotonic() + self.ready_timeout
        delay = 0.1
        while not pred():
            proc = self._procs.get(name)
            if proc is not None and proc.poll() is not None:
                raise RuntimeError(f"{name} exited (code {proc.returncode}) while waiting for "
                                   f"{what}; log tail:\n{_tail(self.log_path(name))}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"timed out after {self.ready_timeout}s waiting for {what}; "
                                   f"log tail:\n{_tail(self.log_path(name))}")
            time.sleep(delay)
            delay = min(delay * 2, 1.0)


def _kill_group(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except OSError:
        pass
    proc.wait()


def _stop_order(name: str) -> int:
    return 0 if name == "spark-connect" else 2 if name == "spark-master" else 1


def _accepts(address: str, port: int) -> bool:
    try:
        socket.create_connection((address, port), timeout=2).close()
        return True
    except OSError:
        return False


def _tail(path: Path, lines: int = 40) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"
