"""``pybk positions [LOG]`` and ``pybk dropposition LOG NAME``: the positions
registered under positions/<log>/<name>: streaming queries' read positions
(kind ``stream``, they hold back log truncation) and exactly-once sinks'
committed positions (kind ``sink``, with their last batch id and sink id;
informational); an operator drops the position of a query that is gone."""
from __future__ import annotations

import argparse
import time

from pybk_spark.admin.commands import shell_common
from pybk_spark.admin.report import table
from pybk_spark.logs.positions import drop, list_positions
from pybk_spark.protocol.positions import RegisteredPosition


def _row(p: RegisteredPosition, now: float) -> dict:
    return {"log": p.log, "name": p.name, "index": p.index, "entry": p.entry, "kind": p.kind,
            "updated_at": p.updated_at, "batch_id": p.batch_id, "detail": p.detail,
            "age_s": round(now - p.updated_at, 1) if p.updated_at else None}


def _positions_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("log", nargs="?", help="only this log's positions")


def _positions(args: argparse.Namespace) -> int:
    store = shell_common.open_store_from(args)
    try:
        found = list_positions(store, args.log)
    finally:
        store.close()
    now = time.time()
    rows = [_row(p, now) for p in found]
    shell_common.emit(args, rows, table(rows, ["log", "name", "index", "entry", "kind", "batch_id",
                                               "age_s", "detail"],
                               empty="(no registered positions)"))
    return 0


def _drop_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("log", help="the log")
    p.add_argument("name", help="the position's name (pybk positions LOG lists them)")


def _drop(args: argparse.Namespace) -> int:
    store = shell_common.open_store_from(args)
    try:
        gone = drop(store, args.log, args.name)
    finally:
        store.close()
    row = _row(gone, time.time())
    shell_common.emit(args, {"dropped": row},
                      f"dropped position {gone.name} of log {gone.log} "
                      f"(index {gone.index}, entry {gone.entry}): truncation may now pass it")
    return 0


shell_common.register("positions", "list the positions registered by streaming queries (they hold "
                      "back log truncation) and exactly-once sinks (informational)", _positions_args,
                      _positions, writes=None)
shell_common.register("dropposition", "drop a stale registered read position so that truncation "
                      "may pass it", _drop_args, _drop,
                      writes="deletes the position's key positions/LOG/NAME (CAS)")
