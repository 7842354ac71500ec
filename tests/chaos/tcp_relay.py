"""Delay, jitter, reordering and a long stall on links, without netem (this
kernel has no netem qdisc): a userspace TCP relay inside a test host.

``apply(faults, host, peers, ...)`` (called by link_nemesis.py) starts

    python -m tests.chaos.tcp_relay --port P --mark M --seed S
        --delay-ms D --jitter-ms J --reorder R --stall-s X --ready FILE

inside ``host``'s namespace and adds two rules there, both tagged
``pbk-fault-<id>`` and undone by ``LinkFaults.heal(id)`` like every link
fault:

  nat OUTPUT     -p tcp -d <peer> -m mark ! --mark M -j REDIRECT --to-ports P
                 (every NEW connection from host to a peer lands on the relay,
                 which finds the real destination with SO_ORIGINAL_DST and
                 connects there itself, its socket marked M so that its own
                 connection is not redirected)
  filter OUTPUT  -p tcp -d <peer> -m mark ! --mark M -j REJECT --reject-with
                 tcp-reset
                 (a connection opened before the fault, not redirected, is
                 reset on its next packet: the client reconnects, through the
                 relay)

then the undo kills the relay (its connections reset; the client reconnects
directly).  The relay, per direction of each connection, delivers every chunk
it reads at ``max(previous chunk's time, now + delay +- jitter)``: a TCP
stream stays in order, but each connection (and, with probability
``--reorder``, a connection given an extra 2-5 x delay) runs on its own
clock, so the data of different connections (an add to one bookie, its
sibling to another, a gRPC stream and a lane) arrives out of the order it was
sent.  ``--stall-s`` holds every byte that arrives in the first X seconds
until X seconds have passed (a writer stalled past its lease: its adds reach
the bookies only after the lease lapsed and, maybe, a recoverer fenced the
ledger).  All draws come from ``--seed``.  On SIGTERM it prints its counters
(connections, chunks, bytes, max delay) and exits.
"""
from __future__ import annotations

import argparse
import heapq
import os
import random
import signal
import socket
import struct
import sys
import threading
import time

SO_ORIGINAL_DST = 80
SO_MARK = 36
RELAY_MARK = 0x2B6B        # the relay's upstream sockets (excluded from the rules)


def _original_dst(conn: socket.socket) -> tuple[str, int]:
    raw = conn.getsockopt(socket.SOL_IP, SO_ORIGINAL_DST, 16)
    port, = struct.unpack_from("!H", raw, 2)
    return socket.inet_ntoa(raw[4:8]), port


class Relay:
    def __init__(self, port: int, mark: int, rng: random.Random, delay_s: float,
                 jitter_s: float, reorder: float, stall_s: float, clock=time.monotonic):
        self.port, self.mark, self.rng = port, mark, rng
        self.delay_s, self.jitter_s, self.reorder, self.stall_s = \
            delay_s, jitter_s, reorder, stall_s
        self.clock = clock
        self.t0 = clock()
        self._lock = threading.Lock()
        self.counts = {"connections": 0, "chunks": 0, "bytes": 0, "reordered_conns": 0,
                       "held_chunks": 0, "max_delay_ms": 0}
        self.listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.listener.bind(("0.0.0.0", port))
        self.listener.listen(128)

    def _draw(self) -> tuple[random.Random, float]:
        with self._lock:
            conn_rng = random.Random(self.rng.randrange(1 << 31))
            slow = self.rng.random() < self.reorder
            self.counts["reordered_conns"] += slow
            return conn_rng, (self.rng.uniform(2, 5) if slow else 1.0)

    def serve(self) -> None:
        while True:
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return
            threading.Thread(target=self._connect, args=(conn,), daemon=True).start()

    def _connect(self, conn: socket.socket) -> None:
        try:
            dst = _original_dst(conn)
            up = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            up.setsockopt(socket.SOL_SOCKET, SO_MARK, self.mark)
            up.settimeout(10)
            up.connect(dst)
            up.settimeout(None)
        except OSError:
            conn.close()
            return
        for s in (conn, up):
            s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        with self._lock:
            self.counts["connections"] += 1
        for a, b in ((conn, up), (up, conn)):
            rng, factor = self._draw()
            threading.Thread(target=self._pump, args=(a, b, rng, factor), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket, rng: random.Random,
              factor: float) -> None:
        """Read chunks as they come; a sender thread delivers each at its time."""
        queue: list = []
        cond = threading.Condition()
        done = [False]
        seq = [0]

        def sender() -> None:
            while True:
                with cond:
                    while not queue and not done[0]:
                        cond.wait()
                    if not queue:
                        break
                    due, _n, data = queue[0]
                    wait = due - self.clock()
                    if wait > 0:
                        cond.wait(wait)
                        continue
                    heapq.heappop(queue)
                try:
                    dst.sendall(data)
                except OSError:
                    break
            _close(dst)

        threading.Thread(target=sender, daemon=True).start()
        last_due = 0.0
        while True:
            try:
                data = src.recv(65536)
            except OSError:
                data = b""
            now = self.clock()
            if not data:
                with cond:
                    done[0] = True
                    cond.notify()
                return
            delay = max(0.0, factor * (self.delay_s + rng.uniform(-self.jitter_s,
                                                                   self.jitter_s)))
            due = max(last_due, now + delay)
            held = now < self.t0 + self.stall_s
            if held:
                due = max(due, self.t0 + self.stall_s)
            last_due = due
            with self._lock:
                c = self.counts
                c["chunks"] += 1
                c["bytes"] += len(data)
                c["held_chunks"] += held
                c["max_delay_ms"] = max(c["max_delay_ms"], int((due - now) * 1000))
            with cond:
                seq[0] += 1
                heapq.heappush(queue, (due, seq[0], data))
                cond.notify()


def _close(s: socket.socket) -> None:
    try:
        s.shutdown(socket.SHUT_WR)
    except OSError:
        pass


# -- the harness side ----------------------------------------------------------------------
READY_TIMEOUT_S = 30.0


def apply(faults, host, peers, *, seed: int, delay_ms: float, jitter_ms: float = 0.0,
          reorder: float = 0.0, stall_s: float = 0.0, port: int = 47001,
          log_path=None) -> int:
    """Start a relay in ``host`` and redirect its TCP connections to ``peers``
    through it; returns the fault id (``faults.heal(id)`` undoes it)."""
    from pybk_spark.cluster import link_faults as lf
    lf.require()
    host = faults._hosts([host])[0]
    peers = [p for p in faults._hosts(peers) if p is not host]
    ipt = lf._iptables_binary()
    ready = f"/tmp/pbk-relay-{os.getpid()}-{host.name}-{seed}.ready"
    if os.path.exists(ready):
        os.unlink(ready)
    argv = [sys.executable, "-m", "tests.chaos.tcp_relay", "--port", str(port), "--mark",
            str(RELAY_MARK), "--seed", str(seed), "--delay-ms", f"{delay_ms:g}",
            "--jitter-ms", f"{jitter_ms:g}", "--reorder", f"{reorder:g}",
            "--stall-s", f"{stall_s:g}", "--ready", ready]
    out = open(log_path, "ab") if log_path else None
    from pathlib import Path
    proc = host.spawn(argv, env=dict(os.environ), stdout=out or lf.subprocess.DEVNULL,
                      cwd=str(Path(__file__).resolve().parents[2]))
    if out:
        out.close()
    deadline = time.monotonic() + READY_TIMEOUT_S
    while not os.path.exists(ready):
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            proc.wait()
            raise lf.LinkFaultsUnavailable(f"tcp relay in {host.name} did not start "
                                           f"(exit {proc.poll()})")
        time.sleep(0.05)
    os.unlink(ready)
    rules = []                     # (table, chain, match, target)
    for p in peers:
        match = ["-p", "tcp", "-d", p.address, "-m", "mark", "!", "--mark", str(RELAY_MARK)]
        rules.append(("nat", "OUTPUT", match, ["-j", "REDIRECT", "--to-ports", str(port)]))
        rules.append(("filter", "OUTPUT", match,
                      ["-j", "REJECT", "--reject-with", "tcp-reset"]))
    with faults._lock:
        fid = next(faults._ids)
        tag = ["-m", "comment", "--comment", f"pbk-fault-{fid}"]
        fault = lf.Fault(fid, "relay", f"{host.name} -> {lf._names(peers)} relayed "
                                       f"({delay_ms:.0f}+-{jitter_ms:.0f} ms, reorder "
                                       f"{reorder:.0%}, stall {stall_s:.1f}s)")
        # undo runs in reverse: rules first (new connections go direct), then the relay
        fault.undo.append(host.command(["kill", "-TERM", str(proc.pid)]))
        faults.active[fid] = fault
        try:
            for table, chain, match, target in rules:
                spec = ["-t", table, chain, *match, *tag, *target]
                lf._run(host.command([ipt, "-w", spec[0], spec[1], "-A", *spec[2:]]))
                fault.undo.append(host.command([ipt, "-w", spec[0], spec[1], "-D",
                                                *spec[2:]]))
        except Exception:
            faults.active.pop(fid, None)
            for argv in reversed(fault.undo):
                lf._run(argv, check=False)
            raise
    from pybk_spark.cluster import procs
    procs.unregister(proc)          # the fault's undo (kill) ends it; reap it in the background
    threading.Thread(target=proc.wait, daemon=True).start()
    return fid


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="tests.chaos.tcp_relay")
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--mark", type=int, default=RELAY_MARK)
    p.add_argument("--seed", type=int, required=True)
    p.add_argument("--delay-ms", type=float, default=0.0)
    p.add_argument("--jitter-ms", type=float, default=0.0)
    p.add_argument("--reorder", type=float, default=0.0)
    p.add_argument("--stall-s", type=float, default=0.0)
    p.add_argument("--ready")
    a = p.parse_args(argv)
    relay = Relay(a.port, a.mark, random.Random(a.seed), a.delay_ms / 1000,
                  a.jitter_ms / 1000, a.reorder, a.stall_s)

    def stop(*_):
        print(f"tcp_relay: {relay.counts}", flush=True)
        os._exit(0)
    signal.signal(signal.SIGTERM, stop)
    if a.ready:
        open(a.ready, "w").close()
    relay.serve()
    return 0


if __name__ == "__main__":
    sys.exit(main())
