"""CPU per entry by process kind, from the processes' own counters.

A :class:`CpuMeter` reads, around a timed window, the CPU (user + system) of

* the client: this process, ``resource.getrusage(RUSAGE_SELF)`` (every
  thread of the in-process client; the benchmark's own loop is part of it,
  as it is of any application);
* each bookie and etcd process: utime + stime from ``/proc/<pid>/stat``.

and turns the deltas into CPU-seconds per million entries (= microseconds of
CPU per entry) for each kind, and their sum; ``others_cores`` is what every
other process on the machine ran meanwhile, in cores (/proc/stat), the load a
figure was measured under.  On this shared 2-core machine
a latency figure measures how the processes queue for the CPU as much as the
protocol; the CPU each entry costs is what carries over to real hosts.

:func:`projected_sync_latency` turns the sync-add figure into the latency a
host-per-bookie deployment would see; its assumptions are in the returned
dict (``assumptions``), so the JSON carries them beside the number.
"""
from __future__ import annotations

import os
import resource
import time

CLK_TCK = os.sysconf("SC_CLK_TCK")
ASSUMED_RTT_MS = 0.1          # one LAN round trip, client <-> bookie (same rack)


def proc_cpu_s(pid: int) -> float:
    """utime + stime of a process (all its threads), seconds; 0 if it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def self_cpu_s() -> float:
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return ru.ru_utime + ru.ru_stime


def machine_busy_s() -> float:
    """CPU-seconds the whole machine spent busy (all cores, all processes:
    /proc/stat, less idle and iowait) since boot; 0 where it cannot be read."""
    try:
        with open("/proc/stat") as f:
            ticks = [int(x) for x in f.readline().split()[1:]]
    except (OSError, ValueError):
        return 0.0
    return (sum(ticks) - ticks[3] - ticks[4]) / CLK_TCK


def cluster_pids(cluster) -> dict[str, list[int]]:
    """Process kind -> pids of a LocalCluster's live bookies and etcd."""
    bookies = [p for p in (cluster.bookie_pid(b) for b in cluster.bookie_ids) if p]
    etcd = [cluster.etcd.pid] if cluster.etcd is not None and cluster.etcd.pid else []
    return {"bookies": bookies, "etcd": etcd}


class CpuMeter:
    """``with CpuMeter(pids) as m: ...`` then ``m.per_m_entries(n)``."""

    def __init__(self, pids: dict[str, list[int]] | None):
        self.pids = pids or {}
        self.start: dict[str, float] = {}
        self.used: dict[str, float] = {}
        self.others_cores: float | None = None

    def _read(self) -> dict[str, float]:
        out = {"client": self_cpu_s()}
        for kind, pids in self.pids.items():
            out[kind] = sum(proc_cpu_s(p) for p in pids)
        return out

    def __enter__(self) -> "CpuMeter":
        self.start = self._read()
        self._busy0, self._t0 = machine_busy_s(), time.monotonic()
        return self

    def __exit__(self, *exc) -> None:
        end = self._read()
        self.used = {k: max(0.0, end[k] - self.start[k]) for k in end}
        # What the rest of the machine (processes not measured here) ran meanwhile,
        # in cores: on a shared machine the CPU per entry rises with it.
        elapsed = time.monotonic() - self._t0
        if elapsed > 0 and self._busy0 > 0:
            self.others_cores = max(0.0, machine_busy_s() - self._busy0
                                    - sum(self.used.values())) / elapsed

    def per_m_entries(self, entries: int) -> dict:
        """CPU-seconds per million entries for each kind and in total."""
        if not self.used or entries <= 0:
            return {}
        out = {k: v / entries * 1e6 for k, v in self.used.items()}
        out["total"] = sum(self.used.values()) / entries * 1e6
        return out

    def figure(self, entries: int) -> dict:
        return {"cpu_s": {k: round(v, 4) for k, v in self.used.items()},
                "processes": {k: len(v) for k, v in self.pids.items()},
                "cpu_s_per_m_entries": self.per_m_entries(entries),
                "others_cores": (None if self.others_cores is None
                                 else round(self.others_cores, 2))}


def projected_sync_latency(cpu_per_m: dict, bookies: int, fsync_p50_ms: float | None,
                           rtt_ms: float = ASSUMED_RTT_MS) -> dict | None:
    """The sync add latency one would see with each process on its own host.

    critical path = client CPU per add + one bookie's CPU per add (the Qw
    bookies work in parallel; the ack waits for the Qa-th, all alike) + one
    fdatasync (figure 1's p50) + one network round trip."""
    if not cpu_per_m or not bookies or fsync_p50_ms is None:
        return None
    client_ms = cpu_per_m.get("client", 0.0) / 1e3
    bookie_ms = cpu_per_m.get("bookies", 0.0) / bookies / 1e3
    return {"ms": client_ms + bookie_ms + fsync_p50_ms + rtt_ms,
            "client_cpu_ms": client_ms, "one_bookie_cpu_ms": bookie_ms,
            "fsync_p50_ms": fsync_p50_ms, "rtt_ms": rtt_ms,
            "assumptions": (
                "each process on its own host with a free core; client CPU and one bookie's "
                "CPU per add are serial on the critical path (the bookies of the write set "
                "work in parallel); the bookie's fdatasync waits once (this disk's 4 KiB "
                f"fdatasync p50); one LAN round trip of {rtt_ms} ms; no queueing (one add in "
                "flight); CPU measured here, with 2 shared cores, includes context switches "
                "a dedicated host would not pay, so this is an upper bound on the CPU part")}
