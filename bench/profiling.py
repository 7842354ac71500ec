"""Where the time goes on the paths that miss their targets.

    .venv/bin/python -m bench.profiling [--quick]    -> bench/results/profile.md

In-process paths are profiled with pyinstrument (wall clock, call tree);
bookie-server processes are sampled at the same time with py-spy (collapsed
stacks, summarised as self time and inclusive time per function).  Scenarios:

  * client_batched: ``add_entries`` of 1 KiB entries, E=3 Qw=3 Qa=2 (figure 3);
  * client_async:   ``add_entry_async`` one entry per request (figure 3);
  * client_sync:    ``add_entry`` one at a time (figure 4);
  * bookie_ingest:  one bookie, pipelined AddStream of 1000 x 1 KiB batches
                    (figure 2; py-spy on the bookie only);
  * spark_read:     the bookkeeper source's ``read(partition)`` run in-process
                    on a 200k-entry ledger (what a Spark Python worker does).
"""
from __future__ import annotations

import argparse
import collections
import os
import shutil
import subprocess
import sys
import tempfile
import time

from bench.client_append import payloads

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(HERE, "results", "profile.md")


class PySpy:
    """``py-spy record`` of some pids for the duration of a ``with`` block."""

    def __init__(self, pids: list[int], work: str, name: str, rate: int = 200):
        self.pids, self.work, self.name, self.rate = pids, work, name, rate
        self.procs: list[tuple[subprocess.Popen, str]] = []

    def __enter__(self):
        exe = shutil.which("py-spy") or os.path.join(os.path.dirname(sys.executable), "py-spy")
        for pid in self.pids:
            out = os.path.join(self.work, f"{self.name}-{pid}.txt")
            p = subprocess.Popen([exe, "record", "--pid", str(pid), "--rate", str(self.rate),
                                  "--format", "raw", "--output", out, "--nonblocking"],
                                 stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            self.procs.append((p, out))
        time.sleep(1.0)      # let py-spy attach before the workload starts
        return self

    def __exit__(self, *exc):
        for p, _ in self.procs:
            p.send_signal(2)            # SIGINT: py-spy writes its output and exits
        for p, _ in self.procs:
            try:
                p.wait(30)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()

    def summary(self, top: int = 14) -> str:
        self_t, incl = collections.Counter[str](), collections.Counter[str]()
        total = 0
        for _, path in self.procs:
            if not os.path.exists(path):
                continue
            for line in open(path):
                stack, _, n = line.rstrip().rpartition(" ")
                if not stack or not n.isdigit():
                    continue
                k = int(n)
                frames = [_short(f) for f in stack.split(";")]
                total += k
                self_t[frames[-1]] += k
                for f in set(frames):
                    incl[f] += k
        if not total:
            return "(no py-spy samples)\n"
        lines = [f"py-spy: {total} samples over {len(self.procs)} process(es) "
                 f"(all threads, idle included)", "", "self time:", ""]
        lines += [f"  {100 * n / total:5.1f}%  {f}" for f, n in self_t.most_common(top)]
        lines += ["", "inclusive time (non-trivial frames):", ""]
        lines += [f"  {100 * n / total:5.1f}%  {f}" for f, n in incl.most_common(top * 3)
                  if 100 * n / total < 99.5][:top]
        return "\n".join(lines) + "\n"


def _short(frame: str) -> str:
    # "func (path/to/file.py:123)" -> "func (file.py)"
    if "(" in frame and frame.endswith(")"):
        name, _, loc = frame.partition(" (")
        loc = loc[:-1].split(":")[0]
        return f"{name} ({'/'.join(loc.split('/')[-2:])})"
    return frame


def _pyinstrument(fn) -> str:
    from pyinstrument import Profiler
    prof = Profiler(interval=0.0005)
    prof.start()
    try:
        fn()
    finally:
        prof.stop()
    return prof.output_text(color=False, unicode=False, show_all=False)


def run(quick: bool) -> str:
    from pybk_spark.ledger.client import BookKeeper
    from pybk_spark.cluster.local import LocalCluster
    n_batched, n_async, n_sync, n_read = ((20_000, 300, 200, 20_000) if quick else
                                          (200_000, 3_000, 1_000, 200_000))
    sections = []
    work = tempfile.mkdtemp(prefix="pybk-profile-")
    try:
        with LocalCluster(os.path.join(work, "cluster"), 3) as cluster:
            uri = cluster.metadata_uri
            pids = [pid for b in cluster.bookie_ids if (pid := cluster.bookie_pid(b)) is not None]
            with BookKeeper(uri) as bk:
                lh = bk.create_ledger(3, 3, 2)
                lh.add_entries(payloads(5_000))
                data = payloads(n_batched)
                with PySpy(pids, work, "batched") as spy:
                    t0 = time.perf_counter()
                    text = _pyinstrument(lambda: lh.add_entries(data))
                    dt = time.perf_counter() - t0
                sections.append(("client_batched", f"{n_batched} entries in {dt:.2f} s "
                                 f"({n_batched / dt:,.0f}/s, profiler on)", text, spy.summary()))
                lh.close()
                lh = bk.create_ledger(3, 3, 2)
                data = payloads(n_async)

                def async_adds():
                    futs = [lh.add_entry_async(p) for p in data]
                    for f in futs:
                        f.result()
                with PySpy(pids, work, "async") as spy:
                    t0 = time.perf_counter()
                    text = _pyinstrument(async_adds)
                    dt = time.perf_counter() - t0
                sections.append(("client_async", f"{n_async} entries in {dt:.2f} s "
                                 f"({n_async / dt:,.0f}/s, profiler on)", text, spy.summary()))

                def sync_adds():
                    for p in data[:n_sync]:
                        lh.add_entry(p)
                with PySpy(pids, work, "sync") as spy:
                    t0 = time.perf_counter()
                    text = _pyinstrument(sync_adds)
                    dt = time.perf_counter() - t0
                sections.append(("client_sync", f"{n_sync} entries in {dt:.2f} s "
                                 f"({n_sync / dt:,.0f}/s, profiler on)", text, spy.summary()))
                lh.close()
                # spark read path, in-process
                from pybk_spark.spark.options import parse_read_options
                from pybk_spark.spark.reader import BookKeeperBatchReader
                lh = bk.create_ledger(3, 3, 2)
                lh.add_entries(payloads(n_read, size=100))
                lh.close()
                reader = BookKeeperBatchReader(parse_read_options(
                    {"metadataServiceUri": uri, "ledgers": str(lh.ledger_id)}))
                parts = reader.partitions()

                def read_all():
                    n = 0
                    for part in parts:
                        for b in reader.read(part):
                            n += b.num_rows
                    assert n == n_read, n
                with PySpy(pids, work, "spark_read") as spy:
                    t0 = time.perf_counter()
                    text = _pyinstrument(read_all)
                    dt = time.perf_counter() - t0
                sections.append(("spark_read", f"{n_read} x 100 B entries, {len(parts)} partitions, "
                                 f"in {dt:.2f} s ({n_read / dt:,.0f}/s, profiler on)", text,
                                 spy.summary()))
        sections.append(_bookie_ingest(work, quick))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    out = ["# Profiles (bench/profiling.py)", "",
           f"Generated {time.strftime('%Y-%m-%d %H:%M:%S')}, load average {os.getloadavg()}.", ""]
    for name, headline, text, spy in sections:
        out += [f"## {name}: {headline}", "", "pyinstrument (client process):", "", "```",
                text.strip() if text else "(not profiled in-process)", "```", "",
                "bookie-server processes:", "", "```", spy.strip(), "```", ""]
    return "\n".join(out)


def _bookie_ingest(work: str, quick: bool):
    from bench.bookie_ingest import stream_adds
    from pybk_spark.testing.bookie_process import BookieProcess
    bookie = BookieProcess(os.path.join(work, "ingest-bookie"), conf={"flush_interval_s": 2.0})
    bookie.start()
    try:
        stub = bookie.stub()
        stream_adds(stub, 99, 1000, 10)
        n = 60 if quick else 300
        with PySpy([bookie.started().pid], work, "ingest") as spy:
            r = stream_adds(stub, 1, 1000, n)
        return ("bookie_ingest", f"one bookie, {n} batches of 1000 x 1 KiB: "
                f"{r['entries_per_s']:,.0f} entries/s, {r['mb_per_s']:.0f} MB/s (py-spy attached)",
                "", spy.summary())
    finally:
        bookie.terminate()


def main(argv=None) -> None:
    p = argparse.ArgumentParser(prog="python -m bench.profiling")
    p.add_argument("--quick", action="store_true")
    a = p.parse_args(argv)
    text = run(a.quick)
    os.makedirs(os.path.dirname(OUT), exist_ok=True)
    with open(OUT, "w") as fh:
        fh.write(text)
    print(text)


if __name__ == "__main__":
    main()
