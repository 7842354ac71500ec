"""The floor of a replicated synchronous add written in Python.

Figure 4's peer for CPU: the least a Python client and three Python
"bookies" can spend on one acknowledged add of the same shape (1 KiB,
written to 3, acknowledged after 2), measured in the same run.

* Each floor bookie is a separate process (``python -c``) serving one TCP
  connection on one thread: read a length-prefixed frame, ``os.write`` it to
  a journal file, ``os.fdatasync``, send an 8-byte answer.  No Arrow, no
  protobuf, no index, no metrics, no thread hand-off.
* The client is one thread: send the frame to the three, poll until two
  answers arrived, and read the third before the next add (so every answer is
  consumed, as the real client does).

What it leaves out is what a real bookie must do (validate, index, fence
checks, keep the LAC, metrics) and what a real client must do (ids,
digests, ensemble changes, timeouts), so ours / floor says how much of the
CPU per add is the protocol's Python and how much is Python and the kernel
themselves.  The CPU is each process's utime + stime over the timed window.
"""
from __future__ import annotations

import os
import select
import socket
import subprocess
import sys
import tempfile
import time

import numpy as np

from bench.cpu import machine_busy_s, proc_cpu_s, self_cpu_s

_SERVER = r"""
import os, socket, sys
journal = os.open(sys.argv[1], os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
srv = socket.create_server(("127.0.0.1", 0))
print(srv.getsockname()[1], flush=True)
conn, _ = srv.accept()
conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
head = bytearray(4)
body = bytearray(1 << 20)
hv, bv = memoryview(head), memoryview(body)
while True:
    got = 0
    while got < 4:
        k = conn.recv_into(hv[got:])
        if not k:
            sys.exit(0)
        got += k
    n = int.from_bytes(head, "little")
    got = 0
    while got < n:
        k = conn.recv_into(bv[got:n])
        if not k:
            sys.exit(0)
        got += k
    os.write(journal, bv[:n])
    os.fdatasync(journal)
    conn.sendall(head + head)
"""


def measure(n: int = 2000, entry_bytes: int = 1024, replicas: int = 3, acks: int = 2) -> dict:
    with tempfile.TemporaryDirectory() as d:
        procs, socks = [], []
        try:
            for i in range(replicas):
                p = subprocess.Popen([sys.executable, "-c", _SERVER, os.path.join(d, f"j{i}")],
                                     stdout=subprocess.PIPE, text=True)
                procs.append(p)
                assert p.stdout is not None, "started with stdout=PIPE"
                port = int(p.stdout.readline())
                s = socket.create_connection(("127.0.0.1", port))
                s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                socks.append(s)
            frame = entry_bytes.to_bytes(4, "little") + os.urandom(entry_bytes)
            poller = select.poll()
            for s in socks:
                poller.register(s, select.POLLIN)
            for _ in range(100):
                _add(socks, poller, frame, acks)
            pids = [p.pid for p in procs]
            lat = np.empty(n)
            c0, b0, m0 = self_cpu_s(), sum(proc_cpu_s(p) for p in pids), machine_busy_s()
            t0 = time.perf_counter()
            for i in range(n):
                lat[i] = _add(socks, poller, frame, acks)
            elapsed = time.perf_counter() - t0
            c1, b1, m1 = self_cpu_s(), sum(proc_cpu_s(p) for p in pids), machine_busy_s()
        finally:
            for s in socks:
                s.close()
            for p in procs:
                try:
                    p.wait(10)
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait()
    client_us, bookies_us = (c1 - c0) / n * 1e6, (b1 - b0) / n * 1e6
    return {"adds": n, "entries_per_s": n / elapsed,
            "p50_ms": float(np.percentile(lat, 50) * 1e3),
            "p99_ms": float(np.percentile(lat, 99) * 1e3),
            "p999_ms": float(np.percentile(lat, 99.9) * 1e3),
            "cpu_us_per_add": {"client": client_us, "bookies": bookies_us,
                               "total": client_us + bookies_us},
            # every other process on the machine meanwhile, in cores (as bench/cpu.py's)
            "others_cores": round(max(0.0, (m1 - m0) - (c1 - c0) - (b1 - b0)) / elapsed, 2),
            "shape": f"{entry_bytes} B, written to {replicas}, acknowledged after {acks}"}


def _add(socks: list, poller, frame: bytes, acks: int) -> float:
    """One add: send to every replica, the seconds until ``acks`` answers;
    the rest are read before returning (not timed)."""
    t0 = time.perf_counter()
    for s in socks:
        s.sendall(frame)
    want = {s.fileno(): 8 for s in socks}
    answered, quorum_s = 0, 0.0
    while want:
        for fd, _ in poller.poll():
            if fd not in want:
                continue
            want[fd] -= len(os.read(fd, want[fd]))
            if want[fd] == 0:
                del want[fd]
                answered += 1
                if answered == acks:
                    quorum_s = time.perf_counter() - t0
    return quorum_s


if __name__ == "__main__":
    print(measure())
