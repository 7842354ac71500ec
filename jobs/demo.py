"""Demo job (spark-submit): write ledgers with the client, read them back with
the client and with ``spark.read.format("bookkeeper")``, compare, report.

    spark-submit jobs/demo.py --metadata-uri etcd://127.0.0.1:PORT/pybk

Exit status 0 only if every read matches what was written: per ledger the
entry count, the entry ids 0..n-1, an order-sensitive checksum, and the exact
rows.  ``make demo`` runs it against a fresh local cluster (pybk_spark.commands.demo).
"""
from __future__ import annotations

import argparse
import random
import sys
import time
import zlib
from typing import TYPE_CHECKING, Iterable

if TYPE_CHECKING:      # types only: the job imports pybk_spark in main()
    from pybk_spark.ledger.port import LedgerClient

SINGLE_ADDS = 100          # the first entries of each ledger go through add_entry


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
    finally:
        bk.close()
        spark.stop()

    report.append("RESULT: " + ("OK, every read matches what was written" if not problems
                                else "MISMATCH: " + "; ".join(problems)))
    print("\n".join(report), flush=True)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
