"""spark-submit jobs/recover_ledgers.py --metadata-uri URI [--log NAME]
[--ledger ID]... [--min-idle SECONDS] [--force] [--password PW] [--json] [--verbose]

Fences, recovers and closes every not-closed ledger whose writer is gone
(its etcd lease expired), one Spark task per ledger; prints a summary table
and exits non-zero if any ledger could not be recovered.  Idempotent.
"""
import argparse
import sys

from pybk_spark.admin import orchestrate
from pybk_spark.admin.spark_runner import run_job


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="recover_ledgers.py", description=__doc__.splitlines()[0])
    p.add_argument("--metadata-uri", required=True)
    p.add_argument("--client-conf", default=None,
                   help="client conf file: TLS files and operator = true (conf/client.conf)")
    p.add_argument("--log", help="only the ledgers of this log")
    p.add_argument("--ledger", type=int, action="append", default=None, metavar="ID",
                   help="only this ledger (repeatable)")
    p.add_argument("--min-idle", type=float, default=0.0, metavar="SECONDS")
    p.add_argument("--force", action="store_true", help="ignore writer leases")
    p.add_argument("--password", default=None)
    p.add_argument("--json", action="store_true",
                   help="stdout: exactly one JSON document (progress goes to stderr)")
    p.add_argument("--verbose", action="store_true", help="Spark's INFO log lines too")
    args = p.parse_args(argv)
    password = None if args.password is None else args.password.encode()
    return run_job("recover_ledgers", "pybk-recover-ledgers", args.metadata_uri, args.json,
                   lambda bk, mapper: orchestrate.run_recover(
                       bk, args.metadata_uri, mapper, log=args.log, ledgers=args.ledger,
                       min_idle_s=args.min_idle, force=args.force, password=password),
                   verbose=args.verbose, client_conf=args.client_conf)


if __name__ == "__main__":
    sys.exit(main())
