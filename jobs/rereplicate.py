"""spark-submit jobs/rereplicate.py --metadata-uri URI [--bookie ID] [--verify]
[--delay SECONDS] [--grace SECONDS] [--password PW] [--json] [--verbose]

Auditor on the driver (lost = unregistered >= --delay seconds, decommissioned,
or named with --bookie); one Spark task per affected fragment copies its
entries from surviving replicas to a replacement bookie with recovery adds,
then CASes the fragment's ensemble.  --verify then checks every entry of
every ledger has its Qw replicas.  Exits non-zero on any failure or any
under-replicated entry.
"""
import argparse
import sys
from typing import Optional, Sequence

from pybk_spark.admin.operations import orchestrate
from pybk_spark.admin.jobs.spark_runner import job_arguments, run_job


def _own_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--bookie", action="append", default=[], metavar="ID")
    p.add_argument("--verify", action="store_true")
    p.add_argument("--delay", type=float, default=0.0, metavar="SECONDS")
    p.add_argument("--grace", type=float, default=30.0, metavar="SECONDS")


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = job_arguments("rereplicate.py", __doc__, _own_options, argv)
    return run_job("rereplicate", "pybk-rereplicate", args.metadata_uri, args.json,
                   lambda bk, mapper: orchestrate.run_rereplicate(
                       bk, args.metadata_uri, mapper, bookies=args.bookie, delay_s=args.delay,
                       grace_s=args.grace, verify=args.verify, password=args.password),
                   verbose=args.verbose, client_conf=args.client_conf)


if __name__ == "__main__":
    sys.exit(main())
