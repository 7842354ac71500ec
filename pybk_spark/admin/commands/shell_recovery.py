"""``pybk recover | rereplicate | decommission | listunderreplicated``."""
from __future__ import annotations

import argparse
import json
import signal
import threading
import time
from typing import Optional

from prometheus_client import start_http_server

from pybk_spark import errors
from pybk_spark.admin.decisions import audit
from pybk_spark.admin.operations import damage_repair
from pybk_spark.admin.operations import retire
from pybk_spark.admin.commands import shell_common
from pybk_spark.admin.operations import orchestrate as orch
from pybk_spark.admin.operations import rereplicate as rr
from pybk_spark.admin.operations.autorecovery import AutoRecovery, AutoRecoveryConfig
from pybk_spark.admin.report import table
from pybk_spark.ledger.client import BookKeeper
from pybk_spark.ledger.port import LedgerClient
from pybk_spark.logs.offload_conf import load_offload_conf
from pybk_spark.metadata import keys
from pybk_spark.metadata.store import MetadataStore
from pybk_spark.protocol import ledger_metadata as lm


def password_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument("--password", default=None,
                   help="ledger password (default: the ledger's custom metadata "
                        "'password', else empty)")


def parallel_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument("--parallel", type=_at_least_one, default=orch.DEFAULT_PARALLEL, metavar="N",
                   help="work items (ledgers to recover, fragments to copy) at once "
                        f"(default {orch.DEFAULT_PARALLEL})")


def _at_least_one(text: str) -> int:
    try:
        n = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a whole number >= 1, not {text!r}") from None
    if n < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, not {n}")
    return n


def password_of(args: argparse.Namespace) -> bytes | None:
    return None if args.password is None else args.password.encode()


def client(args: argparse.Namespace) -> BookKeeper:
    return BookKeeper(shell_common.require_metadata_uri(args), conf=shell_common.client_conf(args),
                      background=False)


def _progress(args: argparse.Namespace) -> bool:
    return not getattr(args, "json", False)


# -- recover -----------------------------------------------------------------------------------
def _recover_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--log", help="only the ledgers of this log")
    p.add_argument("--ledger", type=int, action="append", default=None, metavar="ID",
                   help="only this ledger (repeatable)")
    p.add_argument("--min-idle", type=float, default=0.0, metavar="SECONDS",
                   help="skip ledgers created less than SECONDS ago")
    p.add_argument("--force", action="store_true", help="ignore the writer lease (fences a "
                   "live writer's ledger)")
    password_arg(p)
    parallel_arg(p)


def _recover(args: argparse.Namespace) -> int:
    with client(args) as bk:
        report, text, status = orch.run_recover(
            bk, args.metadata_uri, orch.local_mapper(_progress(args), args.parallel),
            log=args.log,
            ledgers=args.ledger, min_idle_s=args.min_idle, force=args.force, password=password_of(args))
    shell_common.emit(args, report, text)
    return status


# -- rereplicate ---------------------------------------------------------------------------------
def _lost_bookie_timing_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--delay", type=float, default=0.0, metavar="SECONDS",
                   help="lostBookieRecoveryDelay: a bookie unregistered this long is lost")
    p.add_argument("--grace", type=float, default=30.0, metavar="SECONDS",
                   help="openLedgerRereplicationGracePeriod before fencing a live writer's "
                        "ledger whose last fragment has a lost bookie")


def rereplicate_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--bookie", action="append", default=[], metavar="ID",
                   help="treat this bookie as lost (repeatable)")
    p.add_argument("--verify", action="store_true",
                   help="afterwards check that every entry has its Qw replicas, and copy "
                        "each one short of them (this writes to bookies)")
    _lost_bookie_timing_args(p)
    password_arg(p)
    parallel_arg(p)


def _rereplicate(args: argparse.Namespace) -> int:
    with client(args) as bk:
        report, text, status = orch.run_rereplicate(
            bk, args.metadata_uri, orch.local_mapper(_progress(args), args.parallel),
            bookies=args.bookie,
            delay_s=args.delay, grace_s=args.grace, verify=args.verify,
            password=password_of(args))
    shell_common.emit(args, report, text)
    return status


# -- decommission -----------------------------------------------------------------------------
def _decommission_args(p: argparse.ArgumentParser) -> None:
    g = p.add_mutually_exclusive_group(required=True)
    g.add_argument("bookie_id", nargs="?", metavar="BOOKIE_ID", help="bookie to decommission")
    g.add_argument("--bookie", metavar="ID", help="the same, as an option")
    p.add_argument("--grace", type=float, default=30.0, metavar="SECONDS",
                   help="grace before fencing open ledgers that still write to it")
    p.add_argument("--no-copy", action="store_true",
                   help="copy nothing: retire the id if its data is already safe, else "
                        "refuse, naming the ledgers still on it")
    p.add_argument("--cancel", action="store_true",
                   help="withdraw the decommission mark (moves nothing back)")
    password_arg(p)
    parallel_arg(p)


def _known_ids(store: MetadataStore) -> set[str]:
    """Ids any record names: registrations, cookies, the auditor's marks,
    instances records and damage markers (what a retire removes)."""
    out = set(rr.registered_bookies(store))
    for prefix in (keys.COOKIES_PREFIX, audit.MISSING_PREFIX, audit.DECOMMISSIONED_PREFIX,
                   keys.INSTANCES_PREFIX, keys.DAMAGED_PREFIX):
        out |= {keys.last_part(k) for k, _ in store.list_prefix(prefix)}
    return out


def _decommission(args: argparse.Namespace) -> int:
    bookie = args.bookie_id or args.bookie
    with client(args) as bk:
        store = bk.metadata_store
        if bookie not in _known_ids(store):
            raise errors.IncorrectParameter(f"unknown bookie {bookie!r} (no registration, no "
                                            "cookie, no audit record)")
        if args.cancel:
            rr.clear_decommissioned(store, bookie)
            shell_common.emit(args, {"bookie": bookie, "decommissioned": False},
                              f"{bookie} is no longer marked decommissioned")
            return 0
        if args.no_copy:
            deleted = retire.retire(bk, bookie)        # IllegalOp while its data is not safe
            shell_common.emit(args, {"bookie": bookie, "retired": True, "deleted": deleted},
                              _retired_text(bookie, deleted))
            return 0
        rr.mark_decommissioned(store, bookie, time.time())
        report, text, status = orch.run_rereplicate(
            bk, args.metadata_uri, orch.local_mapper(_progress(args), args.parallel),
            bookies=[bookie],
            grace_s=args.grace, password=password_of(args))
        remaining = retire.holding_ledgers(
            [md for md in (_metadata_of(bk, lid) for lid in bk.list_ledgers()) if md], bookie)
        registered = bookie in rr.registered_bookies(store)
        report.update(remaining_ledgers=remaining, retired=False, deleted=[])
        if remaining:
            text += (f"\n{bookie} still holds fragments of ledgers "
                     f"{retire.ledgers_text(remaining)} (still being written, or copies "
                     "failed); run decommission again later")
            status = status or 1
        elif registered:
            text += (f"\n{bookie} holds no fragment any more: safe to stop it; then run "
                     f"pybk decommission {bookie} --no-copy to retire the id")
        else:
            report["deleted"] = retire.retire(bk, bookie)
            report["retired"] = True
            text += "\n" + _retired_text(bookie, report["deleted"])
    shell_common.emit(args, report, text)
    return status


def _retired_text(bookie: str, deleted: list[str]) -> str:
    return (f"{bookie} retired: no ledger holds entries on it; removed "
            f"{', '.join(deleted) or 'nothing (no record left)'}")


def _metadata_of(bk: LedgerClient, lid: int) -> Optional[lm.LedgerMetadata]:
    try:
        return bk.get_ledger_metadata(lid)
    except errors.NoSuchLedger:
        return None


# -- listunderreplicated ------------------------------------------------------------------------
def _lur_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--delay", type=float, default=0.0, metavar="SECONDS",
                   help="count a bookie as lost only after this long unregistered")


def _listunderreplicated(args: argparse.Namespace) -> int:
    with client(args) as bk:
        # read-only: no marks written; with --delay 0 every unregistered known bookie counts
        named = _unregistered(bk) if args.delay <= 0 else []
        res = rr.run_audit(bk, delay_s=args.delay, grace_s=float("inf"), mark=False,
                           plan=False, named=named)
        markers = damage_repair.read_markers(bk.metadata_store)
        holding = _ledgers_holding(bk, {b for b, _v, _r, unattributed in markers if unattributed})
    rows = [{"ledger": w.ledger_id, "fragment": f"{w.first}-{w.last}", "bookie": w.lost,
             "state": "complete"} for w in res.work]
    rows += [{"ledger": d["ledger"], "fragment": "last (open)", "bookie": "",
              "state": "being written"} for d in res.deferred]
    rows += [{"ledger": lid, "fragment": "last (open)", "bookie": "",
              "state": "writer gone"} for lid in res.fence]
    for bookie, _v, ranges, unattributed in markers:
        rows += [{"ledger": lid, "fragment": f"entries {first}-{'end' if last < 0 else last}",
                  "bookie": bookie, "state": "damaged"} for lid, first, last in ranges]
        if unattributed:      # its data was lost (formatted, damage it could not name)
            in_ranges = {lid for lid, _f, _l in ranges}
            rows += [{"ledger": lid, "fragment": "any", "bookie": bookie,
                      "state": "damaged (unattributed)"}
                     for lid in holding.get(bookie, []) if lid not in in_ranges]
    data = {"lost": sorted(res.lost), "under_replicated": rows}
    text = (f"lost/unregistered bookies: {', '.join(sorted(res.lost)) or '(none)'}\n"
            + table(rows, ["ledger", "fragment", "bookie", "state"],
                    empty="no under-replicated fragments"))
    shell_common.emit(args, data, text)
    return 0


def _ledgers_holding(bk: LedgerClient, bookies: set[str]) -> dict[str, list[int]]:
    """bookie -> ids of the ledgers with it in an ensemble (only ``bookies``)."""
    out: dict[str, list[int]] = {b: [] for b in bookies}
    if not bookies:
        return out
    for lid in bk.list_ledgers():
        try:
            named = bk.get_ledger_metadata(lid).all_bookies()
        except errors.NoSuchLedger:
            continue
        for b in bookies & named:
            out[b].append(lid)
    return out


def _unregistered(bk: LedgerClient) -> list[str]:
    store = bk.metadata_store
    reg = rr.registered_bookies(store)
    known = audit.known_bookies([k.rsplit("/", 1)[1] for k, _ in store.list_prefix(keys.COOKIES_PREFIX)],
                                [bk.get_ledger_metadata(l) for l in bk.list_ledgers()])
    return sorted(known - reg)


shell_common.register("recover", "fence, recover and close ledgers whose writer is gone",
                      _recover_args, _recover,
                      writes="fences each ledger on its bookies, re-adds its last entries to "
                             "a write quorum and closes it in its metadata (CAS)")
shell_common.register("rereplicate", "re-replicate fragments of lost bookies (auditor + copy)",
                      rereplicate_arguments, _rereplicate,
                      writes="the first-seen times of missing bookies (audit/missing/), entry "
                             "copies on replacement bookies, each copied fragment's new ensemble "
                             "in its ledger's metadata (CAS); after --grace it fences and closes "
                             "an open ledger whose last fragment has a lost bookie; --verify also "
                             "writes: it copies every entry it finds short of its Qw replicas")
shell_common.register("decommission", "move every fragment off a bookie, then, once it is "
                      "stopped and no ledger holds entries on it, retire its id (refused, naming "
                      "the ledgers, while its data is not safe)", _decommission_args,
                      _decommission,
                      writes="the bookie's decommission mark (audit/decommissioned/), then as "
                             "rereplicate: entry copies on other bookies and the ledgers' new "
                             "ensembles (CAS); retiring deletes (CAS) the id's cookie, "
                             "bookies/instances/ record, damage marker and audit/missing/ and "
                             "audit/decommissioned/ marks; --no-copy only retires; --cancel "
                             "only removes the mark")
shell_common.register("listunderreplicated", "fragments with a replica on a lost bookie, and "
                      "entries bookies lost to damage",
                      _lur_args, _listunderreplicated, writes=None)


# -- autorecovery ------------------------------------------------------------------------------
def _autorecovery_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--interval", type=float, default=60.0, metavar="SECONDS",
                   help="time between audit rounds (default 60)")
    _lost_bookie_timing_args(p)
    p.add_argument("--recover-abandoned", action="store_true",
                   help="also recover and close OPEN ledgers whose writer lease is gone")
    p.add_argument("--recover-idle", type=float, default=300.0, metavar="SECONDS",
                   help="with --recover-abandoned: only ledgers created this long ago")
    p.add_argument("--verify-every", type=int, default=0, metavar="N",
                   help="every Nth round also check every ledger's replicas and fill in "
                        "missing copies (default 0: never)")
    p.add_argument("--leader-ttl", type=int, default=15, metavar="SECONDS",
                   help="lease TTL of the leadership key audit/leader")
    p.add_argument("--rounds", type=int, default=None, metavar="N",
                   help="stop after N rounds (default: until SIGTERM / Ctrl-C)")
    p.add_argument("--offload-conf", metavar="FILE",
                   help="offload settings (conf/offload.conf): each round also applies the "
                        "offload policy to every log (default: no offload)")
    p.add_argument("--metrics-port", type=int, default=None, metavar="PORT",
                   help="serve the daemon's Prometheus metrics (offload) on this port")
    password_arg(p)
    parallel_arg(p)


def _autorecovery(args: argparse.Namespace) -> int:

    stop = threading.Event()
    previous = {sig: signal.signal(sig, lambda *_: stop.set())
                for sig in (signal.SIGTERM, signal.SIGINT)}
    conf = AutoRecoveryConfig(interval_s=args.interval, lost_bookie_delay_s=args.delay,
                              grace_s=args.grace, leader_ttl_s=args.leader_ttl,
                              recover_abandoned=args.recover_abandoned,
                              recover_idle_s=args.recover_idle, verify_every=args.verify_every,
                              password=password_of(args), parallel=args.parallel,
                              offload=(load_offload_conf(args.offload_conf)
                                       if args.offload_conf else None))
    worst = [0]

    def emit(row: dict) -> None:
        worst[0] = max(worst[0], row.get("status", 0))
        stamp = time.strftime("%Y-%m-%dT%H:%M:%S")
        if getattr(args, "json", False):
            print(json.dumps({"time": stamp, **row}), flush=True)
        elif row.get("leadership") == "unknown":
            print(f"{stamp} leadership unknown: etcd did not answer ({row.get('error')}); "
                  f"not leading this round", flush=True)
        elif not row.get("leader"):
            print(f"{stamp} standby: another autorecovery process is the leader", flush=True)
        elif row.get("disabled"):
            print(f"{stamp} disabled: no audit (pybk autorecoveryctl --enable)", flush=True)
        elif "error" in row:
            print(f"{stamp} round failed: {row['error']}", flush=True)
        else:
            print(f"{stamp} lost={','.join(row['lost']) or '-'} "
                  f"copied={row['fragments_copied']} failed={row['fragments_failed']}"
                  + _reasons(row.get("failed_by_reason"))
                  + f" fenced={row['open_ledgers_fenced']} deferred={row['deferred']}"
                  + (f" recovered={row['recovered']}" if "recovered" in row else "")
                  + (f" under_replicated={row['under_replicated']}"
                     if "under_replicated" in row else "")
                  + (f" damaged_repaired={row['damaged_repaired']}"
                     f" ({row.get('damaged_entries_copied', 0)} entries)"
                     if row.get("damaged_repaired") else "")
                  + (f" retention_dropped={row['retention_dropped_ledgers']}"
                     if row.get("retention_dropped_ledgers") else "")
                  + (f" retention_failed={row['retention_failed']}"
                     if row.get("retention_failed") else "")
                  + (f" offloaded={row['offload_segments']} ({row['offload_bytes']} bytes)"
                     f" offload_deleted={row['offload_ledgers_deleted']}"
                     f" offload_failed={row['offload_failed']}"
                     if "offload_segments" in row else "")
                  + f" ({row['seconds']}s)"
                  + (f"; not repaired: {rr.failed_ledgers_text(row['failed_ledgers'])}"
                     if row.get("failed_ledgers") else ""), flush=True)

    try:
        with client(args) as bk:
            auto = AutoRecovery(bk, args.metadata_uri, conf)
            if args.metrics_port is not None:
                start_http_server(args.metrics_port, registry=auto.offload_metrics.registry)
            auto.run_forever(stop.wait, emit, rounds=args.rounds)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    return worst[0] if args.rounds is not None else 0


shell_common.register("autorecovery", "periodic auditor + re-replication daemon (leader-elected)",
                      _autorecovery_args, _autorecovery,
                      writes="the leadership key audit/leader (under a lease); each round, as "
                             "rereplicate (and with --verify-every as its --verify), with "
                             "--recover-abandoned as recover; logs' expired segments (retention) "
                             "and their ledgers are deleted; with --offload-conf, logs' segments "
                             "are offloaded and their ledgers deleted after the grace period")


def _reasons(by_reason: dict | None) -> str:
    """`` (NotEnoughBookies=2,ReadError=1)`` after a round's failed count."""
    if not by_reason:
        return ""
    return " (" + ",".join(f"{k}={v}" for k, v in by_reason.items()) + ")"
