"""spark-submit jobs/recover_ledgers.py --metadata-uri URI [--log NAME]
[--ledger ID]... [--min-idle SECONDS] [--force] [--password PW] [--json]

Fences, recovers and closes every not-closed ledger whose writer is gone
(its etcd lease expired), one Spark task per ledger; prints a summary table
and exits non-zero if any ledger could not be recovered.  Idempotent.
"""
import argparse
import json
import sys

from pybk_spark import errors
from pybk_spark.admin import orchestrate
from pybk_spark.admin.spark_runner import SparkMapper
from pybk_spark.client import BookKeeper


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="recover_ledgers.py", description=__doc__.splitlines()[0])
    p.add_argument("--metadata-uri", required=True)
    p.add_argument("--log", help="only the ledgers of this log")
    p.add_argument("--ledger", type=int, action="append", default=None, metavar="ID",
                   help="only this ledger (repeatable)")
    p.add_argument("--min-idle", type=float, default=0.0, metavar="SECONDS")
    p.add_argument("--force", action="store_true", help="ignore writer leases")
    p.add_argument("--password", default=None)
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)
    mapper = SparkMapper("pybk-recover-ledgers")
    try:
        with BookKeeper(args.metadata_uri, background=False) as bk:
            report, text, status = orchestrate.run_recover(
                bk, args.metadata_uri, mapper, log=args.log, ledgers=args.ledger,
                min_idle_s=args.min_idle,
                force=args.force,
                password=None if args.password is None else args.password.encode())
    except errors.BKError as exc:
        print(f"recover_ledgers: {type(exc).__name__}: {exc}", file=sys.stderr, flush=True)
        return 2
    finally:
        mapper.stop()
    print(json.dumps(report, sort_keys=True, default=str) if args.json else text, flush=True)
    return status


if __name__ == "__main__":
    sys.exit(main())
