"""``pybk readjournal | lastmark``: a bookie's data dir read offline.

Both only read (the journal through ``journal_replay.scan_file``, which never
truncates), so they are safe on a running bookie's dir too; a running bookie
may be appending to the newest journal file meanwhile.
"""
from __future__ import annotations

import json
import logging
import os

from pybk_spark import errors
from pybk_spark.admin import shell_common
from pybk_spark.admin.report import table

CHECKPOINT = "checkpoint.json"       # bookie_server/checkpoint_file.py


def _data_dir_arg(p):
    p.add_argument("--data-dir", required=True, metavar="DIR",
                   help="the bookie's data_dir (as in its bookie.conf)")


def _journal_dir(data_dir: str) -> str:
    path = os.path.join(data_dir, "journal")
    if not os.path.isdir(path):
        raise errors.IncorrectParameter(f"no journal directory at {path}: is --data-dir "
                                        f"{data_dir} a bookie's data_dir?")
    return path


def read_mark(data_dir: str) -> dict | None:
    path = os.path.join(data_dir, CHECKPOINT)
    try:
        with open(path, encoding="utf-8") as fh:
            return json.load(fh)
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        raise errors.IncorrectParameter(f"cannot read the checkpoint {path}: {exc}") from None


# -- lastmark ------------------------------------------------------------------------------------
def _lastmark(args) -> int:
    from bookie_server.journal.journal_format import file_name
    _journal_dir(args.data_dir)
    doc = read_mark(args.data_dir)
    if doc is None:
        data = {"data_dir": args.data_dir, "checkpoint": False, "journal_seq": 0,
                "journal_offset": 0, "journal_file": file_name(0)}
        shell_common.emit(args, data, f"{args.data_dir}: no checkpoint yet (replay starts at the first "
                                      "journal file)")
        return 0
    lost = doc.get("lost") or {}
    data = {"data_dir": args.data_dir, "checkpoint": True,
            "journal_seq": int(doc["journal_seq"]), "journal_offset": int(doc["journal_offset"]),
            "journal_file": file_name(int(doc["journal_seq"])),
            "generation": int(doc["generation"]), "index": doc.get("index"),
            "ledgers": len(doc.get("states") or []),
            "lost_ranges": len(lost.get("ranges") or []) if isinstance(lost, dict) else 0}
    shell_common.emit(args, data, f"last mark: journal {data['journal_file']} offset "
                                  f"{data['journal_offset']} (seq {data['journal_seq']}), checkpoint "
                                  f"generation {data['generation']}, {data['ledgers']} ledgers' state")
    return 0


# -- readjournal ---------------------------------------------------------------------------------
def _readjournal_args(p):
    _data_dir_arg(p)
    p.add_argument("--file", metavar="SEQ", help="only this journal file (hex sequence number "
                   "or file name, as listed in DATA_DIR/journal)")
    p.add_argument("--ledger", type=int, metavar="ID", help="only records of this ledger")
    p.add_argument("--max", type=int, default=0, metavar="N", help="stop after N records")


def _describe(rtype: int, body: bytes) -> dict:
    import pyarrow as pa

    from bookie_server.journal.journal_format import LEDGER, LEDGER_LAC, RecordType
    name = RecordType(rtype).name if rtype in RecordType._value2member_map_ else str(rtype)
    row = {"type": name, "bytes": len(body), "ledger": None,
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
    from bookie_server.journal.journal_format import list_files
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


def _readjournal(args) -> int:
    from bookie_server.journal.journal_format import file_name
    from bookie_server.journal.journal_replay import scan_file
    jdir = _journal_dir(args.data_dir)
    mark = read_mark(args.data_dir)
    mark_at = (int(mark["journal_seq"]), int(mark["journal_offset"])) if mark else (0, 0)
    rows: list = []
    damage: list = []
    quiet = logging.getLogger("bookie.journal")      # replay's own events say "truncated"
    level, quiet.level = quiet.level, logging.CRITICAL + 1
    try:
        for seq in _files(jdir, args.file):
            path = os.path.join(jdir, file_name(seq))
            offset = 0
            for pos, rtype, body in scan_file(path, seq, 0, damage.append):
                desc = _describe(rtype, body)
                if args.ledger is None or desc["ledger"] == args.ledger:
                    rows.append({"file": file_name(seq), "offset": offset, **desc,
                                 "checkpointed": (seq, pos.offset) <= mark_at})
                offset = pos.offset
                if args.max and len(rows) >= args.max:
                    break
            if args.max and len(rows) >= args.max:
                break
    finally:
        quiet.level = level
    data = {"data_dir": args.data_dir, "mark": {"journal_seq": mark_at[0],
                                                "journal_offset": mark_at[1]},
            "records": rows,
            "damage": [{"file": d.file, "offset": d.offset, "bytes": d.nbytes} for d in damage]}
    human = [{**r, "entry_ids": (f"{r['first_entry']}-{r['last_entry']}"
                                 if r["entries"] else None),
              "mark": "" if r["checkpointed"] else "after"} for r in rows]
    text = table(human, ["file", "offset", "type", "ledger", "entry_ids", "entries", "bytes",
                         "detail", "mark"], empty="(no journal records)")
    text += (f"\n{len(rows)} records; last mark {file_name(mark_at[0])}:{mark_at[1]} "
             "('after': replayed at the next start)")
    if damage:
        text += "\n" + "\n".join(f"DAMAGE {d.file} offset {d.offset}: {d.nbytes} bytes skipped"
                                 for d in damage)
    shell_common.emit(args, data, text)
    return 0


shell_common.register("lastmark", "a bookie's checkpoint position (journal file and offset), offline",
                      _data_dir_arg, _lastmark, writes=None)
shell_common.register("readjournal", "decode a bookie's journal files offline (records, types, "
                      "ledger/entry ids)", _readjournal_args, _readjournal,
                      writes=None)
