"""spark-submit jobs/offload.py --metadata-uri URI [--log NAME ...]
[--offload-conf FILE] [--location URI] [--keep-segments N] [--min-age-s S]
[--keep-bytes B] [--grace-s S] [--orphan-age-s S] [--password PW] [--json] [--verbose]

Offloads the closed segments of the named logs (default: every log) that
the policy picks (a log's own, `pybk offload LOG --set-policy`, unless a
rule flag is given) to Parquet files at the location, one Spark task per
segment (each stages, verifies and publishes its files); the driver commits
each segment's record by CAS, then deletes the ledgers whose grace period
is over.  Settings as `pybk offload` takes them (conf/offload.conf).
"""
import argparse
import sys

from pybk_spark.admin.jobs.offload_job import run_offload
from pybk_spark.admin.commands.shell_offload import (offload_settings_args, rule_flags_given,
                                                     settings_of)
from pybk_spark.admin.jobs.spark_runner import job_arguments, run_job


def _own_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--log", action="append", default=[], metavar="NAME")
    offload_settings_args(p)


def main(argv=None) -> int:
    args = job_arguments("offload.py", __doc__, _own_options, argv)
    return run_job("offload", "pybk-offload", args.metadata_uri, args.json,
                   lambda bk, mapper: run_offload(bk, args.metadata_uri, mapper,
                                                  settings_of(args), args.log, args.password,
                                                  log_policy_first=not rule_flags_given(args)),
                   verbose=args.verbose, client_conf=args.client_conf)


if __name__ == "__main__":
    sys.exit(main())
