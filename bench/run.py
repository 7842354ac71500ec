"""``make bench`` / ``make bench QUICK=1``: every figure, in one run,
in a fixed order, each beside its peer measured in the same run.

    .venv/bin/python -m bench.run [--quick] [--data-dir DIR] [--no-docs]

Order: (1) disk limits, (2) bookie-only ingest (bench.bookie_ingest, which
measures the disk of figure 1 too; its ratio uses the sustained figure, taken
once the journal's page-cache window is full), the Redis peer (bench.redis_peer,
bench.redis_sweep), then on one LocalCluster (etcd + 3 bookie-server
processes): (3) client append throughput and the batch-size sweep, (4) sync
add latency, (5) catch-up read of the ledger (3) wrote, (6) Spark vs Parquet,
(11) offload to Parquet and a Spark scan of the offloaded history
(bench.offload_bench; numbered after the others, run here, on the cluster),
(7) recovery, (8) re-replication (adds a 4th bookie and kills one, so last);
then, once that cluster is gone, (9) scaling (bench.scaling): batched appends
and reads with 3, 5 and 7 bookies, each on its own test host (network
namespace), with every process's CPU per entry; where namespaces cannot be
made it is recorded as skipped with the reason; then (10) the cost of TLS:
append and catch-up read on a TLS cluster against a plaintext one
(bench.tls_cost).

Figures 3-5 also carry each process kind's CPU per entry (bench/cpu.py),
figure 4 its latency projected to one host per process and, as its CPU peer,
the floor of a replicated sync add written in Python (bench/sync_floor.py,
measured on the cluster right before figure 4: on a shared machine the CPU
per add of both moves with the load of the moment, up to 2x within minutes,
so a ratio of two figures measured minutes apart measures the load), figure 6 a no-op
Python data source timed beside ours (bench/noop_source.py) and, beside the write, a
bare sink that stores every row twice with no protocol (bench/bare_sink.py), figure 8 the
bookie-to-bookie and the client path side by side and, as their floor, the
bare copy between two processes, read from the disk (bench/copy_floor.py, measured right
before and right after figure 8's timed pull, the mean of the two, from a file written
before that figure's ledgers).

Outputs: full mode writes bench/results/latest.{json,md,png} and regenerates
the marked section of docs/performance.md; ``--quick`` (tiny sizes, same code
paths, checks the harness, not the figures) writes bench/results/quick.* and
leaves latest.* and the docs alone.  A figure that fails is recorded under
``errors`` and its ratios are null, with the reason under ``missing``; the
run goes on.
"""
from __future__ import annotations

import argparse
import datetime as dt
import json
import math
import os
import shutil
import sys
import tempfile
import time
import traceback

from bench import report, scaling

HERE = os.path.dirname(os.path.abspath(__file__))
RESULTS = os.path.join(HERE, "results")
DOC = os.path.join(os.path.dirname(HERE), "docs", "performance.md")
RATIO_KEYS = ("append_vs_redis_pipelined_1c", "append_vs_redis_50c", "sync_add_p99_ms",
              "bookie_ingest_vs_disk", "catchup_read_vs_redis_xrange", "spark_write_vs_parquet",
              "spark_read_vs_parquet", "entry_cpu_7_vs_3_bookies", "tls_append_vs_plain",
              "tls_catchup_vs_plain", "sync_add_cpu_ms", "spark_read_vs_python_floor",
              "spark_count_vs_python_floor", "rereplication_vs_disk", "sync_add_cpu_vs_python_floor",
              "spark_write_vs_python_floor", "rereplication_vs_copy_floor", "offload_vs_disk",
              "spark_offloaded_scan_vs_parquet", "spark_read_log_vs_parquet",
              "sync_add_p50_vs_python_floor",
              "sync_add_p999_vs_python_floor", "append_async_vs_redis_pipelined_1c",
              "spark_write_vs_bare_sink")


def _log(msg: str) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')}] {msg}", flush=True)


class Run:
    def __init__(self, quick: bool):
        self.quick = quick
        self.figures: dict = {}
        self.errors: dict = {}
        self.timings: dict = {}

    def step(self, name: str, fn):
        _log(f"{name} ...")
        t0 = time.perf_counter()
        try:
            value = fn()
        except Exception as exc:  # noqa: BLE001 - record, go on with the other figures
            value = None
            self.errors[name] = f"{type(exc).__name__}: {str(exc).strip()[:500]}"
            _log(f"{name} FAILED: {self.errors[name]}")
            traceback.print_exc()
        self.timings[name] = round(time.perf_counter() - t0, 1)
        _log(f"{name} done in {self.timings[name]} s")
        if value is not None:
            self.figures[name] = value
        return value


def _ratio(num, den):
    if num is None or den is None or den == 0:
        return None
    return num / den


def _g(d, *path):
    for p in path:
        if not isinstance(d, dict) or d.get(p) is None:
            return None
        d = d[p]
    return d


def _ms(cpu_s_per_m):
    """CPU-seconds per million entries -> milliseconds per entry."""
    return None if cpu_s_per_m is None else cpu_s_per_m / 1e3


def compute_ratios(f: dict, errors: dict) -> tuple[dict, dict]:
    red = f.get("peers_redis") or {}
    ours_batched = _g(f, "3_append", "batched_E3Qw3Qa2", "entries_per_s")
    spark = f.get("6_spark") or {}
    ratios = {
        "append_vs_redis_pipelined_1c": _ratio(ours_batched, red.get("redis_pipelined_1c_entries_per_s")),
        "append_vs_redis_50c": _ratio(ours_batched, red.get("redis_50c_entries_per_s")),
        "sync_add_p99_ms": _g(f, "4_sync_latency", "p99_ms"),
        # sustained ingest / the disk overwriting allocated blocks (the fresh-file
        # sustained probe moves 78-379 MB/s between probes; its ratio stays
        # in the figure, as does the burst one)
        "bookie_ingest_vs_disk": _g(f, "2_bookie_ingest", "ratio_1000_sustained_vs_disk_overwrite"),
        "catchup_read_vs_redis_xrange": _ratio(_g(f, "5_catchup", "entries_per_s"),
                                               red.get("redis_xrange_entries_per_s")),
        "spark_write_vs_parquet": spark.get("write_ratio"),
        "spark_read_vs_parquet": spark.get("read_scan_ratio"),
        "entry_cpu_7_vs_3_bookies": scaling.cpu_ratio(f.get("9_scaling")),
        "sync_add_cpu_ms": _ms(_g(f, "4_sync_latency", "cpu", "cpu_s_per_m_entries", "total")),
        "spark_read_vs_python_floor": spark.get("read_scan_vs_floor"),
        "spark_write_vs_python_floor": spark.get("write_vs_floor"),
        # ours / a sink that stores the rows twice with no protocol (bench/bare_sink.py)
        "spark_write_vs_bare_sink": spark.get("write_vs_bare_sink"),
        "spark_count_vs_python_floor": spark.get("read_count_vs_floor"),
        # ours / the Python floor's (bench/sync_floor.py): lower is better, 1.0 = the floor
        "sync_add_cpu_vs_python_floor": _ratio(
            _g(f, "4_sync_latency", "cpu", "cpu_s_per_m_entries", "total"),
            _g(f, "4_sync_floor", "cpu_us_per_add", "total")),
        # latency against the floor's own, measured in the same run: lower is better
        "sync_add_p50_vs_python_floor": _ratio(_g(f, "4_sync_latency", "p50_ms"),
                                               _g(f, "4_sync_floor", "p50_ms")),
        "sync_add_p999_vs_python_floor": _ratio(_g(f, "4_sync_latency", "p999_ms"),
                                                _g(f, "4_sync_floor", "p999_ms")),
        "append_async_vs_redis_pipelined_1c": _ratio(
            _g(f, "3_append", "async_E3Qw3Qa2", "entries_per_s"),
            red.get("redis_pipelined_1c_entries_per_s")),
        "rereplication_vs_disk": _ratio(_g(f, "8_rereplication", "copy_mb_per_s"),
                                        _g(f, "2_bookie_ingest", "disk_overwrite_mb_per_s_mean")),
        # ours / the bare copy between two processes at the same concurrency, read from the disk as a
        # pull's source reads (bench/copy_floor.py)
        "rereplication_vs_copy_floor": _ratio(
            _g(f, "8_rereplication", "copy_mb_per_s"),
            _g(f, "8_copy_floor", str(_g(f, "8_rereplication", "parallel")), "mb_per_s")),
    }
    needs = {"append_vs_redis_pipelined_1c": ("3_append", "peers_redis"),
             "append_vs_redis_50c": ("3_append", "peers_redis"),
             "sync_add_p99_ms": ("4_sync_latency",),
             "bookie_ingest_vs_disk": ("2_bookie_ingest",),
             "catchup_read_vs_redis_xrange": ("5_catchup", "peers_redis"),
             "spark_write_vs_parquet": ("6_spark",), "spark_read_vs_parquet": ("6_spark",),
             "entry_cpu_7_vs_3_bookies": ("9_scaling",),
             "sync_add_cpu_ms": ("4_sync_latency",),
             "sync_add_cpu_vs_python_floor": ("4_sync_latency", "4_sync_floor"),
             "sync_add_p50_vs_python_floor": ("4_sync_latency", "4_sync_floor"),
             "sync_add_p999_vs_python_floor": ("4_sync_latency", "4_sync_floor"),
             "append_async_vs_redis_pipelined_1c": ("3_append", "peers_redis"),
             "spark_read_vs_python_floor": ("6_spark",),
             "spark_write_vs_python_floor": ("6_spark",),
             "spark_write_vs_bare_sink": ("6_spark",),
             "spark_count_vs_python_floor": ("6_spark",),
             "rereplication_vs_disk": ("8_rereplication", "2_bookie_ingest"),
             "rereplication_vs_copy_floor": ("8_rereplication", "8_copy_floor")}
    missing = {}
    for key, value in ratios.items():
        if value is not None and isinstance(value, float) and not math.isfinite(value):
            ratios[key] = value = None
        if value is None:
            why = [f"{n}: {errors[n]}" for n in needs[key] if n in errors]
            if key == "spark_write_vs_parquet" and spark and not spark.get("bookkeeper_write_available"):
                why.append("Spark batch writer (df.write.format('bookkeeper')) not available: "
                           f"{spark.get('bookkeeper_write_error')}")
            rr = f.get("8_rereplication") or {}
            if key.startswith("rereplication_vs") and rr.get("available") is False:
                why.append(f"8_rereplication: {rr.get('reason')}")
            sc = f.get("9_scaling") or {}
            if key == "entry_cpu_7_vs_3_bookies" and sc.get("available") is False:
                why.append(f"9_scaling skipped: {sc.get('reason')}")
            missing[key] = "; ".join(why) or "component missing"
    return ratios, missing


# the most a full run holds on disk at once, measured (``du`` of its work
# directory, sampled every second): figure 3's ledgers on three bookies,
# their journals, and the scaling figure's clusters
PEAK_BYTES = {False: 12 << 30, True: 1 << 30}
# bookies turn read-only at this share of their disk (bookie_server/config.py:
# ``disk_usage_threshold``); a run that crosses it loses its later figures
BOOKIE_READ_ONLY_AT = 0.95


def disk_shortfall(path: str, quick: bool) -> str:
    """Why the disk under ``path`` cannot hold a run ("" when it can): the
    run's peak must fit with the disk still below the bookies' read-only
    share."""
    usage = shutil.disk_usage(path)
    need = PEAK_BYTES[quick]
    allowed = int(usage.total * BOOKIE_READ_ONLY_AT) - usage.used
    if need <= allowed:
        return ""
    return (f"{path} has {usage.free / 2**30:.1f} GiB free ({usage.used / usage.total:.0%} used); "
            f"a {'quick' if quick else 'full'} run holds up to {need / 2**30:.0f} GiB and the "
            f"bookies turn read-only at {BOOKIE_READ_ONLY_AT:.0%} of the disk: free space there "
            "or pass --data-dir on a larger disk")


def run(quick: bool, data_dir: str | None) -> dict:
    from bench import (bookie_ingest, catchup, client_append, copy_floor, disk_writers, machine,
                       offload_bench, recovery_bench, redis_peer, redis_sweep, rereplication,
                       sync_floor, tls_cost)
    started = dt.datetime.now().astimezone().isoformat(timespec="seconds")
    t_start = time.perf_counter()
    base = data_dir or tempfile.gettempdir()
    r = Run(quick)
    work = tempfile.mkdtemp(prefix="pybk-bench-", dir=base)
    try:
        desc = machine.describe(work)
        ingest = r.step("2_bookie_ingest", lambda: bookie_ingest.run(quick, work))
        if ingest is not None:
            r.figures["1_disk"] = ingest.pop("disk")
            three = r.step("1_disk_3_writers", lambda: disk_writers.seq_bandwidth_writers(
                work, 3, (32 if quick else 512) << 20))
            r.figures.pop("1_disk_3_writers", None)
            if three is not None:
                r.figures["1_disk"]["seq_3_writers"] = three
        r.step("peers_redis", lambda: redis_peer.measure(quick))
        redis_sw = r.step("sweep_redis", lambda: redis_sweep.measure(quick))
        r.figures.pop("sweep_redis", None)
        _cluster_figures(r, quick, work, redis_sw, client_append, catchup, recovery_bench,
                         rereplication, sync_floor, copy_floor)
        r.step("9_scaling", lambda: scaling.measure(quick, work))
        r.step("10_tls", lambda: tls_cost.measure(quick, work))
    finally:
        import shutil
        shutil.rmtree(work, ignore_errors=True)
    _project_sync(r.figures)
    ratios, missing = compute_ratios(r.figures, r.errors)
    tls_cost.add_ratios(ratios, missing, r.figures, r.errors)
    offload_bench.add_ratios(ratios, missing, r.figures, r.errors)
    return {"mode": "quick" if quick else "full",
            "command": "make bench QUICK=1" if quick else "make bench",
            "started_at": started, "duration_s": time.perf_counter() - t_start,
            "loadavg_at_end": [round(x, 2) for x in os.getloadavg()],
            "machine": desc, "ratios": ratios, "missing": missing,
            "targets": {k: f"{op} {t}" for k, (op, t, _) in report.TARGETS.items()},
            "figures": r.figures, "errors": r.errors, "step_seconds": r.timings}


def _project_sync(f: dict) -> None:
    """Figure 4's latency projected to one host per process (bench/cpu.py)."""
    from bench.cpu import projected_sync_latency
    sync = f.get("4_sync_latency") or {}
    cpu = sync.get("cpu") or {}
    proj = projected_sync_latency(cpu.get("cpu_s_per_m_entries") or {},
                                  (cpu.get("processes") or {}).get("bookies", 0),
                                  _g(f, "1_disk", "fsync_4k", "p50_ms"))
    if proj is not None:
        sync["projected_host_per_bookie"] = proj


def _cluster_figures(r: Run, quick: bool, work: str, redis_sw, client_append, catchup,
                     recovery_bench, rereplication, sync_floor, copy_floor) -> None:
    from pybk_spark.cluster.local import LocalCluster
    catchup_entries = 20_000 if quick else 1_000_000
    from bench.cpu import cluster_pids
    with LocalCluster(os.path.join(work, "cluster"), num_bookies=3) as cluster:
        uri = cluster.metadata_uri
        writer = [None]
        pids = cluster_pids(cluster)      # CPU per entry by process kind (bench/cpu.py)

        def append():
            out, writer[0] = client_append.throughput(uri, quick, catchup_entries, pids)
            return out
        r.step("3_append", append)
        ours_sw = r.step("sweep_ours", lambda: client_append.batch_sweep(uri, quick))
        r.figures.pop("sweep_ours", None)
        r.figures["sweep"] = {"ours": ours_sw, "redis": redis_sw}
        # the floor beside figure 4, the cluster idle: the same moment of the machine
        r.step("4_sync_floor", lambda: sync_floor.measure(200 if quick else 5000))
        r.step("4_sync_latency", lambda: client_append.sync_latency(uri, quick, pids))
        appended = r.figures.get("3_append") or {}
        if "catchup_ledger" in appended:
            r.step("5_catchup", lambda: catchup.measure(uri, appended["catchup_ledger"],
                                                        appended["catchup_ledger_entries"], pids))
        else:
            r.errors["5_catchup"] = "no ledger: figure 3 failed"
        if writer[0] is not None:
            writer[0][0].close()
        r.step("6_spark", lambda: _spark(uri, quick, work, pids))
        from bench import offload_bench
        r.step("11_offload", lambda: offload_bench.measure(uri, quick, work))
        r.step("7_recovery", lambda: recovery_bench.measure(uri, quick))
        # the bare copy right around the pull it is the floor of: the disk's
        # speed here moves by half from one minute to the next
        from pybk_spark.admin.operations.orchestrate import DEFAULT_PARALLEL
        floors: dict = {}
        size = (32 << 20) if quick else (1 << 30)

        def floor(when: str) -> None:
            _log(f"8_copy_floor ({when}) ...")
            try:
                if when == "setup":      # the file it reads, as old as the pull's ledgers
                    floors[when] = copy_floor.stored_file(work, size)
                else:
                    floors[when] = copy_floor.measure(
                        work, size, [DEFAULT_PARALLEL] if when == "before" else None,
                        cached=when == "after", src=floors.get("setup"))
            except Exception as exc:  # noqa: BLE001 - recorded; figure 8 goes on without it
                r.errors["8_copy_floor"] = f"{type(exc).__name__}: {str(exc).strip()[:500]}"
        try:
            r.step("8_rereplication", lambda: rereplication.measure(cluster, quick, floor=floor))
        finally:
            if "setup" in floors:
                os.unlink(floors["setup"])
        if "before" in floors and "after" in floors:
            r.figures["8_copy_floor"] = copy_floor.around(floors["before"], floors["after"],
                                                          DEFAULT_PARALLEL)
        elif "8_copy_floor" not in r.errors:
            r.errors["8_copy_floor"] = "figure 8 ended before its floor ran on both sides of its pull"


def _spark(uri: str, quick: bool, work: str, pids: dict) -> dict:
    from bench import spark_bench
    spark = spark_bench.spark_session()
    try:
        return spark_bench.measure(spark, uri, quick, work, pids)
    finally:
        spark.stop()


def write_outputs(result: dict, quick: bool, docs: bool) -> dict:
    os.makedirs(RESULTS, exist_ok=True)
    stem = "quick" if quick else "latest"
    paths = {k: os.path.join(RESULTS, f"{stem}.{k}") for k in ("json", "md", "png")}
    with open(paths["json"], "w") as fh:
        json.dump(result, fh, indent=1, sort_keys=False, default=str)
        fh.write("\n")
    table = report.markdown(result)
    with open(paths["md"], "w") as fh:
        fh.write(f"# Benchmark ({result['mode']})\n\n{table}\n## Machine\n\n"
                 f"{report.machine_markdown(result['machine'])}")
    try:
        report.plot(result, paths["png"])
    except Exception as exc:  # noqa: BLE001 - a plot failure must not lose the figures
        _log(f"plot failed: {exc}")
    if docs and not quick:
        report.update_docs(result, DOC, "../bench/results/latest.png", table)
    return paths


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.run")
    p.add_argument("--quick", action="store_true", help="tiny sizes: checks the harness")
    p.add_argument("--data-dir", help="where the cluster and probes write (default: $TMPDIR)")
    p.add_argument("--no-docs", action="store_true", help="do not touch docs/performance.md")
    a = p.parse_args(argv)
    short = disk_shortfall(a.data_dir or tempfile.gettempdir(), a.quick)
    if short:
        print(f"bench: {short}", file=sys.stderr)
        return 2
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    result = run(a.quick, a.data_dir)
    paths = write_outputs(result, a.quick, not a.no_docs)
    print(report.markdown(result))
    _log(f"wrote {', '.join(paths.values())}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
