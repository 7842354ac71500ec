"""Start/stop real ``bookie-server`` processes for tests and benchmarks.

Readiness is polled (the standard gRPC health check, ``grpc.health.v1``,
service ``""``: SERVING once the bookie serves) with a deadline, never slept for; every
started process is killed at interpreter exit if a test forgot to.
"""
from __future__ import annotations

import atexit
import os
import signal
import socket
import subprocess
import sys
import time
from typing import Optional

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from pybk_spark.cluster import procs
from pybk_spark.cluster.ports import free_port
from pybk_spark.wire import bookie_wire_pb2 as pb
from pybk_spark.wire import bookie_wire_pb2_grpc as pb_grpc
from pybk_spark.wire.channel_options import bookie_channel_options
from pybk_spark.wire.entries import (batch_from_bytes, batch_to_bytes, cumulative_lengths,
                                     make_batch)

_LIVE: set["BookieProcess"] = set()


@atexit.register
def _kill_all() -> None:
    for proc in list(_LIVE):
        proc.kill()


READY_LINE = "bookie-server ready "


def _port_open(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
        return True
    except OSError:
        return False


class BookieProcess:
    def __init__(self, data_dir: str, *, port: Optional[int] = None,
                 metadata_uri: str = "", bookie_id: str = "", conf: Optional[dict] = None,
                 log_path: Optional[str] = None, command: Optional[list] = None,
                 client_tls=None):
        self.data_dir = data_dir
        self.port = port or free_port()
        self.metadata_uri = metadata_uri
        self.bookie_id = bookie_id or f"127.0.0.1:{self.port}"
        self.conf = dict(conf or {})
        self.conf_path = data_dir.rstrip("/") + ".conf"
        self.log_path = log_path or data_dir.rstrip("/") + ".log"
        # argv prefix; tests may pass a test-only entry point (faulty_bookie.py)
        self.base_command = list(command or [sys.executable, "-m", "bookie_server"])
        self.proc: Optional[subprocess.Popen] = None
        self._log_start = 0
        self._channel: Optional[grpc.Channel] = None
        self.client_tls = client_tls     # transport/tls.ClientTls for a TLS bookie's channel

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def write_conf(self, **changes) -> None:
        self.conf.update(changes)
        with open(self.conf_path, "w", encoding="utf-8") as fh:
            for k, v in self.conf.items():
                fh.write(f"{k} = {v}\n")

    def command(self, *extra: str) -> list[str]:
        cmd = [*self.base_command, *extra, "--conf", self.conf_path,
               "--port", str(self.port), "--data-dir", self.data_dir,
               "--bookie-id", self.bookie_id]
        if self.metadata_uri:
            cmd += ["--metadata-uri", self.metadata_uri]
        return cmd

    def start(self, wait: bool = True, timeout: float = 60.0) -> "BookieProcess":
        self.write_conf()
        logf = open(self.log_path, "ab")
        self._log_start = logf.tell()
        self.proc = procs.spawn(self.command(), stdout=logf, stderr=subprocess.STDOUT,
                                register_child=False)
        logf.close()
        _LIVE.add(self)
        if wait:
            self.wait_ready(timeout)
        return self

    def run_format(self, *args: str, timeout: float = 60.0) -> subprocess.CompletedProcess:
        """``bookie-server format`` with this bookie's flags and ``args`` (``--yes``)."""
        self.write_conf()
        proc = procs.spawn([*self.command("format"), *args], stdin=subprocess.DEVNULL,
                           stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, text=True)
        try:
            out, err = proc.communicate(timeout=timeout)
        finally:
            procs.terminate(proc, grace=0)
        return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)

    def wait_ready(self, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        stub = health_pb2_grpc.HealthStub(self.channel())
        serving = health_pb2.HealthCheckResponse.SERVING
        while True:
            proc = self.started()
            if proc.poll() is not None:
                raise RuntimeError(f"bookie exited with {proc.returncode}:\n{self.log_tail()}")
            # the port first: a channel whose first connect failed waits out its backoff
            if _port_open(self.port):
                try:
                    if (stub.Check(health_pb2.HealthCheckRequest(), timeout=1.0,
                                   wait_for_ready=True).status == serving
                            and self._logged_ready()):     # start-up logged too
                        return
                except grpc.RpcError:
                    pass
            if time.monotonic() > deadline:
                self.kill()
                raise TimeoutError(f"bookie not ready in {timeout}s:\n{self.log_tail()}")
            time.sleep(0.05)   # poll interval, not synchronisation

    def wait_exit(self, timeout: float = 60.0) -> int:
        return self.started().wait(timeout)

    def started(self) -> subprocess.Popen:
        """The running process (RuntimeError before ``start()``)."""
        if self.proc is None:
            raise RuntimeError(f"bookie {self.bookie_id} was never started: call start() first")
        return self.proc

    def channel(self) -> grpc.Channel:
        if self._channel is None:
            options = bookie_channel_options(80 << 20)
            if self.client_tls is None:
                self._channel = grpc.insecure_channel(self.address, options=options)
            else:
                self._channel = grpc.secure_channel(
                    self.address, self.client_tls.channel_credentials(),
                    options=options + self.client_tls.channel_options())
        return self._channel

    def stub(self) -> pb_grpc.BookieStub:
        return pb_grpc.BookieStub(self.channel())

    def close_channel(self) -> None:
        if self._channel is not None:
            self._channel.close()
            self._channel = None

    def kill(self) -> None:
        """SIGKILL (crash) and reap."""
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
        _LIVE.discard(self)
        self.close_channel()

    def terminate(self, timeout: float = 60.0) -> int:
        """SIGTERM (clean shutdown); returns the exit code."""
        if self.proc is None:
            return 0
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.kill()
        _LIVE.discard(self)
        self.close_channel()
        return self.proc.returncode

    def signal(self, sig: int) -> None:
        self.started().send_signal(sig)

    def restart(self, timeout: float = 60.0) -> "BookieProcess":
        self.kill()
        return self.start(timeout=timeout)

    def _logged_ready(self) -> bool:
        """The ready line in what this start wrote to the log."""
        try:
            with open(self.log_path, "rb") as fh:
                fh.seek(self._log_start)
                return READY_LINE.encode() in fh.read()
        except OSError:
            return False

    def log_tail(self, n: int = 4000) -> str:
        try:
            with open(self.log_path, "rb") as fh:
                data = fh.read()
            return data[-n:].decode(errors="replace")
        except OSError:
            return ""

    def __enter__(self) -> "BookieProcess":
        return self

    def __exit__(self, *exc) -> None:
        self.kill()


# -- small wire helpers for tests and benchmarks ------------------------------------------
def payload_for(ledger_id: int, entry_id: int, size: int = 100) -> bytes:
    """Deterministic, entry-specific payload (so byte-identity checks mean something)."""
    head = f"{ledger_id}:{entry_id}:".encode()
    return (head * (size // len(head) + 1))[:size]


def entries_bytes(ledger_id: int, entry_ids, lac: int = -1, size: int = 100,
                  payloads=None) -> bytes:
    ids = list(entry_ids)
    if payloads is None:
        payloads = [payload_for(ledger_id, e, size) for e in ids]
    # bookies store lengths and digests without interpreting them
    return batch_to_bytes(make_batch(ledger_id, ids, [lac] * len(ids),
                                     cumulative_lengths(0, payloads), payloads,
                                     [b"d"] * len(ids)))


def read_all(stub, ledger_id: int, first: int, last: int) -> dict[int, bytes]:
    """Read [first, last] following LIMIT continuations; {entry_id: payload}."""
    out: dict[int, bytes] = {}
    nxt = first
    while nxt <= last:
        r = stub.ReadEntries(pb.ReadRequest(ledger_id=ledger_id, first_entry_id=nxt,
                                            last_entry_id=last), timeout=60)
        if r.code != 0:
            break
        b = batch_from_bytes(r.entries)
        ids = b.column(1).to_pylist()
        out.update(zip(ids, b.column(3).to_pylist()))
        nxt = ids[-1] + 1
        if r.end != pb.LIMIT:
            break
    return out
