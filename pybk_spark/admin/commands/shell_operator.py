"""``pybk triggeraudit | lostbookierecoverydelay | autorecoveryctl | deletelog |
truncatelog | logretention | bookiesanity | updatecookie``: the operator commands of
BookKeeper's shell that act on the autorecovery switches (metadata/audit_control.py),
on logs, or on one bookie."""
from __future__ import annotations

import argparse
import os
import socket
import time

from typing import Iterable, Mapping

from pybk_spark import errors
from pybk_spark.admin.operations import liveness
from pybk_spark.admin.commands import shell_common
from pybk_spark.admin.report import table
from pybk_spark.admin.commands.shell_recovery import client
from pybk_spark.ledger.placement import PlacementPolicy, Registration
from pybk_spark.logs.log import delete_log_metadata, read_log
from pybk_spark.logs.offload_files import delete_record_files
from pybk_spark.logs.positions import drop_all
from pybk_spark.logs.truncation import apply_retention, set_log_retention, truncate_log
from pybk_spark.metadata import audit_control as ctl
from pybk_spark.protocol.log_metadata import SEGMENT_CLOSED, LogMetadata
from pybk_spark.protocol.log_retention import retention_of
from pybk_spark.transport.tls import ClientTls


def _who() -> str:
    return f"pybk@{socket.gethostname()}:{os.getpid()}"


# -- autorecovery switches -----------------------------------------------------------------
def _triggeraudit_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--wait", action="store_true",
                   help="when a registered bookie does not answer, first wait (at most its "
                        "lease's time left + 5 s) until its registration lapses, so the "
                        "audit counts it missing")
    p.add_argument("--probe-timeout", type=float, default=liveness.PROBE_TIMEOUT_S,
                   metavar="SECONDS", help="how long each registered bookie may take to "
                   f"answer (default {liveness.PROBE_TIMEOUT_S:g})")


def _triggeraudit(args: argparse.Namespace) -> int:
    conf = shell_common.client_conf(args)
    tls = ClientTls.from_conf(conf) if conf is not None else None
    store = shell_common.open_store_from(args)
    try:
        checked, suspects = liveness.suspects(store, tls, args.probe_timeout)
        waited, still = 0.0, None
        if args.wait and suspects:
            t0 = time.monotonic()
            still = liveness.wait_lapsed(store, suspects)
            waited = round(time.monotonic() - t0, 1)
        version = ctl.trigger(store, time.time(), _who())
        st = ctl.status(store)
    finally:
        store.close()
    note = ("" if st["leader"] else
            " (no autorecovery process is running: the request waits for one)")
    if not st["enabled"]:
        note += " (autorecovery is disabled: pybk autorecoveryctl --enable)"
    lines = [f"audit requested from the autorecovery leader {st['leader'] or '-'}{note}",
             f"registered bookies probed: {checked}, not answering: {len(suspects)}"]
    for s in suspects:
        lines.append(f"suspect: {s['bookie']} is registered at {s['address'] or '-'} but does "
                     f"not answer ({s['error']}); lease lapses in {s['lease_lapses_in_s']:.0f} s"
                     + ("" if args.wait else
                        ", and only then does an audit count it missing (run triggeraudit "
                        "again then, or triggeraudit --wait)"))
    if args.wait and suspects:
        lines.append(f"waited {waited:g} s for the suspects' leases to lapse" +
                     (f"; still registered: {', '.join(still)} (their leases are being "
                      "refreshed: alive but not answering)" if still else ""))
    shell_common.emit(args, {"triggered": True, "version": version, "leader": st["leader"],
                             "enabled": st["enabled"], "bookies_probed": checked,
                             "suspects": suspects, "waited_s": waited,
                             "still_registered": still or []},
                      "\n".join(lines))
    return 0


def _delay_args(p: argparse.ArgumentParser) -> None:
    g = p.add_mutually_exclusive_group()
    g.add_argument("--get", action="store_true", help="print the stored delay (default)")
    g.add_argument("--set", type=float, metavar="SECONDS",
                   help="store the delay; autorecovery uses it from its next round on")
    g.add_argument("--clear", action="store_true",
                   help="remove the stored delay (autorecovery --delay applies again)")


def _lostbookierecoverydelay(args: argparse.Namespace) -> int:
    store = shell_common.open_store_from(args)
    try:
        if args.set is not None:
            conf = ctl.set_lost_bookie_delay(store, args.set)
        elif args.clear:
            conf = ctl.set_lost_bookie_delay(store, None)
        else:
            conf = ctl.read_config(store)
    finally:
        store.close()
    delay = conf["lost_bookie_recovery_delay_s"]
    shell_common.emit(args, {"lost_bookie_recovery_delay_s": delay},
                      f"lostBookieRecoveryDelay = {delay:g} s" if delay is not None else
                      "lostBookieRecoveryDelay not set (each autorecovery process uses its --delay)")
    return 0


def _ctl_args(p: argparse.ArgumentParser) -> None:
    g = p.add_mutually_exclusive_group()
    g.add_argument("--enable", action="store_true", help="let autorecovery audit and repair")
    g.add_argument("--disable", action="store_true",
                   help="autorecovery keeps running but does nothing until enabled")


def _autorecoveryctl(args: argparse.Namespace) -> int:
    store = shell_common.open_store_from(args)
    try:
        if args.enable or args.disable:
            ctl.set_enabled(store, bool(args.enable))
        st = ctl.status(store)
    finally:
        store.close()
    delay = st["lost_bookie_recovery_delay_s"]
    lines = [f"autorecovery: {'enabled' if st['enabled'] else 'DISABLED'}; leader: "
             f"{st['leader'] or '(none running)'}; lostBookieRecoveryDelay: "
             f"{'(per process --delay)' if delay is None else f'{delay:g} s'}",
             table([{"bookie": b, "unregistered_since": time.strftime(
                 "%Y-%m-%dT%H:%M:%S", time.localtime(since)) if since else "-"}
                   for b, since in sorted(st["missing_bookies"].items())],
                   ["bookie", "unregistered_since"], empty="no bookie seen missing")]
    shell_common.emit(args, st, "\n".join(lines))
    return 0


# -- logs ------------------------------------------------------------------------------------------
def _deletelog_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("name", metavar="NAME")
    p.add_argument("--force", action="store_true",
                   help="delete even while a writer holds the log (its next append fails)")


def _deletelog(args: argparse.Namespace) -> int:
    """The log's key goes first (CAS on the version read), then its ledgers
    and its registered positions: a crash in between leaves ledgers no log
    names, never a log naming deleted ledgers; positions left behind carry
    the deleted log's uid, which a log created later under the name does
    not have (protocol/positions.py)."""
    with client(args) as bk:
        md, version = read_log(bk.metadata_store, args.name)
        open_ids = [s.ledger_id for s in md.segments if s.state != SEGMENT_CLOSED]
        live = [lid for lid in open_ids if bk.is_writer_alive(lid)]
        if live and not args.force:
            raise errors.IllegalOp(f"log {args.name!r} has an active writer (ledger {live[-1]} "
                                   "is open and its writer lease is alive); stop the writer or "
                                   "pass --force", log=args.name)
        try:
            delete_log_metadata(bk.metadata_store, args.name, version)
        except errors.MetadataVersion:
            raise errors.MetadataVersion(f"log {args.name!r} changed while being deleted; "
                                         "run deletelog again") from None
        deleted = []
        for lid in md.ledger_ids:
            try:
                bk.delete_ledger(lid)
                deleted.append(lid)
            except errors.NoSuchLedger:
                pass
        positions = [p.name for p in drop_all(bk.metadata_store, args.name, md.uid)]
        files_left = _delete_offloaded_files(md)
    shell_common.emit(args, {"log": args.name, "deleted_ledgers": deleted, "forced": bool(live),
                             "uid": md.uid, "dropped_positions": positions,
                             "offloaded_files_left": files_left},
                      f"deleted log {args.name} (uid {md.uid or 'none'}) and its "
                      f"{len(deleted)} ledgers and {len(positions)} registered positions"
                      + (f" (writer of ledger {live[-1]} was alive)" if live else ""))
    return 0


def _delete_offloaded_files(md: LogMetadata) -> list[str]:
    """Delete the files of the log's offloaded segments (logs/offload.py);
    the errors of those that could not be deleted (no record names them any
    more: remove them by hand)."""
    left = []
    for s in md.segments:
        if s.offload is not None:
            try:
                delete_record_files(s.offload)
            except errors.BKError as exc:
                left.append(str(exc))
    return left


def _truncatelog_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("name", metavar="NAME")
    p.add_argument("--before", type=int, required=True, metavar="LEDGER",
                   help="drop every (closed) segment before this ledger of the log")


def _truncatelog(args: argparse.Namespace) -> int:
    with client(args) as bk:
        dropped = truncate_log(bk, args.name, args.before)
    shell_common.emit(args, {"log": args.name, "deleted_ledgers": dropped},
                      f"truncated log {args.name}: deleted ledgers "
                      f"{', '.join(map(str, dropped)) or '(none)'}")
    return 0


def _logretention_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("name", metavar="NAME")
    p.add_argument("--ms", type=int, metavar="MS",
                   help="retention.ms: drop closed segments whose last entry is older (-1: no limit)")
    p.add_argument("--bytes", type=int, dest="nbytes", metavar="BYTES",
                   help="retention.bytes: drop the oldest closed segments while the rest hold "
                        "at least this much (-1: no limit)")
    p.add_argument("--apply", action="store_true",
                   help="drop what has expired now (writers apply it when they roll or commit)")


def _logretention(args: argparse.Namespace) -> int:
    dropped: list[int] = []
    with client(args) as bk:
        if args.ms is not None or args.nbytes is not None:
            md = set_log_retention(bk.metadata_store, args.name, ms=args.ms, nbytes=args.nbytes)
        else:
            md = read_log(bk.metadata_store, args.name)[0]
        if args.apply:
            dropped = apply_retention(bk, args.name, time.time, md)
    limits = retention_of(md)
    text = (f"log {args.name}: retention.ms={-1 if limits.ms is None else limits.ms} "
            f"retention.bytes={-1 if limits.bytes is None else limits.bytes}")
    if args.apply:
        text += f"; deleted ledgers {', '.join(map(str, dropped)) or '(none)'}"
    shell_common.emit(args, {"log": args.name, "retention_ms": limits.ms,
                             "retention_bytes": limits.bytes, "deleted_ledgers": dropped}, text)
    return 0


# -- bookiesanity ------------------------------------------------------------------------------
def _sanity_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--bookie", required=True, metavar="ID", help="the bookie to test")
    p.add_argument("--entries", "-n", type=int, default=10)


class _OnlyBookie(PlacementPolicy):
    """Placement seam: every new ensemble is the one bookie under test."""

    def __init__(self, bookie: str) -> None:
        super().__init__()
        self.bookie = bookie

    def new_ensemble(self, n: int, bookies: Mapping[str, Registration],
                     exclude: Iterable[str] = ()) -> tuple[str, ...]:
        if self.bookie not in bookies:
            raise errors.NotEnoughBookies(f"bookie {self.bookie!r} is not registered writable "
                                          "(pybk listbookies --all)")
        return (self.bookie,)

    def replace(self, ensemble: tuple[str, ...], slot: int, bookies: Mapping[str, Registration],
                exclude: Iterable[str] = ()) -> str:
        raise errors.NotEnoughBookies(f"bookie {self.bookie!r} failed a write")


def _bookiesanity(args: argparse.Namespace) -> int:
    """BookKeeper's bookiesanity: a ledger of ensemble 1 on the bookie, written,
    read back, deleted."""
    if args.entries < 1:
        raise errors.IncorrectParameter("--entries must be >= 1")
    t0 = time.monotonic()
    with client(args) as bk:
        bk.placement = _OnlyBookie(args.bookie)
        payloads = [f"bookiesanity-{i}".encode() for i in range(args.entries)]
        lid = None
        try:
            lh = bk.create_ledger(1, 1, 1, custom_metadata={"purpose": "pybk bookiesanity"})
            lid = lh.ledger_id
            lh.add_entries(payloads)
            lh.close()
            got = [e.payload for e in bk.open_ledger(lid, recovery=False).read(0, args.entries - 1)]
            if got != payloads:
                raise errors.ReadError(f"bookie {args.bookie} returned {len(got)} entries that "
                                       "differ from those written", ledger_id=lid)
        except errors.BKError as exc:
            if not str(exc).startswith(f"bookie {args.bookie}"):
                exc.args = (f"bookie {args.bookie}: {exc}",) + exc.args[1:]
            raise
        finally:
            if lid is not None:
                try:
                    bk.delete_ledger(lid)
                except errors.BKError:
                    pass
    seconds = round(time.monotonic() - t0, 3)
    shell_common.emit(args, {"bookie": args.bookie, "ledger": lid, "entries": args.entries, "ok": True,
                             "seconds": seconds},
             f"bookiesanity OK: bookie {args.bookie} wrote, read back and deleted "
             f"{args.entries} entries (ledger {lid}) in {seconds:.2f}s")
    return 0


# -- updatecookie ------------------------------------------------------------------------------
def _updatecookie(args: argparse.Namespace) -> int:
    shell_common.emit(args, {"command": "bookie-server updatecookie"},
                      "updatecookie runs on the bookie's host, with the bookie stopped, against its "
                      "data dir:\n  bookie-server updatecookie --conf BOOKIE.CONF [--advertised-address "
                      "HOST] [--yes]\nIt records the bookie's new advertised address in its cookie "
                      "(docs/operations.md, 'A bookie moved').")
    return 0


shell_common.register("triggeraudit", "ask the autorecovery leader for an audit round now; "
                      "first probe every registered bookie and report those that do not answer "
                      "(suspects) with the time their registration lease has left",
                      _triggeraudit_args, _triggeraudit,
                      writes="the audit request key audit/trigger (CAS); with --wait, only after "
                             "the suspects' registrations lapsed")
shell_common.register("lostbookierecoverydelay", "get or set lostBookieRecoveryDelay (stored in the "
                      "metadata store, honoured by autorecovery)", _delay_args, _lostbookierecoverydelay,
                      writes="only with --set or --clear: the delay in audit/config (CAS)")
shell_common.register("autorecoveryctl", "show autorecovery status; --enable / --disable it "
                      "cluster-wide", _ctl_args, _autorecoveryctl,
                      writes="only with --enable or --disable: the switch in audit/config (CAS)")
shell_common.register("deletelog", "delete a log and its ledgers (refused while a writer is active "
                      "unless --force)", _deletelog_args, _deletelog,
                      writes="deletes the log's metadata (CAS), then its ledgers and its "
                             "offloaded files")
shell_common.register("truncatelog", "drop a log's closed segments before a ledger and delete them",
                      _truncatelog_args, _truncatelog,
                      writes="the log's metadata without the dropped segments (CAS); deletes "
                             "their ledgers")
shell_common.register("logretention", "show or set a log's retention (retention.ms / "
                      "retention.bytes); --apply drops what has expired now",
                      _logretention_args, _logretention,
                      writes="with --ms or --bytes: the log's retention in its metadata (CAS); "
                             "with --apply: drops expired segments (CAS) and deletes their "
                             "ledgers")
shell_common.register("bookiesanity", "write, read back and delete a ledger on one bookie (ensemble 1)",
                      _sanity_args, _bookiesanity,
                      writes="a test ledger of ensemble 1 on the bookie: created, written, read "
                             "back and deleted")
shell_common.register("updatecookie", "how to record a moved bookie's address (bookie-server "
                      "updatecookie)", lambda p: None, _updatecookie,
                      writes=None)
