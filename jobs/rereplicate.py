"""spark-submit jobs/rereplicate.py --metadata-uri URI [--bookie ID] [--verify]
[--delay SECONDS] [--grace SECONDS] [--password PW] [--json]

Auditor on the driver (lost = unregistered >= --delay seconds, decommissioned,
or named with --bookie); one Spark task per affected fragment copies its
entries from surviving replicas to a replacement bookie with recovery adds,
then CASes the fragment's ensemble.  --verify then checks every entry of
every ledger has its Qw replicas.  Exits non-zero on any failure or any
under-replicated entry.
"""
import argparse
import json
import sys

from pybk_spark import errors
from pybk_spark.admin import orchestrate
from pybk_spark.admin.spark_runner import SparkMapper
from pybk_spark.client import BookKeeper


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="rereplicate.py", description=__doc__.splitlines()[0])
    p.add_argument("--metadata-uri", required=True)
    p.add_argument("--bookie", action="append", default=[], metavar="ID")
    p.add_argument("--verify", action="store_true")
    p.add_argument("--delay", type=float, default=0.0, metavar="SECONDS")
    p.add_argument("--grace", type=float, default=30.0, metavar="SECONDS")
    p.add_argument("--password", default=None)
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)
    mapper = SparkMapper("pybk-rereplicate")
    try:
        with BookKeeper(args.metadata_uri, background=False) as bk:
            report, text, status = orchestrate.run_rereplicate(
                bk, args.metadata_uri, mapper, bookies=args.bookie, delay_s=args.delay,
                grace_s=args.grace, verify=args.verify,
                password=None if args.password is None else args.password.encode())
    except errors.BKError as exc:
        print(f"rereplicate: {type(exc).__name__}: {exc}", file=sys.stderr, flush=True)
        return 2
    finally:
        mapper.stop()
    print(json.dumps(report, sort_keys=True, default=str) if args.json else text, flush=True)
    return status


if __name__ == "__main__":
    sys.exit(main())
