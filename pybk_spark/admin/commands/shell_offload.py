"""The tiered-storage command ``pybk offload LOG`` / ``pybk offload --status``
/ ``pybk offload LOG --set-policy`` (logs/offload.py)."""
from __future__ import annotations

import argparse
from typing import Optional

from pybk_spark import errors
from pybk_spark.admin.commands import shell_common
from pybk_spark.admin.report import table
from pybk_spark.admin.commands.shell_recovery import client, password_arg, password_of
from pybk_spark.logs.log import list_logs
from pybk_spark.logs.offload import offload_log, offload_status, set_offload_policy
from pybk_spark.logs.offload_conf import OffloadSettings, load_offload_conf
from pybk_spark.protocol.offload import policy_dict


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


RULE_FLAGS = ("keep_segments", "min_age_s", "keep_bytes")


def rule_flags_given(args: argparse.Namespace) -> bool:
    """Whether a rule flag was given: the run then applies the flags' rules
    even to a log that records its own policy."""
    return any(getattr(args, k) is not None for k in RULE_FLAGS)


def settings_of(args: argparse.Namespace) -> OffloadSettings:
    return load_offload_conf(args.offload_conf, location=args.location,
                             keep_segments=args.keep_segments, min_age_s=args.min_age_s,
                             keep_bytes=args.keep_bytes, grace_s=args.grace_s,
                             orphan_age_s=args.orphan_age_s)


def _offload_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("name", metavar="LOG", nargs="?",
                   help="the log to offload (with --status: the log to show; default all)")
    p.add_argument("--status", action="store_true",
                   help="show what is offloaded and each log's own policy (reads only) "
                        "instead of offloading")
    p.add_argument("--set-policy", dest="set_policy", action="store_true",
                   help="record the rules given (--keep-segments, --min-age-s, --keep-bytes; "
                        "the others as the log records them) as the log's own offload policy, "
                        "by CAS, instead of offloading: every run applies it to this log "
                        "instead of the conf's rules")
    p.add_argument("--clear-policy", dest="clear_policy", action="store_true",
                   help="remove the log's own policy (runs apply the conf's rules again)")
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
    shown = [dict(r, policy=policy_text(r["policy"])) for r in rows]
    text = table(shown, ["log", "policy", "segments", "offloaded", "ledgers_deleted",
                         "on_bookies", "offloaded_rows", "offloaded_bytes"], empty="(no logs)")
    shell_common.emit(args, rows, text)
    return 0


def policy_text(policy: Optional[dict]) -> str:
    """A log's own policy for a table cell; ``conf`` when it has none."""
    if policy is None:
        return "conf"
    return " ".join(f"{k}={policy[k]}" for k in RULE_FLAGS)


def _set_policy(args: argparse.Namespace) -> int:
    if args.set_policy and args.clear_policy:
        raise errors.IncorrectParameter("pybk offload: --set-policy or --clear-policy, not both")
    if not args.name:
        raise errors.IncorrectParameter("pybk offload: name the LOG whose policy to set")
    if args.set_policy and not rule_flags_given(args):
        raise errors.IncorrectParameter("pybk offload --set-policy: give at least one of "
                                        "--keep-segments, --min-age-s, --keep-bytes")
    with client(args) as bk:
        policy = set_offload_policy(bk, args.name, keep_segments=args.keep_segments,
                                    min_age_s=args.min_age_s, keep_bytes=args.keep_bytes,
                                    clear=args.clear_policy)
    data = {"log": args.name, "policy": None if policy is None else policy_dict(policy)}
    shell_common.emit(args, data, f"log {args.name}: offload policy "
                                  f"{policy_text(data['policy'])}")
    return 0


def _offload(args: argparse.Namespace) -> int:
    if args.status:
        return _status(args)
    if args.set_policy or args.clear_policy:
        return _set_policy(args)
    if not args.name:
        raise errors.IncorrectParameter("pybk offload: name the LOG to offload, or pass --status")
    settings = settings_of(args)
    with client(args) as bk:
        report = offload_log(bk, args.name, settings.location, settings.policy(),
                             password=password_of(args) or b"",
                             row_group_bytes=settings.row_group_bytes,
                             log_policy_first=not rule_flags_given(args))
    data = report.to_dict()
    rules = "the log's own policy" if report.policy == "log" else "the conf's rules"
    text = (f"log {report.log}: offloaded {len(report.offloaded)} segments "
            f"({report.rows} rows, {report.bytes} bytes) to {report.location}; "
            f"deleted {len(report.ledgers_deleted)} ledgers from the bookies; "
            f"removed {len(report.orphans_removed)} orphan files; by {rules}")
    shell_common.emit(args, data, text)
    return 0


shell_common.register(
    "offload", "offload a log's closed segments to Parquet files (or show what is "
    "offloaded, --status; or record the log's own policy, --set-policy)", _offload_args, _offload,
    writes="Parquet files at the offload location and each offloaded segment's record in "
           "the log's metadata (by CAS); after the grace period it deletes offloaded "
           "ledgers from the bookies, and it removes orphan files left by a stopped run "
           "(with --status it only reads; --set-policy / --clear-policy change only the "
           "log's offload.* properties, by CAS)")
