"""(11) Tiered storage: offload throughput, and a Spark scan of offloaded
history beside Spark's own Parquet reader on the same files.

* offload: a raw log of 1 KiB entries in segments of ``SEGMENT`` entries
  (then two one-entry segments, which the policy keeps on the bookies) is
  offloaded whole (logs/offload.py: each ledger read from the bookies,
  written as Parquet to the bench disk, read back, every entry's digest
  checked, committed by CAS); MB/s of payload, beside the disk's sequential
  write (figure 2's overwrite probe): ``offload_vs_disk``.
* scan: once the offloaded ledgers are deleted, the log read by the
  ``bookkeeper`` source (each offloaded segment from its files, checked
  against its record) against ``spark.read.parquet`` of the same files, a
  full scan each (sum of payload lengths and entry ids), alternating:
  ``spark_offloaded_scan_vs_parquet`` = Parquet's time / ours; and
  ``pybk_spark.spark.history.read_log`` (the history through Spark's own
  Parquet reader, the two newest segments through the source) against the
  same Parquet scan: ``spark_read_log_vs_parquet``.
* half offloaded: before the second half is offloaded, the log with its
  older half in Parquet and its newer half on the bookies, scanned whole by
  ``read_log`` and by the ``bookkeeper`` source (figure row only; its peer
  is Parquet's scan of all the rows, timed later).

The offload runs in two steps (the older half, then the rest); its MB/s is
both steps' entries over both steps' seconds.
"""
from __future__ import annotations

import os
import time

PAYLOAD = 1024
SEGMENT = 10_000


def _write_log(bk, name: str, entries: int) -> None:
    from pybk_spark.logs.log_writer import LogWriter, RollPolicy
    body = PAYLOAD - 8           # random bytes: Parquet cannot compress them away
    with LogWriter(bk, name, roll_policy=RollPolicy(max_entries=SEGMENT)).open() as w:
        for first in range(0, entries, 1000):
            ids = range(first, min(entries, first + 1000))
            blob = os.urandom(len(ids) * body)
            w.append_batch([b"%08d" % i + blob[k * body:(k + 1) * body]
                            for k, i in enumerate(ids)])
        for tail in (b"tail-1", b"tail-2"):          # the newest two stay on the bookies
            w.roll()
            w.append_batch([tail])


def measure(uri: str, quick: bool, work: str) -> dict:
    from bench import spark_bench
    from pybk_spark import BookKeeper
    from pybk_spark.logs import offload
    from pybk_spark.logs.log import read_log
    from pybk_spark.protocol.offload import OffloadPolicy
    from pybk_spark.spark.history import file_uris, read_log as spark_read_log
    entries = 20_000 if quick else 300_000
    segments = entries // SEGMENT
    name = f"bench-offload-{int(time.time())}"
    location = os.path.join(work, "offload")
    spark = spark_bench.spark_session()
    try:
        from pyspark.sql import functions as F

        def scan(df) -> int:
            row = df.agg(F.sum(F.length("payload")), F.sum("entry_id"), F.count("*")).collect()[0]
            return int(row[2])

        def check(got: int, want: int, what: str) -> None:
            if got != want:
                raise RuntimeError(f"{what} saw {got} entries, want {want}")

        def ours() -> None:
            check(scan(spark.read.format("bookkeeper").option("metadataServiceUri", uri)
                       .option("log", name).load()), entries + 2, "the bookkeeper source")

        def history() -> None:
            check(scan(spark_read_log(spark, name, uri)), entries + 2, "read_log")

        with BookKeeper(uri) as bk:
            _write_log(bk, name, entries)
            t0 = time.perf_counter()
            older = offload.offload_log(bk, name, location, OffloadPolicy(
                keep_segments=segments - segments // 2 + 2, grace_s=0, orphan_age_s=0))
            seconds = time.perf_counter() - t0
            out: dict = {"half_offloaded": dict(zip(("read_log", "bookkeeper_source"),
                                                    spark_bench._timed_group(
                                                        (history, ours), 1, 1 if quick else 3)))}
            t0 = time.perf_counter()
            rest = offload.offload_log(bk, name, location,
                                       OffloadPolicy(grace_s=0, orphan_age_s=0))
            seconds += time.perf_counter() - t0
            md = read_log(bk.metadata_store, name)[0]
        rows = older.rows + rest.rows
        if rows != entries:
            raise RuntimeError(f"offloaded {rows} entries, want {entries}")
        out.update({"entries": entries, "payload_bytes": PAYLOAD, "segment_entries": SEGMENT,
                    "half_offloaded_entries": older.rows,
                    "segments": len(older.offloaded) + len(rest.offloaded), "seconds": seconds,
                    "entries_per_s": entries / seconds,
                    "mb_per_s": entries * PAYLOAD / seconds / 1e6,
                    "file_bytes": older.bytes + rest.bytes,
                    "ledgers_deleted": len(older.ledgers_deleted) + len(rest.ledgers_deleted)})
        paths = file_uris(md)

        def parquet() -> None:
            check(scan(spark.read.parquet(*paths)), entries, "the Parquet scan")
        out["parquet_scan"], out["offloaded_scan"], out["read_log_scan"] = \
            spark_bench._timed_group((parquet, ours, history), 1, 1 if quick else 3)
    finally:
        spark.stop()
    parquet_s = out["parquet_scan"]["median_s"]
    out["scan_vs_parquet"] = parquet_s / out["offloaded_scan"]["median_s"]
    out["read_log_vs_parquet"] = parquet_s / out["read_log_scan"]["median_s"]
    return out


def add_ratios(ratios: dict, missing: dict, figures: dict, errors: dict) -> None:
    """Put the offload ratios (or why they are missing) into the run's JSON."""
    f = figures.get("11_offload") or {}
    disk = (figures.get("2_bookie_ingest") or {}).get("disk_overwrite_mb_per_s_mean")
    ratios["offload_vs_disk"] = f["mb_per_s"] / disk if f.get("mb_per_s") and disk else None
    ratios["spark_offloaded_scan_vs_parquet"] = f.get("scan_vs_parquet")
    ratios["spark_read_log_vs_parquet"] = f.get("read_log_vs_parquet")
    for key, needs in (("offload_vs_disk", ("11_offload", "2_bookie_ingest")),
                       ("spark_offloaded_scan_vs_parquet", ("11_offload",)),
                       ("spark_read_log_vs_parquet", ("11_offload",))):
        if ratios[key] is None:
            missing[key] = "; ".join(f"{n}: {errors[n]}" for n in needs if n in errors) \
                or "component missing"
