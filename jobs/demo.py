"""Demo job (spark-submit): write ledgers with the client, read them back with
the client and with ``spark.read.format("bookkeeper")``, compare, report;
then write a log, offload its older segments to Parquet files and read the
whole log back as one DataFrame.

    spark-submit jobs/demo.py --metadata-uri etcd://127.0.0.1:PORT/pybk [--offload-location DIR]

Exit status 0 only if every read matches what was written: per ledger the
entry count, the entry ids 0..n-1, an order-sensitive checksum, and the exact
rows; for the log, the rows read from the Parquet history plus those read
from the bookies are exactly the entries appended, in log order.  ``make
demo`` runs it against a fresh local cluster (pybk_spark.commands.demo),
with the offload location under the cluster's data directory.
"""
from __future__ import annotations

import argparse
import random
import shutil
import sys
import tempfile
import time
import zlib
from typing import TYPE_CHECKING, Iterable

if TYPE_CHECKING:      # types only: the job imports pybk_spark in main()
    from pybk_spark.ledger.port import LedgerClient

SINGLE_ADDS = 100          # the first entries of each ledger go through add_entry
LOG_SEGMENTS = 4           # the demo log's segments: the older two are offloaded
LOG_SEGMENT_ENTRIES = 50


def entry_checksum(entry_id: int, payload: bytes) -> int:
    """crc32 of b"<entry_id>:" + payload; Spark computes the same with SQL."""
    return zlib.crc32(b"%d:" % entry_id + payload)


SPARK_CHECKSUM = "crc32(concat(encode(cast(entry_id as string), 'utf-8'), unhex('3A'), payload))"


def make_payloads(rng: random.Random, ledger_no: int, count: int, size: int) -> list[bytes]:
    out = []
    for entry_id in range(count):
        head = b"ledger %d entry %d|" % (ledger_no, entry_id)
        out.append(head + rng.randbytes(max(0, size - len(head))))
    return out


def write_ledgers(bk: LedgerClient, args: argparse.Namespace,
                  rng: random.Random) -> dict[int, list[bytes]]:
    written: dict[int, list[bytes]] = {}
    for ledger_no in range(args.ledgers):
        payloads = make_payloads(rng, ledger_no, args.entries, args.entry_size)
        lh = bk.create_ledger(ensemble=3, write_quorum=2, ack_quorum=2)
        ids = [lh.add_entry(p) for p in payloads[:SINGLE_ADDS]]
        for lo in range(SINGLE_ADDS, len(payloads), args.batch):
            ids.extend(lh.add_entries(payloads[lo:lo + args.batch]))
        lh.close()
        if ids != list(range(len(payloads))):
            raise SystemExit(f"ledger {lh.ledger_id}: add returned ids {ids[:5]}..., expected 0..{len(payloads) - 1}")
        written[lh.ledger_id] = payloads
    return written


def summarize(rows_by_ledger: dict[int, list[tuple[int, bytes]]]) -> dict[int, tuple[int, int]]:
    return {lid: (len(rows), sum(entry_checksum(e, p) for e, p in rows))
            for lid, rows in rows_by_ledger.items()}


def read_with_client(bk: LedgerClient,
                     ledger_ids: Iterable[int]) -> dict[int, list[tuple[int, bytes]]]:
    out = {}
    for lid in ledger_ids:
        rh = bk.open_ledger(lid, recovery=False)
        last = bk.get_ledger_metadata(lid).last_entry_id
        rows: list[tuple[int, bytes]] = []
        for lo in range(0, last + 1, 500):
            rows.extend((e.entry_id, e.payload) for e in rh.read(lo, min(last, lo + 499)))
        rh.close()
        out[lid] = rows
    return out


def offload_and_read_log(spark, bk: LedgerClient, metadata_uri: str, location: str,
                         report: list[str], problems: list[str]) -> None:
    """A log of ``LOG_SEGMENTS`` closed segments; its older segments offloaded
    to Parquet files at ``location`` and their ledgers deleted; the whole log
    read back with ``pybk_spark.spark.history.read_log`` (the files through
    Spark's Parquet reader, the rest through the ``bookkeeper`` source)."""
    from pybk_spark.logs import offload
    from pybk_spark.logs.log import read_log as read_log_metadata
    from pybk_spark.logs.log_writer import LogWriter, RollPolicy
    from pybk_spark.protocol.offload import OffloadPolicy
    from pybk_spark.spark.history import read_log

    name = f"demo-log-{random.SystemRandom().getrandbits(32):08x}"
    payloads = [b"%s entry %d" % (name.encode(), i)
                for i in range(LOG_SEGMENTS * LOG_SEGMENT_ENTRIES)]
    t0 = time.perf_counter()
    with LogWriter(bk, name, roll_policy=RollPolicy(max_entries=LOG_SEGMENT_ENTRIES)).open() as w:
        for lo in range(0, len(payloads), LOG_SEGMENT_ENTRIES):
            w.append_batch(payloads[lo:lo + LOG_SEGMENT_ENTRIES])
    # grace_s=0: the offloaded ledgers leave the bookies now, so the history
    # can only come from the files
    done = offload.offload_log(bk, name, location, OffloadPolicy(grace_s=0))
    md = read_log_metadata(bk.metadata_store, name)[0]
    t_offload = time.perf_counter() - t0
    offloaded_rows = sum(s.offload.rows for s in md.segments if s.offload is not None)
    report.append(f"log     {name}: appended {len(payloads)} entries in {len(md.segments)} "
                  f"segments; offloaded {len(done.offloaded)} closed segments "
                  f"({offloaded_rows} entries, {done.bytes} B of Parquet) to {location} and "
                  f"deleted their {len(done.ledgers_deleted)} ledgers, in {t_offload:.2f} s")
    if not done.offloaded or done.ledgers_deleted != done.offloaded:
        problems.append(f"log {name}: offloaded {done.offloaded}, deleted {done.ledgers_deleted}")

    t0 = time.perf_counter()
    frame = read_log(spark, name, metadata_uri)
    history_ids = {s.ledger_id for s in md.segments if s.offload is not None}
    table = frame.toArrow()          # one query: the counts below are of its rows
    order = {lid: i for i, lid in enumerate(md.ledger_ids)}
    rows = sorted(zip(table.column("ledger_id").to_pylist(), table.column("entry_id").to_pylist(),
                      table.column("payload").to_pylist()),
                  key=lambda r: (order.get(r[0], -1), r[1]))
    from_files = sum(1 for lid, _, _ in rows if lid in history_ids)
    from_bookies = len(rows) - from_files
    same = [p for _, _, p in rows] == payloads
    report.append(f"log     read_log: {from_files} rows from Parquet + {from_bookies} rows from "
                  f"bookies = {from_files + from_bookies} (appended {len(payloads)}); in log "
                  f"order {'identical' if same else 'DIFFERENT'}, in "
                  f"{time.perf_counter() - t0:.2f} s")
    if (from_files, from_files + from_bookies) != (offloaded_rows, len(payloads)) or not same:
        problems.append(f"log {name}: read_log gave {from_files} + {from_bookies} rows, "
                        f"expected {offloaded_rows} + {len(payloads) - offloaded_rows}"
                        + ("" if same else ", and other rows"))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--metadata-uri", required=True)
    ap.add_argument("--ledgers", type=int, default=3)
    ap.add_argument("--entries", type=int, default=1000)
    ap.add_argument("--entry-size", type=int, default=100)
    ap.add_argument("--batch", type=int, default=100, help="entries per add_entries call")
    ap.add_argument("--max-entries-per-partition", type=int, default=400)
    ap.add_argument("--seed", type=int, default=None)
    ap.add_argument("--placement-policy", default="random",
                    help="the writing client's placement_policy: random or rack-aware "
                         "(conf/client.conf)")
    ap.add_argument("--offload-location", metavar="DIR",
                    help="where the demo log's offloaded segments go (default: a temporary "
                         "directory, deleted at the end)")
    ap.add_argument("--verbose", action="store_true", help="Spark's INFO log lines too")
    args = ap.parse_args(argv)
    seed = args.seed if args.seed is not None else random.SystemRandom().randrange(2**32)
    rng = random.Random(seed)
    problems: list[str] = []
    head = (f"demo seed={seed} metadataServiceUri={args.metadata_uri} "
            f"placement_policy={args.placement_policy}")
    report: list[str] = [head]

    from pyspark.sql import functions as F

    from pybk_spark import BookKeeper
    from pybk_spark.admin.jobs.spark_runner import job_session
    spark = job_session("pybk-demo", args.verbose)
    bk = BookKeeper(args.metadata_uri, conf={"placement_policy": args.placement_policy})
    try:
        t0 = time.perf_counter()
        written = write_ledgers(bk, args, rng)
        t_write = time.perf_counter() - t0
        total = sum(len(v) for v in written.values())
        ids = sorted(written)
        expected = summarize({lid: list(enumerate(p)) for lid, p in written.items()})
        report.append(f"wrote   {len(ids)} ledgers x {args.entries} entries of {args.entry_size} B "
                      f"(E=3 Qw=2 Qa=2; first {SINGLE_ADDS} per ledger by add_entry, rest by "
                      f"add_entries({args.batch})): {total} entries in {t_write:.2f} s "
                      f"({total / t_write:,.0f} entries/s); ledgers {ids}")

        t0 = time.perf_counter()
        by_client = read_with_client(bk, ids)
        t_client = time.perf_counter() - t0
        report.append(f"client  read {sum(len(v) for v in by_client.values())} entries "
                      f"in {t_client:.2f} s")
        for lid in ids:
            if by_client[lid] != list(enumerate(written[lid])):
                problems.append(f"client read of ledger {lid} differs from what was written")

        t0 = time.perf_counter()
        df = (spark.read.format("bookkeeper")
              .option("metadataServiceUri", args.metadata_uri)
              .option("ledgers", ",".join(map(str, ids)))
              .option("maxEntriesPerPartition", str(args.max_entries_per_partition))
              .load())
        partitions = df.rdd.getNumPartitions()
        t_plan = time.perf_counter() - t0
        t0 = time.perf_counter()
        n_rows = df.count()
        t_count = time.perf_counter() - t0
        t0 = time.perf_counter()
        agg = (df.groupBy("ledger_id")
               .agg(F.count("*").alias("n"), F.sum(F.expr(SPARK_CHECKSUM)).alias("checksum"))
               .collect())
        t_spark = time.perf_counter() - t0
        by_spark = {r["ledger_id"]: (r["n"], r["checksum"]) for r in agg}
        fragments = sum(len(bk.get_ledger_metadata(lid).fragments()) for lid in ids)
        report.append(f"spark   planned {partitions} partitions for {fragments} fragments (sliced at "
                      f"{args.max_entries_per_partition} entries) in {t_plan:.2f} s; "
                      f"count() = {n_rows} in {t_count:.2f} s (first query: starts Python workers)")
        report.append(f"spark   per-ledger count + checksum (groupBy) in {t_spark:.2f} s")
        if n_rows != total:
            problems.append(f"spark count() returned {n_rows}, expected {total}")
        for lid in ids:
            report.append(f"  ledger {lid}: written {expected[lid]}  spark {by_spark.get(lid)}  "
                          "(count, checksum)")
            if by_spark.get(lid) != expected[lid]:
                problems.append(f"spark count/checksum of ledger {lid} differs")

        t0 = time.perf_counter()
        table = df.toArrow().sort_by([("ledger_id", "ascending"), ("entry_id", "ascending")])
        rows = list(zip(table.column("ledger_id").to_pylist(), table.column("entry_id").to_pylist(),
                        table.column("payload").to_pylist()))
        want = [(lid, e, p) for lid in ids for e, p in enumerate(written[lid])]
        report.append(f"spark   exact row comparison ({len(rows)} rows) in {time.perf_counter() - t0:.2f} s: "
                      f"{'identical' if rows == want else 'DIFFERENT'}")
        if rows != want:
            problems.append("spark rows differ from what was written")

        lid = ids[0]
        sliced = (spark.read.format("bookkeeper").option("metadataServiceUri", args.metadata_uri)
                  .option("ledgers", str(lid))
                  .option("startingOffsets", f'{{"{lid}": 10}}')
                  .option("endingOffsets", f'{{"{lid}": 20}}').load())
        got = sorted(r["entry_id"] for r in sliced.select("entry_id").collect())
        report.append(f"spark   offsets {{{lid}: 10}}..{{{lid}: 20}} -> entries {got[:1]}..{got[-1:]} "
                      f"({len(got)} rows)")
        if got != list(range(10, 20)):
            problems.append(f"offset read of ledger {lid} returned {got}")

        location = args.offload_location or tempfile.mkdtemp(prefix="pybk-demo-offload-")
        try:
            offload_and_read_log(spark, bk, args.metadata_uri, location, report, problems)
        finally:
            if not args.offload_location:
                shutil.rmtree(location, ignore_errors=True)
    finally:
        bk.close()
        spark.stop()

    report.append("RESULT: " + ("OK, every read matches what was written" if not problems
                                else "MISMATCH: " + "; ".join(problems)))
    print("\n".join(report), flush=True)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
