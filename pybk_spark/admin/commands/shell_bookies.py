"""``pybk bookieinfo``."""
from __future__ import annotations

import argparse
import json

from pybk_spark import errors
from pybk_spark.admin.commands import shell_common
from pybk_spark.admin.report import table
from pybk_spark.metadata import keys
from pybk_spark.transport.grpc_bookie import BookieClient


# -- bookieinfo ----------------------------------------------------------------------------------
def _bookieinfo_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--bookie", help="only this bookie")


def _bookieinfo(args: argparse.Namespace) -> int:
    store = shell_common.open_store_from(args)
    try:
        regs = []
        for mode in ("writable", "readonly"):
            for key, v in store.list_prefix(keys.bookies_prefix(mode)):
                try:
                    reg = json.loads(v.value)
                except ValueError:
                    reg = {}
                reg["bookie_id"] = key.rsplit("/", 1)[1]
                regs.append(reg)
    finally:
        store.close()
    if args.bookie:
        regs = [r for r in regs if r["bookie_id"] == args.bookie]
        if not regs:
            raise errors.BookieUnavailable(f"bookie {args.bookie!r} is not registered")
    rows = []
    for reg in regs:
        row = {"bookie": reg["bookie_id"], "address": reg.get("address"),
               "add_lane": reg.get("add_lane_address") or "-", "rack": reg.get("rack")}
        c = BookieClient(reg.get("address", ""), bookie_id=reg["bookie_id"], default_timeout=5.0)
        try:
            info = c.info().result()
            row.update(state="readonly" if info.state == 1 else "writable",
                       free_gb=round(info.free_bytes / 2**30, 2),
                       total_gb=round(info.total_bytes / 2**30, 2),
                       ledgers=info.ledger_count, entries=info.entry_count,
                       protocol=info.protocol_version, error="")
        except errors.BKError as exc:
            row.update(state="unreachable", error=f"{type(exc).__name__}: {exc}")
        finally:
            c.close()
        rows.append(row)
    shell_common.emit(args, rows, table(rows, ["bookie", "address", "add_lane", "rack", "state", "free_gb",
                                               "total_gb", "ledgers", "entries", "error"],
                               empty="(no bookies registered)"))
    return 1 if any(r["state"] == "unreachable" for r in rows) else 0


shell_common.register("bookieinfo", "disk, mode and counts of every registered bookie",
                      _bookieinfo_args, _bookieinfo, writes=None)
