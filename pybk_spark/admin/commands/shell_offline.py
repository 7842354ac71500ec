"""``pybk readjournal | lastmark``: a bookie's data dir read offline.

The journal's file format is the bookie's, so the bookie reads it: these run
``bookie-server lastmark | readjournal`` (bookie_server/offline.py; the same
Python, ``python -m bookie_server``), which answer one JSON document, and
print it as a table or, with ``--json``, as it is.  Both only read, so they
are safe on a running bookie's dir too; a running bookie may be appending to
the newest journal file meanwhile.
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys

from pybk_spark import errors
from pybk_spark.admin.commands import shell_common
from pybk_spark.admin.report import table


def _data_dir_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument("--data-dir", required=True, metavar="DIR",
                   help="the bookie's data_dir (as in its bookie.conf)")


def _bookie_tool(*argv: str) -> dict:
    """What ``bookie-server ARGV...`` answers; its typed error raised here."""
    cmd = [sys.executable, "-m", "bookie_server", *argv]
    done = subprocess.run(cmd, capture_output=True, text=True, check=False)
    try:
        doc = json.loads(done.stdout)
    except ValueError:
        raise errors.BKError(f"bookie-server {argv[0]} failed (exit {done.returncode}): "
                             f"{done.stderr.strip().splitlines()[-1:] or 'no output'}") from None
    if done.returncode != 0 and isinstance(doc, dict) and "error" in doc:
        if doc.get("errno") is not None:       # the same OSError subclass and text
            raise OSError(doc["errno"], doc["strerror"], doc["filename"])
        if "errno" in doc:
            raise OSError(doc.get("message", ""))
        kind = getattr(errors, str(doc["error"]), None)
        if not (isinstance(kind, type) and issubclass(kind, errors.BKError)):
            kind = errors.BKError
        raise kind(doc.get("message", ""))
    return doc


# -- lastmark ------------------------------------------------------------------------------------
def _lastmark(args: argparse.Namespace) -> int:
    data = _bookie_tool("lastmark", "--data-dir", args.data_dir)
    if not data["checkpoint"]:
        shell_common.emit(args, data, f"{args.data_dir}: no checkpoint yet (replay starts at the first "
                                      "journal file)")
        return 0
    shell_common.emit(args, data, f"last mark: journal {data['journal_file']} offset "
                                  f"{data['journal_offset']} (seq {data['journal_seq']}), checkpoint "
                                  f"generation {data['generation']}, {data['ledgers']} ledgers' state")
    return 0


# -- readjournal ---------------------------------------------------------------------------------
def _readjournal_args(p: argparse.ArgumentParser) -> None:
    _data_dir_arg(p)
    p.add_argument("--file", metavar="SEQ", help="only this journal file (hex sequence number "
                   "or file name, as listed in DATA_DIR/journal)")
    p.add_argument("--ledger", type=int, metavar="ID", help="only records of this ledger")
    p.add_argument("--max", type=int, default=0, metavar="N", help="stop after N records")


def _readjournal(args: argparse.Namespace) -> int:
    argv = ["readjournal", "--data-dir", args.data_dir, "--max", str(args.max)]
    if args.file is not None:
        argv += ["--file", args.file]
    if args.ledger is not None:
        argv += ["--ledger", str(args.ledger)]
    data = _bookie_tool(*argv)
    rows, damage = data["records"], data["damage"]
    mark_file = data.pop("mark_file")
    human = [{**r, "entry_ids": (f"{r['first_entry']}-{r['last_entry']}"
                                 if r["entries"] else None),
              "mark": "" if r["checkpointed"] else "after"} for r in rows]
    text = table(human, ["file", "offset", "type", "ledger", "entry_ids", "entries", "bytes",
                         "detail", "mark"], empty="(no journal records)")
    text += (f"\n{len(rows)} records; last mark {mark_file}:{data['mark']['journal_offset']} "
             "('after': replayed at the next start)")
    if damage:
        text += "\n" + "\n".join(f"DAMAGE {d['file']} offset {d['offset']}: {d['bytes']} bytes "
                                 "skipped" for d in damage)
    shell_common.emit(args, data, text)
    return 0


shell_common.register("lastmark", "a bookie's checkpoint position (journal file and offset), offline",
                      _data_dir_arg, _lastmark, writes=None)
shell_common.register("readjournal", "decode a bookie's journal files offline (records, types, "
                      "ledger/entry ids)", _readjournal_args, _readjournal,
                      writes=None)
