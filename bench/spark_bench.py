"""Figure 6: Spark write and read through the ``bookkeeper`` source vs Parquet.

One DataFrame of ``rows`` rows (``id long, payload binary``, 100 B random
payloads: incompressible), built from Arrow on the driver, cached and counted
before any clock starts; both sinks get exactly that DataFrame.

* write: ``df.write.parquet(tmp)`` vs ``df.write.format("bookkeeper")
  .option("log", name)``; if the bookkeeper writer is not available the figure
  is null with the reason, and the ledgers for the read figure are written
  with the client (``add_entries``, E=3 Qw=3 Qa=2, closed) instead.
* read: ``count()`` and a full scan touching every column
  (``sum(length(payload))`` plus ``sum`` of every integer column).  Parquet's
  count is answered from file footers, so the read ratio uses the full scan.
  A no-op Python data source (bench/noop_source.py: the same rows handed
  over from memory) is timed in the same rounds: the floor of any Python
  source, so ``read_scan_vs_floor`` / ``read_count_vs_floor`` say how much
  of the gap to Parquet is ours.
* the write is timed beside two Python sinks of the same rows: the no-op
  sink (bench/noop_source.py, what any Python sink costs before it stores
  anything) and the bare replicated sink (bench/bare_sink.py: every row sent
  to two receiver processes that CRC it and write it durably, with no
  protocol), so ``write_vs_floor`` / ``write_vs_bare_sink`` say how far ours
  is from each, and ``bare_write_vs_floor`` how close storing the rows twice
  can come to the no-op sink on this machine.  ``store_floor`` is the least
  CPU that storing the write's bytes twice costs here (bench/bare_sink.py),
  and ``write_bound_vs_floor`` the most any sink that does so can reach of
  the no-op sink's speed when it shares the no-op sink's cores.

The first write and the first read of the session through the ``bookkeeper``
source (Spark starting the Python workers a Python data source runs in) are
reported separately as ``bookkeeper_cold_*`` and left out of the figures.
After that, each pair of queries (Parquet, ours) gets ``warmups`` untimed
rounds and then ``reps`` timed rounds, the two sides alternating within each
round, so both reach the same JIT warm-up and share the machine's drift; the
median is the figure.  Why: the JVM's C2 compiler is still
busy for the first 5-10 queries of a Spark session (0.6 CPU-s per scan at first,
under 0.2 later), and a scan's time falls by a quarter over them.  Quick mode:
no warm-up, one round.
"""
from __future__ import annotations

import os
import shutil
import statistics
import tempfile
import time

import numpy as np
import pyarrow as pa

from bench.cpu import machine_busy_s, proc_cpu_s

PAYLOAD_BYTES = 100


def spark_session():
    os.environ.setdefault("PYSPARK_PYTHON", _venv_python())
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", _venv_python())
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    from pyspark.sql import SparkSession
    spark = (SparkSession.builder.master("local[2]").appName("pybk-bench")
             .config("spark.ui.enabled", "false")
             .config("spark.ui.showConsoleProgress", "false")
             .config("spark.driver.memory", "4g")
             .config("spark.sql.shuffle.partitions", "2")
             .config("spark.driver.host", "127.0.0.1")
             .config("spark.driver.bindAddress", "127.0.0.1")
             .config("spark.python.worker.reuse", "true")
             .config("spark.sql.execution.arrow.pyspark.enabled", "true")
             .getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    return spark


def _venv_python() -> str:
    import sys
    return sys.executable


def random_table(rows: int, seed: int = 8) -> pa.Table:
    rng = np.random.default_rng(seed)
    blob = rng.bytes(rows * PAYLOAD_BYTES)
    offsets = pa.array(np.arange(0, (rows + 1) * PAYLOAD_BYTES, PAYLOAD_BYTES, dtype=np.int32))
    payload = pa.BinaryArray.from_buffers(pa.binary(), rows, [None, offsets.buffers()[1],
                                                              pa.py_buffer(blob)])
    return pa.table({"id": pa.array(np.arange(rows, dtype=np.int64)), "payload": payload})


def _timed(fn, reps: int) -> dict:
    samples = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - t0)
    return {"median_s": statistics.median(samples), "samples_s": samples}


def _timed_group(fns, warmups: int, reps: int, pids: dict | None = None) -> list[dict]:
    """``warmups`` untimed rounds, then ``reps`` timed rounds of every side in
    the given order, alternating: all sides see the same JIT warm-up and the
    same drift.  With ``pids`` (the cluster's process kind -> pids), each
    side also gets the median CPU-seconds of a round: the whole machine's
    (``machine``) and the cluster's (``cluster``: bookies and etcd), so a
    gap between two sides splits into what the cluster spent and the rest."""
    for _ in range(warmups):
        for fn in fns:
            fn()
    samples: list[list[float]] = [[] for _ in fns]
    cpu: list[list[tuple[float, float]]] = [[] for _ in fns]
    cluster = [p for kind in (pids or {}).values() for p in kind]
    for _ in range(reps):
        for fn, got, used in zip(fns, samples, cpu):
            m0, c0 = machine_busy_s(), sum(map(proc_cpu_s, cluster))
            t0 = time.perf_counter()
            fn()
            got.append(time.perf_counter() - t0)
            used.append((machine_busy_s() - m0, sum(map(proc_cpu_s, cluster)) - c0))
    out = [{"median_s": statistics.median(s), "samples_s": s} for s in samples]
    if pids is not None:
        for side, used in zip(out, cpu):
            side["cpu_s"] = {"machine": statistics.median(m for m, _ in used),
                             "cluster": statistics.median(c for _, c in used)}
    return out


def _scan(df, int_cols):
    from pyspark.sql import functions as F
    aggs = [F.sum(F.length("payload")).alias("payload_bytes")] + [F.sum(c) for c in int_cols]
    return df.agg(*aggs).collect()[0]


def _bk_reader(spark, uri: str, ledgers: list[int] | None, log: str | None):
    r = spark.read.format("bookkeeper").option("metadataServiceUri", uri)
    if log:
        return r.option("log", log).load()
    assert ledgers is not None, "a read names a log or its ledgers"
    return r.option("ledgers", ",".join(map(str, ledgers))).load()


def _write_ledgers_with_client(uri: str, table: pa.Table) -> list[int]:
    from pybk_spark.ledger.client import BookKeeper
    payloads = table.column("payload").to_pylist()
    with BookKeeper(uri) as bk:
        lh = bk.create_ledger(3, 3, 2)     # Qw < E stripes entries: see docs/performance.md
        lh.add_entries(payloads)
        lh.close()
        return [lh.ledger_id]


def measure(spark, uri: str, quick: bool, work_dir: str, pids: dict | None = None) -> dict:
    """``pids`` (bench/cpu.py ``cluster_pids``): the writes also carry CPU-s
    per round, the machine's and the cluster's (``_timed_group``)."""
    rows = 20_000 if quick else 1_000_000
    # median of 7: single Spark queries here vary by 1.5-2x, and with 5 rounds
    # the read verdicts flipped between runs (0.83-0.96, docs/performance.md)
    reps = 1 if quick else 7
    warmups = 0 if quick else 3  # the JIT settles over the first 5-10 queries (docstring)
    out: dict = {"rows": rows, "payload_bytes": PAYLOAD_BYTES, "reps": reps, "warmups": warmups}
    table = random_table(rows)
    df = spark.createDataFrame(table).repartition(2).cache()
    if df.count() != rows:
        raise RuntimeError("DataFrame row count mismatch")
    expected_bytes = rows * PAYLOAD_BYTES

    # -- write ----------------------------------------------------------------------------
    pq_dir = tempfile.mkdtemp(prefix="parquet-", dir=work_dir)
    counter = iter(range(1_000_000))

    def write_parquet():
        df.write.mode("overwrite").parquet(os.path.join(pq_dir, "t"))

    log_name = None
    names: list[str] = []

    from bench import bare_sink, noop_source
    noop_source.register(spark)
    bare_sink.register(spark)
    receivers = bare_sink.Receivers(work_dir)

    def write_noop():          # the floor of a Python sink (bench/noop_source.py)
        df.write.format(noop_source.NAME).mode("append").save()

    def write_bare():          # the floor of a sink that stores its rows twice (bench/bare_sink.py)
        df.write.format(bare_sink.NAME).option("ports", ",".join(map(str, receivers.ports))) \
            .mode("append").save()

    def write_bk():
        name = f"bench-log-{os.getpid()}-{next(counter)}"
        df.write.format("bookkeeper").option("metadataServiceUri", uri) \
            .option("log", name).mode("append").save()
        names.append(name)
    try:
        t0 = time.perf_counter()
        write_bk()
        out["bookkeeper_cold_write_s"] = time.perf_counter() - t0
        with receivers:
            # the receivers count with the stores: each side's "cluster" CPU is
            # what its stores spent (the other side's sit idle)
            stores = {**(pids or {}), "bare_receivers": [p.pid for p in receivers.procs]}
            (out["parquet_write"], out["noop_write"], out["bare_write"],
             out["bookkeeper_write"]) = _timed_group(
                (write_parquet, write_noop, write_bare, write_bk), warmups, reps,
                stores if pids is not None else None)
            out["store_floor"] = bare_sink.store_floor(receivers, table.nbytes, warmups,
                                                       max(reps, 1), machine_busy_s)
        log_name = names[-1]
        out["bookkeeper_write_available"] = True
    except Exception as exc:   # noqa: BLE001 - any Spark failure is recorded in the figure
        out["bookkeeper_write"] = None
        out["bookkeeper_write_available"] = False
        out["bookkeeper_write_error"] = _first_line(exc)
    if "parquet_write" not in out:
        out["parquet_write"] = _timed(write_parquet, reps)
    ledgers = None
    if log_name is None:
        t0 = time.perf_counter()
        ledgers = _write_ledgers_with_client(uri, table)
        out["read_data_written_by"] = "client add_entries (E=3 Qw=3 Qa=2), Spark writer unavailable"
        out["client_fill_s"] = time.perf_counter() - t0
    else:
        out["read_data_written_by"] = "spark bookkeeper writer"

    # -- read -----------------------------------------------------------------------------
    pq = spark.read.parquet(os.path.join(pq_dir, "t"))
    bk_df = lambda: _bk_reader(spark, uri, ledgers, log_name)   # noqa: E731
    t0 = time.perf_counter()
    n_cold = bk_df().count()
    out["bookkeeper_cold_count_s"] = time.perf_counter() - t0
    if n_cold != rows:
        raise RuntimeError(f"bookkeeper source counted {n_cold} rows, expected {rows}")
    # the floor of a Python data source, measured beside ours (bench/noop_source.py)
    noop = lambda: spark.read.format(noop_source.NAME).option("rows", rows).load()  # noqa: E731
    if noop().count() != rows:          # cold: workers start and build their batches
        raise RuntimeError("no-op source row count mismatch")
    out["parquet_count"], out["noop_count"], out["bookkeeper_count"] = _timed_group(
        (lambda: pq.count(), lambda: noop().count(), lambda: bk_df().count()), warmups, reps)

    def scan_check(frame, cols):
        got = _scan(frame, cols)
        if got["payload_bytes"] != expected_bytes:
            raise RuntimeError(f"scan saw {got['payload_bytes']} payload bytes, want {expected_bytes}")
    # a log written from the DataFrame reads back as its own columns (id, payload);
    # raw ledgers read back as ledger_id, entry_id, payload
    bk_int_cols = ["id"] if log_name is not None else ["ledger_id", "entry_id"]
    out["parquet_scan"], out["noop_scan"], out["bookkeeper_scan"] = _timed_group(
        (lambda: scan_check(pq, ["id"]), lambda: scan_check(noop(), ["id"]),
         lambda: scan_check(bk_df(), bk_int_cols)), warmups, reps)
    out["partitions"] = bk_df().rdd.getNumPartitions()

    def ratio(peer, ours):
        return None if out.get(ours) is None else out[peer]["median_s"] / out[ours]["median_s"]
    out["write_ratio"] = ratio("parquet_write", "bookkeeper_write")
    out["read_scan_ratio"] = ratio("parquet_scan", "bookkeeper_scan")
    out["read_count_ratio"] = ratio("parquet_count", "bookkeeper_count")
    out["read_scan_vs_floor"] = ratio("noop_scan", "bookkeeper_scan")
    out["read_count_vs_floor"] = ratio("noop_count", "bookkeeper_count")
    out["floor_scan_vs_parquet"] = ratio("parquet_scan", "noop_scan")
    out["write_vs_floor"] = ratio("noop_write", "bookkeeper_write") if "noop_write" in out else None
    out["floor_write_vs_parquet"] = (ratio("parquet_write", "noop_write")
                                     if "noop_write" in out else None)
    out["write_vs_bare_sink"] = ratio("bare_write", "bookkeeper_write") if "bare_write" in out else None
    out["bare_write_vs_floor"] = ratio("noop_write", "bare_write") if "bare_write" in out else None
    noop_cpu = (out.get("noop_write") or {}).get("cpu_s", {}).get("machine")
    if noop_cpu is not None and "store_floor" in out:
        out["cores"] = len(os.sched_getaffinity(0))
        out["write_bound_vs_floor"] = bare_sink.write_bound(
            out["noop_write"]["median_s"], noop_cpu, out["store_floor"]["cpu_s"], out["cores"])
    df.unpersist()
    shutil.rmtree(pq_dir, ignore_errors=True)
    return out


def _first_line(exc: BaseException) -> str:
    """The most telling line of a (possibly Python-traceback-carrying) error."""
    lines = [ln.strip() for ln in f"{type(exc).__name__}: {exc}".splitlines() if ln.strip()]
    errs = [ln for ln in lines if ("Error" in ln or "Exception" in ln) and not ln.startswith("File ")]
    picked = errs[-1] if errs else (lines[0] if lines else repr(exc))
    return picked[:300]
