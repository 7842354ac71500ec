"""The first Spark query of a session: a no-op Python data source against
``format("bookkeeper")``, each in a fresh process.

    python bench/first_query.py [--rows 3000] [--repeat 1] [--json]

Starts the cluster ``make demo`` starts (``LocalCluster``: an embedded etcd
and 3 ``bookie-server`` processes), writes the demo job's data (3 ledgers of
``rows / 3`` entries of 100 B, E=3 Qw=2 Qa=2), then runs two fresh Python
processes, each with its own SparkSession (``local[2]``):

(a) ``spark.read.format("first_query_noop")``: a no-op Python data source
    defined here, ``rows`` rows of ``id long, payload binary`` (100 B) made in
    the read task;
(b) ``spark.read.format("bookkeeper").option("ledgers", ...)``: the demo's
    ledgers, read as the demo job reads them.

Each process times its session start and its first query (``load()`` and
``count()``); the ratio (b) / (a) of the first query is what our source adds
to what any Python data source costs on its first query (Python workers
started, the source's modules imported, planning).
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

PROJECT_ROOT = Path(__file__).resolve().parents[1]
NOOP = "first_query_noop"
PAYLOAD_BYTES = 100
ENTRIES_PER_PARTITION = 400             # the demo job's maxEntriesPerPartition


def noop_source():
    """The no-op source, built in the child so that it pickles by value."""
    import pyarrow as pa
    from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition

    class Part(InputPartition):
        def __init__(self, first: int, rows: int):
            super().__init__(first)
            self.first, self.rows = first, rows

    class Reader(DataSourceReader):
        def __init__(self, rows: int):
            self.rows = rows

        def partitions(self):
            per = ENTRIES_PER_PARTITION
            return [Part(a, min(per, self.rows - a)) for a in range(0, self.rows, per)]

        def read(self, partition):
            ids = list(range(partition.first, partition.first + partition.rows))
            yield pa.RecordBatch.from_arrays(
                [pa.array(ids, pa.int64()), pa.array([b"x" * PAYLOAD_BYTES] * len(ids))],
                ["id", "payload"])

    class Noop(DataSource):
        @classmethod
        def name(cls) -> str:
            return NOOP

        def schema(self) -> str:
            return "id long, payload binary"

        def reader(self, schema):
            return Reader(int(self.options.get("rows", 0)))

    return Noop


def child(kind: str, rows: int, uri: str, ledgers: str) -> dict:
    """One fresh process: session start, then the first query."""
    t0 = time.perf_counter()
    from pyspark.sql import SparkSession
    spark = (SparkSession.builder.master("local[2]").appName(f"first-query-{kind}")
             .config("spark.ui.enabled", "false").config("spark.log.level", "ERROR")
             .getOrCreate())
    session_s = time.perf_counter() - t0
    if kind == "noop":
        spark.dataSource.register(noop_source())
    t1 = time.perf_counter()
    if kind == "noop":
        df = spark.read.format(NOOP).option("rows", str(rows)).load()
    else:
        df = (spark.read.format("bookkeeper").option("metadataServiceUri", uri)
              .option("ledgers", ledgers)
              .option("maxEntriesPerPartition", str(ENTRIES_PER_PARTITION)).load())
    count = df.count()
    query_s = time.perf_counter() - t1
    spark.stop()
    if count != rows:
        raise SystemExit(f"{kind}: counted {count} rows, expected {rows}")
    return {"kind": kind, "session_s": session_s, "first_query_s": query_s, "rows": count}


def write_demo_ledgers(uri: str, rows: int) -> str:
    """The demo job's shape: 3 ledgers, 100 B entries, E=3 Qw=2 Qa=2."""
    from pybk_spark import BookKeeper
    bk = BookKeeper(uri)
    ids = []
    try:
        for n in range(3):
            lh = bk.create_ledger(ensemble=3, write_quorum=2, ack_quorum=2)
            count = rows // 3 + (1 if n < rows % 3 else 0)
            lh.add_entries([bytes([65 + n]) * PAYLOAD_BYTES for _ in range(count)])
            lh.close()
            ids.append(lh.ledger_id)
    finally:
        bk.close()
    return ",".join(map(str, ids))


def run_child(kind: str, rows: int, uri: str, ledgers: str) -> dict:
    env = dict(os.environ, PYSPARK_PYTHON=sys.executable, PYSPARK_DRIVER_PYTHON=sys.executable,
               SPARK_LOCAL_IP=os.environ.get("SPARK_LOCAL_IP", "127.0.0.1"))
    out = subprocess.run([sys.executable, __file__, "--child", kind, "--rows", str(rows),
                          "--uri", uri, "--ledgers", ledgers],
                         env=env, capture_output=True, text=True, check=False)
    if out.returncode != 0:
        raise SystemExit(f"{kind} process failed (exit {out.returncode}):\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=3000)
    ap.add_argument("--repeat", type=int, default=1, help="fresh-process pairs to run")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--child", choices=("noop", "bookkeeper"), help=argparse.SUPPRESS)
    ap.add_argument("--uri", default="", help=argparse.SUPPRESS)
    ap.add_argument("--ledgers", default="", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        print(json.dumps(child(args.child, args.rows, args.uri, args.ledgers)))
        return 0

    sys.path.insert(0, str(PROJECT_ROOT))
    from pybk_spark.cluster.local import LocalCluster
    results = []
    with tempfile.TemporaryDirectory(prefix="pybk-first-query-") as data_dir:
        with LocalCluster(data_dir, num_bookies=3) as cluster:
            ledgers = write_demo_ledgers(cluster.metadata_uri, args.rows)
            for _ in range(args.repeat):
                pair = {kind: run_child(kind, args.rows, cluster.metadata_uri, ledgers)
                        for kind in ("noop", "bookkeeper")}
                pair["ratio"] = (pair["bookkeeper"]["first_query_s"]
                                 / pair["noop"]["first_query_s"])
                results.append(pair)
    if args.json:
        print(json.dumps(results, indent=2))
        return 0
    for pair in results:
        noop, ours = pair["noop"], pair["bookkeeper"]
        print(f"first query of {args.rows} rows, fresh local[2] session each "
              f"(session start: no-op {noop['session_s']:.1f} s, bookkeeper "
              f"{ours['session_s']:.1f} s)")
        print(f"  (a) no-op Python data source: {noop['first_query_s']:.2f} s")
        print(f"  (b) format(\"bookkeeper\"):     {ours['first_query_s']:.2f} s")
        print(f"  ratio (b)/(a): {pair['ratio']:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
