"""Figure 9: scaling, measured.  Batched appends and reads with 3, 5 and 7
bookie hosts, and what each entry costs in CPU, per process kind.

Layout (``pybk_spark.cluster.host_cluster.HostCluster``, network namespaces
on a private bridge, docs/testing.md): etcd on its own host(s) (3 members;
1 in the quick run), every bookie on its own host, and W writer processes
(``bench.scaling_writer``), one per host ``client-1..W``.  The cluster
starts with 3 bookies and grows to 5 and 7 (``HostCluster.add_bookie``);
the writer processes live through the whole run (one client each).

One round per bookie count N: each writer gets an E=3 Qw=3 Qa=2 ledger on
a round-robin ensemble (writer i: bookies 3i, 3i+1, 3i+2 mod N, so every
bookie carries load; random placement of a handful of ledgers would leave
some bookies idle by chance), warms up on a throw-away ledger, then

* **append**: every writer at once ``add_entries`` of its 1 KiB payloads
  (the code of figure 3: chunks of 1000, up to 64 in flight), then
  ``close()`` (which waits for the third copies);
* **read**: every writer at once reads its closed ledger back without
  fencing (the code of figure 5).

Before the phases, an idle window (no load, 3 s; 0.5 s quick) measures what
each process kind burns per second doing nothing (gRPC pollers, lease
keep-alives, etcd's raft heartbeats): that part of the cost grows with the
number of processes and the length of a window, not with entries, so each
phase also reports its per-entry CPU net of it (``net_of_idle_...``).

Around each phase the coordinator (this process, idle in the window, not
counted) reads utime+stime from ``/proc/<pid>/stat`` of every writer, bookie
and etcd process, so a phase's CPU is exactly what those processes used
between its start and the last writer's answer.  Reported per round and
phase: entries/s (all entries over the span from the first writer's start
to the last writer's end) and CPU-seconds per million entries for writers,
bookies and etcd, plus each process's CPU.  On this 2-core machine the
entries/s flatten (every process shares the same two cores); the per-entry
CPU is the figure that says how the work would spread over N machines
(docs/performance.md, "(9) Scaling").

Where namespaces cannot be made (not root, no ``ip``, no etcd binary) the
figure is ``{"available": false, "reason": ...}``.  ``--loopback`` runs the
same rounds on a ``LocalCluster`` instead (one etcd process; bookies and
writers on this host's loopback), for a machine without ``ip``; its bookie
counts are set with ``--bookies``.  Bounded: a fixed number
of processes and entries, every answer awaited with a deadline; the cluster,
the writers and their hosts go away on any failure (``HostCluster.close``
removes the network and everything in it).
"""
from __future__ import annotations

import json
import os
import queue
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import IO

from bench.stats import rate

ROOT = Path(__file__).resolve().parents[1]
BOOKIE_COUNTS = (3, 5, 7)
KINDS = ("writers", "bookies", "etcd")
_CLK_TCK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def sizes(quick: bool) -> dict:
    if quick:
        return {"writers": 3, "entries_per_writer": 10_000, "warmup": 1_000, "etcd_members": 1,
                "idle_s": 0.5, "deadline_s": 180.0, "bookie_conf": {"journal_prealloc_bytes": 4 << 20}}
    return {"writers": 4, "entries_per_writer": 100_000, "warmup": 10_000, "etcd_members": 3,
            "idle_s": 3.0, "deadline_s": 600.0, "bookie_conf": {}}


def unavailable_reason() -> str | None:
    """Why the figure cannot run here, or None."""
    from pybk_spark.cluster.host_cluster import unavailable_reason as cluster_reason
    return cluster_reason()


def cpu_times(pid: int) -> tuple[float, float]:
    """(utime, stime) of a process (all its threads), from /proc/<pid>/stat."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return int(fields[11]) / _CLK_TCK, int(fields[12]) / _CLK_TCK


def ensembles(n_bookies: int, n_writers: int, bookie_ids: list[str]) -> list[list[str]]:
    """Writer i's E=3 ensemble: bookies 3i..3i+2 mod N (round-robin)."""
    return [[bookie_ids[(3 * i + k) % n_bookies] for k in range(3)] for i in range(n_writers)]


def _stdin(proc: subprocess.Popen) -> IO[str]:
    """A writer's stdin (every writer is started with stdin=PIPE, in text mode)."""
    assert proc.stdin is not None, "writers are started with stdin=PIPE"
    return proc.stdin

class Writers:
    """W ``bench.scaling_writer`` processes, one per host ``client-<i>``."""

    def __init__(self, cluster, count: int, log_dir: Path, deadline: float):
        self.deadline = deadline
        self.procs: list[subprocess.Popen] = []
        self.names: list[str] = []
        self._queues: list[queue.SimpleQueue] = []
        self._logs = []
        from pybk_spark.cluster import procs
        try:
            for i in range(count):
                name = f"client-{i + 1}"
                host = cluster.network.add_host(name)
                log = open(log_dir / f"{name}.log", "ab")
                self._logs.append(log)
                argv = host.command([sys.executable, "-m", "bench.scaling_writer",
                                     "--uri", cluster.metadata_uri])
                proc = procs.spawn(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                   stderr=log, cwd=str(ROOT), text=True, bufsize=1)
                q: queue.SimpleQueue = queue.SimpleQueue()
                threading.Thread(target=_pump, args=(proc.stdout, q), daemon=True,
                                 name=f"scaling-{name}").start()
                self.procs.append(proc)
                self.names.append(name)
                self._queues.append(q)
            for i in range(count):
                self._answer(i)                  # {"ready": true}
        except BaseException:
            self.close()
            raise

    @property
    def pids(self) -> dict[str, int]:
        return {n: p.pid for n, p in zip(self.names, self.procs)}

    def call_all(self, messages: list[dict]) -> list[dict]:
        """Send message i to writer i (all first), then await every answer."""
        for proc, msg in zip(self.procs, messages):
            _stdin(proc).write(json.dumps(msg) + "\n")
            _stdin(proc).flush()
        return [self._answer(i) for i in range(len(self.procs))]

    def _answer(self, i: int) -> dict:
        left = self.deadline - time.monotonic()
        try:
            line = self._queues[i].get(timeout=max(0.0, left))
        except queue.Empty:
            raise TimeoutError(f"{self.names[i]}: no answer before the figure's deadline "
                               f"(log: {self._logs[i].name})") from None
        if line is None:
            raise RuntimeError(f"{self.names[i]} exited (code {self.procs[i].poll()}); "
                               f"log: {self._logs[i].name}")
        reply = json.loads(line)
        if "error" in reply:
            raise RuntimeError(f"{self.names[i]}: {reply['error']}")
        return reply

    def close(self) -> None:
        for proc in self.procs:
            try:
                _stdin(proc).write(json.dumps({"cmd": "exit"}) + "\n")
                _stdin(proc).flush()
                _stdin(proc).close()
            except (OSError, ValueError):
                pass
        for proc in self.procs:
            _wait_or_kill(proc, 15.0)
        for log in self._logs:
            log.close()


def _wait_or_kill(proc: subprocess.Popen, grace: float) -> None:
    from pybk_spark.cluster import procs
    try:
        proc.wait(grace)
    except subprocess.TimeoutExpired:
        pass
    procs.terminate(proc, grace=0)


def _pump(stream, q: queue.SimpleQueue) -> None:
    for line in stream:
        if line.strip():
            q.put(line)
    q.put(None)


def _snapshot(pids: dict[str, dict[str, int]]) -> dict:
    """(utime, stime) of every process, by kind."""
    return {k: {n: cpu_times(p) for n, p in d.items()} for k, d in pids.items()}


def _delta(before: dict, after: dict, part: slice = slice(0, 2)) -> dict:
    """CPU-s used between two snapshots, per process (``part``: user, system or both)."""
    return {k: {n: sum(after[k][n][part]) - sum(before[k][n][part]) for n in d}
            for k, d in before.items()}


def _idle(pids: dict[str, dict[str, int]], seconds: float) -> dict:
    """CPU-s per second of every process kind with no load at all (the time-
    based part of the cost: pollers, heartbeats, etcd's raft ticks)."""
    before, t0 = _snapshot(pids), time.monotonic()
    time.sleep(seconds)                     # the measurement window itself
    used, span = _delta(before, _snapshot(pids)), time.monotonic() - t0
    rates = {k: sum(d.values()) / span for k, d in used.items()}
    per_proc = {k: rates[k] / max(1, len(pids[k])) for k in KINDS}
    return {"seconds": span, "cpu_s_per_s": rates, "cpu_s_per_s_per_process": per_proc}


def _phase(name: str, writers: Writers, pids: dict[str, dict[str, int]], idle: dict) -> dict:
    before = _snapshot(pids)
    t0 = time.monotonic()
    replies = writers.call_all([{"cmd": name}] * len(writers.procs))
    window = time.monotonic() - t0
    after = _snapshot(pids)
    kernel = {k: sum(d.values()) for k, d in _delta(before, after, slice(1, 2)).items()}
    entries = sum(r["entries"] for r in replies)
    span = max(r["end"] for r in replies) - min(r["start"] for r in replies)
    per_proc = {k: {n: round(v, 3) for n, v in d.items()} for k, d in _delta(before, after).items()}
    cpu = {k: sum(per_proc[k].values()) for k in KINDS}
    cpu["total"] = sum(cpu.values())
    net = {k: max(0.0, cpu[k] - idle["cpu_s_per_s"][k] * window) for k in KINDS}
    net["total"] = sum(net.values())
    return {"entries": entries, "seconds": span, "window_s": window,
            "entries_per_s": rate(entries, span),
            "mb_per_s": rate(entries * 1024, span) / 1e6,
            "cpu_s": {k: round(v, 3) for k, v in cpu.items()},
            "cpu_s_per_m_entries": {k: v * 1e6 / entries for k, v in cpu.items()},
            "net_of_idle_cpu_s_per_m_entries": {k: v * 1e6 / entries for k, v in net.items()},
            "kernel_share": {k: round(kernel[k] / cpu[k], 3) if cpu[k] else None for k in KINDS},
            "cpu_s_by_process": per_proc,
            "per_writer_entries_per_s": [r["entries_per_s"] for r in replies],
            "ensemble_changes": sum(r.get("ensemble_changes", 0) for r in replies)}


def _round(cluster, writers: Writers, n: int, sz: dict) -> dict:
    bookie_ids = cluster.bookie_ids[:n]
    ens = ensembles(n, len(writers.procs), bookie_ids)
    setup = writers.call_all([{"cmd": "setup", "ensemble": e, "entries": sz["entries_per_writer"],
                               "warmup": sz["warmup"]} for e in ens])
    pids = {"writers": writers.pids, **cluster.server_pids(bookie_ids)}
    idle = _idle(pids, sz["idle_s"])
    return {"bookies": n, "ensembles": [s["ensemble"] for s in setup], "idle": idle,
            "append": _phase("append", writers, pids, idle),
            "read": _phase("read", writers, pids, idle)}


class _OnHosts:
    """A ``HostCluster`` as the rounds use it: each bookie on its own host."""

    def __init__(self, cluster):
        self.cluster = cluster
        self.network = cluster.network
        self.metadata_uri = cluster.metadata_uri

    @property
    def bookie_ids(self) -> list[str]:
        return self.cluster.bookie_ids

    def server_pids(self, bookie_ids: list[str]) -> dict[str, dict[str, int]]:
        return {"bookies": {b: self.cluster.bookies[b].proc.pid for b in bookie_ids},
                "etcd": {m.name: m.pid for m in self.cluster.etcd.members}}

    def grow(self, n: int) -> None:
        """Add bookie hosts up to ``n`` bookies: launched together, then awaited."""
        new = [f"bookie-{i + 1}" for i in range(len(self.cluster.bookies), n)]
        for bid in new:
            self.cluster.add_bookie(bid, wait=False)
        for bid in new:
            self.cluster.wait_registered(bid)


class _ThisHost:
    """Every writer runs here: a host's command is the argv itself."""

    @staticmethod
    def command(argv: list[str]) -> list[str]:
        return argv


class _Loopback:
    """A ``LocalCluster`` as the rounds use it: one etcd process, bookies and
    writers on this host's loopback."""

    class _Network:
        @staticmethod
        def add_host(name: str) -> _ThisHost:
            return _ThisHost()

    def __init__(self, cluster):
        self.cluster = cluster
        self.network = self._Network()
        self.metadata_uri = cluster.metadata_uri

    @property
    def bookie_ids(self) -> list[str]:
        return self.cluster.bookie_ids

    def server_pids(self, bookie_ids: list[str]) -> dict[str, dict[str, int]]:
        return {"bookies": {b: self.cluster.bookie_pid(b) for b in bookie_ids},
                "etcd": {"etcd": self.cluster.started_etcd().pid}}

    def grow(self, n: int) -> None:
        while len(self.cluster.bookie_ids) < n:
            self.cluster.add_bookie()


def _rounds(cluster, sz: dict, counts: tuple[int, ...], data_dir: Path, deadline: float) -> dict:
    rounds = {}
    writers = Writers(cluster, sz["writers"], data_dir, deadline)
    try:
        for n in counts:
            cluster.grow(n)
            rounds[str(n)] = _round(cluster, writers, n, sz)
            if time.monotonic() > deadline:
                raise TimeoutError(f"scaling figure over its {sz['deadline_s']} s budget "
                                   f"after {n} bookies")
    finally:
        writers.close()
    return rounds


def measure(quick: bool, work: str, *, loopback: bool = False,
            counts: tuple[int, ...] = BOOKIE_COUNTS, writers: int | None = None) -> dict:
    sz = sizes(quick)
    if writers is not None:
        sz["writers"] = writers
    deadline = time.monotonic() + sz["deadline_s"]
    data_dir = Path(work) / "scaling"
    if loopback:
        from pybk_spark.cluster.local import LocalCluster
        data_dir.mkdir(parents=True, exist_ok=True)
        with LocalCluster(data_dir, num_bookies=counts[0], bookie_conf=sz["bookie_conf"] or None,
                          ready_timeout=120.0) as local:
            rounds = _rounds(_Loopback(local), sz, counts, data_dir, deadline)
        layout, members = "every writer and bookie a process on this host's loopback", 1
    else:
        reason = unavailable_reason()
        if reason:
            return {"available": False, "reason": reason}
        from pybk_spark.cluster.host_cluster import HostCluster
        with HostCluster(data_dir, etcd_members=sz["etcd_members"], num_bookies=counts[0],
                         bookie_conf=sz["bookie_conf"], ready_timeout=120.0) as cluster:
            rounds = _rounds(_OnHosts(cluster), sz, counts, data_dir, deadline)
        layout, members = "one process per host", sz["etcd_members"]
    return {"available": True, "writers": sz["writers"], "writer_layout": layout,
            "entries_per_writer": sz["entries_per_writer"], "entry_bytes": 1024,
            "quorum": "E=3 Qw=3 Qa=2", "etcd_members": members,
            "bookie_counts": list(counts), "rounds": rounds}


def cpu_ratio(fig: dict | None, phase: str = "append", kind: str = "total") -> float | None:
    """CPU per entry with the most bookies / with the fewest (near 1.0: flat)."""
    rounds = (fig or {}).get("rounds") or {}
    lo, hi = str(BOOKIE_COUNTS[0]), str(BOOKIE_COUNTS[-1])
    try:
        den = rounds[lo][phase]["cpu_s_per_m_entries"][kind]
        num = rounds[hi][phase]["cpu_s_per_m_entries"][kind]
    except (KeyError, TypeError):
        return None
    return num / den if den else None


def main(argv=None) -> int:
    """``python -m bench.scaling [--quick] [--loopback] [--bookies 3,6,9]
    [--writers W] [--data-dir DIR]``: this figure alone, JSON on stdout; with
    --data-dir the cluster's and writers' logs stay there."""
    import argparse
    import tempfile
    p = argparse.ArgumentParser(prog="python -m bench.scaling")
    p.add_argument("--quick", action="store_true", help="tiny sizes: checks the harness")
    p.add_argument("--loopback", action="store_true",
                   help="a LocalCluster on loopback instead of one host per process")
    p.add_argument("--bookies", default=",".join(map(str, BOOKIE_COUNTS)),
                   help="the rounds' bookie counts, ascending, each at least 3 (default: 3,5,7)")
    p.add_argument("--writers", type=int, help="writer processes (default: 4; 3 quick)")
    p.add_argument("--data-dir", help="keep data and logs here (default: a temporary dir)")
    a = p.parse_args(argv)
    try:
        counts = tuple(int(x) for x in a.bookies.split(","))
    except ValueError:
        p.error(f"--bookies {a.bookies!r}: give bookie counts like 3,5,7")
    if not counts or counts[0] < 3 or list(counts) != sorted(set(counts)):
        p.error(f"--bookies {a.bookies!r}: ascending counts, each at least 3 (E=3)")
    if a.writers is not None and a.writers < 1:
        p.error(f"--writers {a.writers}: at least 1")
    sz_writers = a.writers

    def run(work: str) -> dict:
        return measure(a.quick, work, loopback=a.loopback, counts=counts, writers=sz_writers)
    if a.data_dir:
        print(json.dumps(run(a.data_dir), indent=1, default=str))
        return 0
    with tempfile.TemporaryDirectory(prefix="pybk-scaling-") as tmp:
        print(json.dumps(run(tmp), indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
