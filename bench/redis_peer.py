"""Redis Streams peer: a durable (appendfsync always) but unreplicated,
unfenced log, started by the benchmark itself on 127.0.0.1 in a temp dir.

    python -m bench.redis_peer [--quick]

Figures (1 KiB values):
  * sync XADD, one client (redis-py), with p50/p99/p999 latency
  * pipelined XADD x1000, one client (redis-benchmark -c1 -P1000)
  * 50 clients x pipeline 100 (redis-benchmark -c50 -P100)
  * XRANGE COUNT 1000 catch-up read (redis-py)
"""
from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time

from bench.stats import latency_summary, rate

VALUE = os.urandom(512).hex().encode()        # 1 KiB, incompressible-ish


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def redis_binaries() -> tuple[str, str]:
    server, bench = shutil.which("redis-server"), shutil.which("redis-benchmark")
    if not server or not bench:
        raise RuntimeError("redis-server not installed: run `make bench` (installs it with apt-get)")
    return server, bench


@contextlib.contextmanager
def redis_server():
    server, _ = redis_binaries()
    port = _free_port()
    tmp = tempfile.mkdtemp(prefix="pybk-bench-redis-")
    proc = subprocess.Popen([server, "--port", str(port), "--bind", "127.0.0.1", "--dir", tmp,
                             "--appendonly", "yes", "--appendfsync", "always", "--save", "",
                             "--protected-mode", "no"], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    try:
        import redis
        client = redis.Redis(host="127.0.0.1", port=port)
        deadline = time.monotonic() + 20
        while True:
            try:
                client.ping()
                break
            except redis.ConnectionError:
                if time.monotonic() > deadline or proc.poll() is not None:
                    raise RuntimeError("redis-server did not start") from None
                time.sleep(0.05)
        yield port, client
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
        shutil.rmtree(tmp, ignore_errors=True)


def redis_benchmark(port: int, clients: int, pipeline: int, requests: int) -> float:
    """Entries/s reported by redis-benchmark for XADD of a 1 KiB value."""
    _, bench = redis_binaries()
    out = subprocess.run([bench, "-h", "127.0.0.1", "-p", str(port), "-c", str(clients),
                          "-P", str(pipeline), "-n", str(requests), "--csv",
                          "XADD", "benchstream", "*", "f", VALUE.decode()],
                         capture_output=True, text=True, check=True, timeout=600).stdout
    for line in out.splitlines():
        parts = [p.strip('"') for p in line.split(",")]
        if len(parts) > 1 and parts[0].upper().startswith("XADD"):
            return float(parts[1])
    raise RuntimeError(f"could not parse redis-benchmark output: {out!r}")


def measure(quick: bool = False) -> dict:
    n_sync = 200 if quick else 5000
    n_pipe = 5_000 if quick else 300_000
    n_read = 5_000 if quick else 1_000_000
    with redis_server() as (port, client):
        latencies = []
        t0 = time.perf_counter()
        for _ in range(n_sync):
            s = time.perf_counter()
            client.xadd("sync", {"f": VALUE})
            latencies.append(time.perf_counter() - s)
        sync = {"entries_per_s": rate(n_sync, time.perf_counter() - t0), **latency_summary(latencies)}
        pipelined_1c = redis_benchmark(port, 1, 1000, n_pipe)
        pipelined_50c = redis_benchmark(port, 50, 100, n_pipe)
        # catch-up read: fill a stream, then XRANGE COUNT 1000 through it
        pipe = client.pipeline(transaction=False)
        for i in range(n_read):
            pipe.xadd("read", {"f": VALUE}, id=f"{i + 1}-0")
            if i % 1000 == 999:
                pipe.execute()
        pipe.execute()
        t0, last, total = time.perf_counter(), "-", 0
        while True:
            rows = client.xrange("read", min=last, max="+", count=1000)
            if last != "-":
                rows = rows[1:]
            if not rows:
                break
            total += len(rows)
            last = rows[-1][0]
        xrange_rate = rate(total, time.perf_counter() - t0)
    return {
        "redis_sync_xadd": sync,
        "redis_pipelined_1c_entries_per_s": pipelined_1c,
        "redis_50c_entries_per_s": pipelined_50c,
        "redis_xrange_entries_per_s": xrange_rate,
        "redis_xrange_entries": total,
    }


if __name__ == "__main__":
    import json
    print(json.dumps(measure("--quick" in sys.argv), indent=2))
