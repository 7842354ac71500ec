"""``pybk listledgers | ledgermetadata | readledger | deleteledger | simpletest``."""
from __future__ import annotations

import argparse
import json
import time

import numpy as np

from pybk_spark import errors
from pybk_spark.admin.commands import shell_common
from pybk_spark.admin.operations.recover import ledger_password
from pybk_spark.admin.operations.replica_reads import read_ids
from pybk_spark.admin.report import HEX_HINT, Progress, preview, table
from pybk_spark.admin.commands.shell_recovery import client, password_arg, password_of
from pybk_spark.ledger.port import LedgerClient
from pybk_spark.protocol import ledger_metadata as lm


def _ledger_row(md: lm.LedgerMetadata) -> dict:
    return {"ledger": md.ledger_id, "state": md.state,
            "last_entry": md.last_entry_id if md.is_closed else None,
            "length": md.length if md.is_closed else None,
            "quorum": f"{md.ensemble_size}/{md.write_quorum}/{md.ack_quorum}",
            "fragments": len(md.ensembles), "bookies": sorted(md.all_bookies()),
            "custom": dict(md.custom)}


def _md_dict(md: lm.LedgerMetadata) -> dict:
    return json.loads(md.to_json())


# -- listledgers ---------------------------------------------------------------------------------
def _listledgers_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--bookie", help="only ledgers with a fragment on this bookie")


def _listledgers(args: argparse.Namespace) -> int:
    with client(args) as bk:
        rows = []
        for lid in bk.list_ledgers():
            try:
                md = bk.get_ledger_metadata(lid)
            except errors.NoSuchLedger:
                continue
            if args.bookie and args.bookie not in md.all_bookies():
                continue
            rows.append(_ledger_row(md))
    shell_common.emit(args, rows, table(rows, ["ledger", "state", "last_entry", "length", "quorum",
                                               "fragments", "bookies"], empty="(no ledgers)"))
    return 0


# -- ledgermetadata ------------------------------------------------------------------------------
def _ledger_id_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument("ledger_id", type=int, metavar="ID")


def _ledgermetadata(args: argparse.Namespace) -> int:
    with client(args) as bk:
        md = bk.get_ledger_metadata(args.ledger_id)
        alive = bk.is_writer_alive(args.ledger_id)
    data = _md_dict(md)
    data["writer_alive"] = alive
    lines = [f"ledger {md.ledger_id}: state={md.state} E/Qw/Qa={md.ensemble_size}/"
             f"{md.write_quorum}/{md.ack_quorum} digest={md.digest_type} writer_alive={alive}",
             f"last_entry={md.last_entry_id if md.is_closed else '(open)'} "
             f"length={md.length} ctime_ms={md.ctime_ms} custom={dict(md.custom)}",
             table([{"first_entry": f, "ensemble": list(b)} for f, b in md.ensembles],
                   ["first_entry", "ensemble"])]
    shell_common.emit(args, data, "\n".join(lines))
    return 0


# -- readledger ------------------------------------------------------------------------------------
def _readledger_args(p: argparse.ArgumentParser) -> None:
    _ledger_id_arg(p)
    p.add_argument("--first", type=int, default=0, metavar="N", help="first entry (default 0)")
    p.add_argument("--last", type=int, default=None, metavar="M",
                   help="last entry (default: last confirmed)")
    p.add_argument("--force-recovery", action="store_true",
                   help="fencing open: recover and close the ledger first")
    p.add_argument("--hex", action="store_true", help="print payloads as hex")
    p.add_argument("--bookie", metavar="ID",
                   help="read only this bookie's copy (the entries it stores, gaps skipped)")
    password_arg(p)


def _preview(payload: bytes, as_hex: bool, width: int = 60) -> str:
    return preview(payload, as_hex, width)[0]


def _entry_row(entry_id: int, payload: bytes, as_hex: bool) -> dict:
    text, binary = preview(payload, as_hex)
    return {"entry": entry_id, "size": len(payload), "payload": text, "binary": binary}


def _readledger(args: argparse.Namespace) -> int:
    with client(args) as bk:
        md = bk.get_ledger_metadata(args.ledger_id)
        pw = ledger_password(md, password_of(args))
        if args.bookie:
            return _readledger_bookie(args, bk, md, pw)
        rh = bk.open_ledger(args.ledger_id, password=pw, recovery=args.force_recovery)
        last = rh.last_add_confirmed if args.last is None else args.last
        rows: list[dict] = []
        if last >= args.first:
            total = last - args.first + 1
            with Progress("read", total, enabled=not getattr(args, "json", False)
                          and total > 10000) as p:
                for batch in rh.read_batches(args.first, last):
                    ids = batch.column("entry_id").to_pylist()
                    pays = batch.column("payload").to_pylist()
                    rows.extend(_entry_row(e, pl, args.hex) for e, pl in zip(ids, pays))
                    p.step(n=batch.num_rows)
    data = {"ledger": args.ledger_id, "last_add_confirmed": rh.last_add_confirmed,
            "entries": rows}
    header = (f"ledger {args.ledger_id} entries {args.first}..{last} "
              f"(last add confirmed {rh.last_add_confirmed})")
    binary = not args.hex and any(e["binary"] for e in rows)
    for e in rows:
        del e["binary"]
    shell_common.emit(args, data, header + "\n" + table(rows, ["entry", "size", "payload"],
                                                        empty="(no entries)")
             + (f"\n{HEX_HINT}" if binary else ""))
    return 0


def _readledger_bookie(args: argparse.Namespace, bk: LedgerClient, md: lm.LedgerMetadata,
                       pw: bytes) -> int:
    """One bookie's copy: sparse reads of ``--first..--last`` from that bookie
    alone (no quorum, no digest check across replicas)."""
    if args.bookie not in md.all_bookies():
        raise errors.IncorrectParameter(f"bookie {args.bookie!r} holds no fragment of ledger "
                                        f"{md.ledger_id} (its bookies: "
                                        f"{', '.join(sorted(md.all_bookies()))})")
    key = lm.master_key(pw)
    transport = bk.transports.get(args.bookie)
    last = args.last
    if last is None:
        if md.is_closed:
            last = md.last_entry_id
        else:
            try:
                last = transport.read_lac(md.ledger_id, master_key=key).result().last_entry_id
            except errors.BKError as exc:
                raise type(exc)(f"bookie {args.bookie}: {exc}") from None
    got = read_ids(transport, md.ledger_id, np.arange(args.first, last + 1, dtype=np.int64), key)
    if got.unreachable:
        raise errors.BookieUnavailable(f"bookie {args.bookie} could not be read: "
                                       f"{got.unreachable}")
    rows: list = []
    for batch in got.batches:
        rows.extend(_entry_row(e, pl, args.hex) for e, pl in
                    zip(batch.column("entry_id").to_pylist(), batch.column("payload").to_pylist()))
    binary = not args.hex and any(e["binary"] for e in rows)
    for e in rows:
        del e["binary"]
    data = {"ledger": md.ledger_id, "bookie": args.bookie, "first": args.first, "last": last,
            "entries": rows}
    header = (f"ledger {md.ledger_id} on bookie {args.bookie}: {len(rows)} of entries "
              f"{args.first}..{last} stored there")
    shell_common.emit(args, data, header + "\n" + table(rows, ["entry", "size", "payload"],
                                                        empty="(no entries)")
             + (f"\n{HEX_HINT}" if binary else ""))
    return 0


# -- deleteledger --------------------------------------------------------------------------------
def _deleteledger(args: argparse.Namespace) -> int:
    with client(args) as bk:
        bk.delete_ledger(args.ledger_id)
    shell_common.emit(args, {"deleted": args.ledger_id}, f"deleted ledger {args.ledger_id}")
    return 0


# -- simpletest ------------------------------------------------------------------------------------
def _simpletest_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--ensemble", "-e", type=int, default=3)
    p.add_argument("--write-quorum", "-w", type=int, default=2)
    p.add_argument("--ack-quorum", "-a", type=int, default=2)
    p.add_argument("--entries", "-n", type=int, default=100)
    p.add_argument("--entry-size", type=int, default=100)
    p.add_argument("--keep", action="store_true", help="do not delete the test ledger")


def _simpletest(args: argparse.Namespace) -> int:
    if args.entries < 1 or args.entry_size < 0:
        raise errors.IncorrectParameter("--entries must be >= 1 and --entry-size >= 0")
    t0 = time.monotonic()
    with client(args) as bk:
        lh = bk.create_ledger(args.ensemble, args.write_quorum, args.ack_quorum,
                              custom_metadata={"purpose": "pybk simpletest"})
        lid = lh.ledger_id
        payloads = [(f"simpletest-{i}-".encode() + b"x" * args.entry_size)[:max(
            args.entry_size, 16)] for i in range(args.entries)]
        lh.add_entries(payloads)
        lh.close()
        t_write = time.monotonic() - t0
        rh = bk.open_ledger(lid, recovery=False)
        got = [e.payload for e in rh.read(0, rh.last_add_confirmed)]
        if got != payloads:
            raise errors.ReadError(f"simpletest read back {len(got)} entries that differ from "
                                   f"the {len(payloads)} written", ledger_id=lid)
        md = rh.metadata
        if not args.keep:
            bk.delete_ledger(lid)
    data = {"ledger": lid, "entries": args.entries, "ensemble": list(md.current_ensemble),
            "write_seconds": round(t_write, 3), "seconds": round(time.monotonic() - t0, 3),
            "ok": True, "deleted": not args.keep}
    shell_common.emit(args, data, f"simpletest OK: ledger {lid} on {','.join(md.current_ensemble)}: "
                                  f"wrote and read back {args.entries} entries in {data['seconds']:.2f}s"
                                  + ("" if args.keep else " (ledger deleted)"))
    return 0


shell_common.register("listledgers", "list ledgers with state and ensemble", _listledgers_args,
                      _listledgers, writes=None)
shell_common.register("ledgermetadata", "show one ledger's metadata", _ledger_id_arg, _ledgermetadata,
                      writes=None)
shell_common.register("readledger", "print a ledger's entries", _readledger_args, _readledger,
                      writes="only with --force-recovery: it fences the ledger on its bookies, "
                             "recovers its last entries and closes it in its metadata (CAS)")
shell_common.register("deleteledger", "delete a ledger (bookies garbage-collect its entries)",
                      _ledger_id_arg, _deleteledger,
                      writes="deletes the ledger's metadata; bookies then delete its entries")
shell_common.register("simpletest", "create, write, read back and delete a ledger", _simpletest_args,
                      _simpletest, writes="a test ledger: created, written, read back and "
                                          "deleted (kept with --keep)")
