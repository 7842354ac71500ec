"""``bookie-server lastmark | readjournal``: a bookie's data dir read offline.

The journal's file format is the bookie's own (bookie_server/journal/), so
the bookie reads it; ``pybk lastmark`` / ``pybk readjournal``
(pybk_spark/admin/commands/shell_offline.py) run these and print what they answer.
Each prints one JSON document on stdout: the answer, or on bad input
``{"error": <typed error class>, "message": ...}`` with exit status 1 (an
``OSError`` adds its ``errno``, ``strerror`` and ``filename``).

Both only read (the journal through ``journal_replay.scan_file``, which never
truncates), so they are safe on a running bookie's dir too; a running bookie
may be appending to the newest journal file meanwhile.
"""
from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from typing import Any

import pyarrow as pa

from bookie_server.journal.journal_format import LEDGER, LEDGER_LAC, RecordType, file_name, list_files
from bookie_server.journal.journal_replay import Damage, scan_file
from pybk_spark import errors
from pybk_spark.wire.entries import parse_entry_record

CHECKPOINT = "checkpoint.json"       # bookie_server/checkpoint_file.py
COMMANDS = ("lastmark", "readjournal")


def _journal_dir(data_dir: str) -> str:
    path = os.path.join(data_dir, "journal")
    if not os.path.isdir(path):
        raise errors.IncorrectParameter(f"no journal directory at {path}: is --data-dir "
                                        f"{data_dir} a bookie's data_dir?")
    return path


def read_mark(data_dir: str) -> dict[str, Any] | None:
    path = os.path.join(data_dir, CHECKPOINT)
    try:
        with open(path, encoding="utf-8") as fh:
            doc: dict[str, Any] = json.load(fh)
            return doc
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        raise errors.IncorrectParameter(f"cannot read the checkpoint {path}: {exc}") from None


# -- lastmark ------------------------------------------------------------------------------------
def last_mark(data_dir: str) -> dict[str, Any]:
    """The checkpoint position (journal file and offset) of the bookie at ``data_dir``."""
    _journal_dir(data_dir)
    doc = read_mark(data_dir)
    if doc is None:
        return {"data_dir": data_dir, "checkpoint": False, "journal_seq": 0,
                "journal_offset": 0, "journal_file": file_name(0)}
    lost = doc.get("lost") or {}
    return {"data_dir": data_dir, "checkpoint": True,
            "journal_seq": int(doc["journal_seq"]), "journal_offset": int(doc["journal_offset"]),
            "journal_file": file_name(int(doc["journal_seq"])),
            "generation": int(doc["generation"]), "index": doc.get("index"),
            "ledgers": len(doc.get("states") or []),
            "lost_ranges": len(lost.get("ranges") or []) if isinstance(lost, dict) else 0}


# -- readjournal ---------------------------------------------------------------------------------
def _describe(rtype: int, body: bytes) -> dict[str, Any]:
    name = RecordType(rtype).name if rtype in RecordType._value2member_map_ else str(rtype)
    row: dict[str, Any] = {"type": name, "bytes": len(body), "ledger": None,
                           "first_entry": None, "last_entry": None, "entries": None, "detail": ""}
    if rtype == RecordType.ADD_BATCH:
        try:
            batch = pa.ipc.open_stream(body).read_all()
        except (pa.ArrowInvalid, OSError) as exc:
            row["detail"] = f"undecodable batch: {exc}"
            return row
        if batch.num_rows:
            ids = batch.column(1)
            row.update(ledger=batch.column(0)[0].as_py(), first_entry=ids[0].as_py(),
                       last_entry=ids[batch.num_rows - 1].as_py(), entries=batch.num_rows)
        return row
    if rtype == RecordType.ADD_ENTRY:
        try:
            ledger, entry, lac, _length, _start = parse_entry_record(body)
        except errors.BadRequest as exc:
            row["detail"] = f"undecodable entry: {exc}"
            return row
        row.update(ledger=ledger, first_entry=entry, last_entry=entry, entries=1,
                   detail=f"lac={lac}")
        return row
    if rtype == RecordType.PAD:         # alignment filler (journal/direct_write.py), no ledger
        return row
    if len(body) >= LEDGER.size:
        (row["ledger"],) = LEDGER.unpack_from(body)
    if rtype == RecordType.EXPLICIT_LAC and len(body) >= LEDGER_LAC.size:
        row["detail"] = f"lac={LEDGER_LAC.unpack_from(body)[1]}"
    elif rtype == RecordType.MASTER_KEY:
        row["detail"] = f"key_bytes={len(body) - LEDGER.size}"
    return row


def _files(journal_dir: str, only: str | None) -> list[int]:
    seqs = list_files(journal_dir)
    if only is None:
        return seqs
    try:
        want = int(only[:-4] if only.endswith(".jnl") else only, 16)
    except ValueError:
        raise errors.IncorrectParameter(f"bad --file {only!r}: a hex sequence number or a "
                                        ".jnl file name") from None
    if want not in seqs:
        raise errors.IncorrectParameter(f"no journal file {only} in {journal_dir}")
    return [want]


def read_journal(data_dir: str, only_file: str | None = None, ledger: int | None = None,
                 max_records: int = 0) -> dict[str, Any]:
    """The journal records of the bookie at ``data_dir`` (each marked
    checkpointed or not), the damage the scan skipped and the checkpoint's
    position (``mark``; ``mark_file``: its journal file's name)."""
    jdir = _journal_dir(data_dir)
    mark = read_mark(data_dir)
    mark_at = (int(mark["journal_seq"]), int(mark["journal_offset"])) if mark else (0, 0)
    rows: list[dict[str, Any]] = []
    damage: list[Damage] = []
    quiet = logging.getLogger("bookie.journal")      # replay's own events say "truncated"
    level, quiet.level = quiet.level, logging.CRITICAL + 1
    try:
        for seq in _files(jdir, only_file):
            path = os.path.join(jdir, file_name(seq))
            offset = 0
            for pos, rtype, body in scan_file(path, seq, 0, damage.append):
                desc = _describe(rtype, body)
                if ledger is None or desc["ledger"] == ledger:
                    rows.append({"file": file_name(seq), "offset": offset, **desc,
                                 "checkpointed": (seq, pos.offset) <= mark_at})
                offset = pos.offset
                if max_records and len(rows) >= max_records:
                    break
            if max_records and len(rows) >= max_records:
                break
    finally:
        quiet.level = level
    return {"data_dir": data_dir, "mark": {"journal_seq": mark_at[0],
                                           "journal_offset": mark_at[1]},
            "mark_file": file_name(mark_at[0]),
            "records": rows,
            "damage": [{"file": d.file, "offset": d.offset, "bytes": d.nbytes} for d in damage]}


def _parse(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="bookie-server", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="command", required=True)
    mark = sub.add_parser("lastmark", help="the checkpoint position, as JSON")
    journal = sub.add_parser("readjournal", help="the journal's records, as JSON")
    for q in (mark, journal):
        q.add_argument("--data-dir", required=True, metavar="DIR",
                       help="the bookie's data_dir (as in its bookie.conf)")
    journal.add_argument("--file", metavar="SEQ", help="only this journal file (hex sequence "
                         "number or file name, as listed in DATA_DIR/journal)")
    journal.add_argument("--ledger", type=int, metavar="ID", help="only records of this ledger")
    journal.add_argument("--max", type=int, default=0, metavar="N", help="stop after N records")
    return p.parse_args(argv)


def main(argv: list[str]) -> int:
    """``bookie-server lastmark|readjournal ...``: one JSON document on stdout."""
    args = _parse(argv)
    try:
        if args.command == "lastmark":
            data = last_mark(args.data_dir)
        else:
            data = read_journal(args.data_dir, args.file, args.ledger, args.max)
    except errors.BKError as exc:
        print(json.dumps({"error": type(exc).__name__, "message": str(exc)}), flush=True)
        return 1
    except OSError as exc:      # sent whole, so the caller can raise the same OSError
        print(json.dumps({"error": type(exc).__name__, "message": str(exc), "errno": exc.errno,
                          "strerror": exc.strerror, "filename": exc.filename}), flush=True)
        return 1
    print(json.dumps(data, sort_keys=True, default=str), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
