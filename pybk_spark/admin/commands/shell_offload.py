"""The tiered-storage command ``pybk offload LOG`` / ``pybk offload --status``
(logs/offload.py)."""
from __future__ import annotations

import argparse

from pybk_spark import errors
from pybk_spark.admin.commands import shell_common
from pybk_spark.admin.report import table
from pybk_spark.admin.commands.shell_recovery import client, password_arg, password_of
from pybk_spark.logs.log import list_logs
from pybk_spark.logs.offload import offload_log, offload_status
from pybk_spark.logs.offload_conf import OffloadSettings, load_offload_conf


def offload_settings_args(p: argparse.ArgumentParser) -> None:
    """The settings flags ``pybk offload`` and ``jobs/offload.py`` share."""
    p.add_argument("--offload-conf", metavar="FILE",
                   help="offload settings file (conf/offload.conf); the flags below "
                        "override it")
    p.add_argument("--location", metavar="URI",
                   help="where the files go: a local path or a pyarrow.fs URI "
                        "(s3://bucket/prefix, gs://..., hdfs://...; default: offload)")
    p.add_argument("--keep-segments", dest="keep_segments", type=int, metavar="N",
                   help="newest segments always kept on bookies (default 2, at least 2)")
    p.add_argument("--min-age-s", dest="min_age_s", type=float, metavar="S",
                   help="offload segments whose last entry is at least S seconds old")
    p.add_argument("--keep-bytes", dest="keep_bytes", type=int, metavar="B",
                   help="or those beyond the newest B bytes of the log")
    p.add_argument("--grace-s", dest="grace_s", type=float, metavar="S",
                   help="seconds between a segment's commit and its ledger's deletion "
                        "(default 3600)")
    p.add_argument("--orphan-age-s", dest="orphan_age_s", type=float, metavar="S",
                   help="remove uncommitted files older than S seconds (default 600)")


def settings_of(args: argparse.Namespace) -> OffloadSettings:
    return load_offload_conf(args.offload_conf, location=args.location,
                             keep_segments=args.keep_segments, min_age_s=args.min_age_s,
                             keep_bytes=args.keep_bytes, grace_s=args.grace_s,
                             orphan_age_s=args.orphan_age_s)


def _offload_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("name", metavar="LOG", nargs="?",
                   help="the log to offload (with --status: the log to show; default all)")
    p.add_argument("--status", action="store_true",
                   help="show what is offloaded (reads only) instead of offloading")
    offload_settings_args(p)
    password_arg(p)


def _status(args: argparse.Namespace) -> int:
    with client(args) as bk:
        names = [args.name] if args.name else list_logs(bk.metadata_store)
        rows = []
        for name in names:
            try:
                rows.append(offload_status(bk, name))
            except errors.LogNotFound:
                if args.name:
                    raise
    text = table(rows, ["log", "segments", "offloaded", "ledgers_deleted", "on_bookies",
                        "offloaded_rows", "offloaded_bytes"], empty="(no logs)")
    shell_common.emit(args, rows, text)
    return 0


def _offload(args: argparse.Namespace) -> int:
    if args.status:
        return _status(args)
    if not args.name:
        raise errors.IncorrectParameter("pybk offload: name the LOG to offload, or pass --status")
    settings = settings_of(args)
    with client(args) as bk:
        report = offload_log(bk, args.name, settings.location, settings.policy(),
                             password=password_of(args) or b"",
                             row_group_bytes=settings.row_group_bytes)
    data = report.to_dict()
    text = (f"log {report.log}: offloaded {len(report.offloaded)} segments "
            f"({report.rows} rows, {report.bytes} bytes) to {report.location}; "
            f"deleted {len(report.ledgers_deleted)} ledgers from the bookies; "
            f"removed {len(report.orphans_removed)} orphan files")
    shell_common.emit(args, data, text)
    return 0


shell_common.register(
    "offload", "offload a log's closed segments to Parquet files (or show what is "
    "offloaded, --status)", _offload_args, _offload,
    writes="Parquet files at the offload location and each offloaded segment's record in "
           "the log's metadata (by CAS); after the grace period it deletes offloaded "
           "ledgers from the bookies, and it removes orphan files left by a stopped run "
           "(with --status it only reads)")
