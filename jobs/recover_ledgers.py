"""spark-submit jobs/recover_ledgers.py --metadata-uri URI [--log NAME]
[--ledger ID]... [--min-idle SECONDS] [--force] [--password PW] [--json] [--verbose]

Fences, recovers and closes every not-closed ledger whose writer is gone
(its etcd lease expired), one Spark task per ledger; prints a summary table
and exits non-zero if any ledger could not be recovered.  Idempotent.
"""
import argparse
import sys
from typing import Optional, Sequence

from pybk_spark.admin.operations import orchestrate
from pybk_spark.admin.jobs.spark_runner import job_arguments, run_job


def _own_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--log", help="only the ledgers of this log")
    p.add_argument("--ledger", type=int, action="append", default=None, metavar="ID",
                   help="only this ledger (repeatable)")
    p.add_argument("--min-idle", type=float, default=0.0, metavar="SECONDS")
    p.add_argument("--force", action="store_true", help="ignore writer leases")


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = job_arguments("recover_ledgers.py", __doc__, _own_options, argv)
    return run_job("recover_ledgers", "pybk-recover-ledgers", args.metadata_uri, args.json,
                   lambda bk, mapper: orchestrate.run_recover(
                       bk, args.metadata_uri, mapper, log=args.log, ledgers=args.ledger,
                       min_idle_s=args.min_idle, force=args.force, password=args.password),
                   verbose=args.verbose, client_conf=args.client_conf)


if __name__ == "__main__":
    sys.exit(main())
