"""CPU per sync add by process and by thread, for the per-add path (figure 4).

    .venv/bin/python -m bench.cpu_by_thread [ADDS] [ROUNDS]

Starts a ``LocalCluster`` (etcd + 3 bookie-server processes), opens an
E=3 Qw=3 Qa=2 ledger and, in each round, times ``ADDS`` sync ``add_entry``
calls of 1 KiB.  For the client (this process) and every bookie it prints
the user and system CPU per add of each thread (``/proc/<pid>/task/*/stat``)
and its voluntary context switches per add, named by the thread names
Python gave them (the bookies' names come from ``py-spy dump`` when py-spy
is installed, else the thread ids).  Where the CPU of one add goes, thread
by thread, is what docs/performance.md, (4), compares builds with: run it
for each build in interleaved rounds on one machine.
"""
from __future__ import annotations

import collections
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading

from bench.client_append import payloads, timed_sync_adds

TICK = os.sysconf("SC_CLK_TCK")
Snapshot = dict[str, tuple[int, int, int]]      # thread id -> (utime, stime, voluntary switches)


def snapshot(pid: int) -> Snapshot:
    out: Snapshot = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{tid}/stat") as f:
                stat = f.read()
            with open(f"/proc/{pid}/task/{tid}/status") as f:
                status = f.read()
        except OSError:            # the thread ended meanwhile
            continue
        fields = stat[stat.rindex(")") + 2:].split()
        switches = int(status.split("voluntary_ctxt_switches:")[1].split()[0])
        out[tid] = (int(fields[11]), int(fields[12]), switches)
    return out


def thread_names(pid: int) -> dict[str, str]:
    if pid == os.getpid():
        return {str(t.native_id): t.name for t in threading.enumerate()}
    if shutil.which("py-spy") is None:
        return {}
    dump = subprocess.run(["py-spy", "dump", "--nonblocking", "-p", str(pid)],
                          capture_output=True, text=True).stdout
    return {m.group(1): m.group(2) for m in re.finditer(r'Thread (\d+) \(\w+\): "([^"]*)"', dump)}


def per_add(before: Snapshot, after: Snapshot, names: dict[str, str], adds: int
            ) -> dict[str, tuple[float, float, float]]:
    """Thread name -> (user us, system us, voluntary switches) per add."""
    agg: dict[str, list[float]] = collections.defaultdict(lambda: [0.0, 0.0, 0.0])
    for tid, (u, s, v) in after.items():
        u0, s0, v0 = before.get(tid, (0, 0, 0))
        row = agg[names.get(tid, tid)]
        row[0] += (u - u0) * 1e6 / TICK / adds
        row[1] += (s - s0) * 1e6 / TICK / adds
        row[2] += (v - v0) / adds
    return {k: (v[0], v[1], v[2]) for k, v in
            sorted(agg.items(), key=lambda kv: -(kv[1][0] + kv[1][1])) if v[0] + v[1] > 0}


def main(adds: int, rounds: int) -> None:
    from bench.cpu import cluster_pids
    from pybk_spark import BookKeeper
    from pybk_spark.cluster.local import LocalCluster
    data = payloads(adds)
    work = tempfile.mkdtemp(prefix="pybk-cpu-by-thread-")
    try:
        with LocalCluster(os.path.join(work, "cluster"), num_bookies=3) as cluster:
            procs = {"client": os.getpid(),
                     **{f"bookie {i}": p for i, p in enumerate(cluster_pids(cluster)["bookies"])}}
            with BookKeeper(cluster.metadata_uri) as bk:
                lh = bk.create_ledger(3, 3, 2)
                for p in data[:200]:
                    lh.add_entry(p)
                for rnd in range(rounds):
                    before = {k: snapshot(p) for k, p in procs.items()}
                    lat, elapsed = timed_sync_adds(lh, data)
                    after = {k: snapshot(p) for k, p in procs.items()}
                    lat.sort()
                    print(f"round {rnd}: {adds / elapsed:,.0f} adds/s, p50 "
                          f"{lat[adds // 2] * 1e3:.3f} ms, p99 {lat[int(adds * .99)] * 1e3:.3f} ms")
                    for kind, pid in procs.items():
                        rows = per_add(before[kind], after[kind], thread_names(pid), adds)
                        total = sum(u + s for u, s, _ in rows.values())
                        print(f"  {kind}: {total:.0f} us per add")
                        for name, (u, s, v) in rows.items():
                            print(f"    {name}: {u:.0f} user + {s:.0f} sys us, {v:.2f} switches")
                lh.close()
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 3000,
         int(sys.argv[2]) if len(sys.argv) > 2 else 2)
