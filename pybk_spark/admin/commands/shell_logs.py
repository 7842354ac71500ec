"""The log commands ``pybk listlogs | logmetadata | readlog``."""
from __future__ import annotations

import argparse
import json
from typing import Callable, Optional

import pyarrow as pa

from pybk_spark import errors
from pybk_spark.admin.commands import shell_common
from pybk_spark.admin.report import HEX_HINT, preview, table
from pybk_spark.admin.commands.shell_recovery import client, password_arg, password_of
from pybk_spark.logs.log import list_logs, read_log
from pybk_spark.logs.log_reader import LogReader, Start, records_of
from pybk_spark.metadata.store import MetadataStore
from pybk_spark.protocol.log_metadata import LogMetadata
from pybk_spark.protocol.log_retention import retention_of


# -- logs ------------------------------------------------------------------------------------------
def _retention_text(md: LogMetadata) -> str:
    """A log's retention limits for a table cell: ``-`` when it has none."""
    try:
        limits = retention_of(md)
    except errors.IncorrectParameter as exc:
        return f"(bad: {exc})"
    parts = ([f"ms={limits.ms}"] if limits.ms is not None else []) + \
        ([f"bytes={limits.bytes}"] if limits.bytes is not None else [])
    return " ".join(parts) or "-"


def _listlogs(args: argparse.Namespace) -> int:
    store = shell_common.open_store_from(args)
    try:
        rows = []
        for name in list_logs(store):
            try:
                md, _ = read_log(store, name)
            except errors.BKError:
                continue
            rows.append({"log": name, "segments": len(md.segments), "epoch": md.epoch,
                         "ledgers": md.ledger_ids,
                         "truncated_ledgers": md.truncated_ledgers,
                         "retention": _retention_text(md)})
    finally:
        store.close()
    shell_common.emit(args, rows, table(rows, ["log", "segments", "epoch", "truncated_ledgers",
                                               "retention", "ledgers"], empty="(no logs)"))
    return 0


def _log_name_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("name", metavar="NAME")


def _logmetadata(args: argparse.Namespace) -> int:
    store = shell_common.open_store_from(args)
    try:
        md, version = read_log(store, args.name)
    finally:
        store.close()
    data = json.loads(md.to_json())
    data["version"] = version
    seg_rows = [s.to_dict() for s in md.segments]
    text = (f"log {md.name}: uid={md.uid or 'none'} epoch={md.epoch} truncated_ledgers={md.truncated_ledgers} "
            f"truncated_offset={md.truncated_offset} schema={'yes' if md.schema else 'no'} "
            f"retention={_retention_text(md)}\n"
            + table(seg_rows, ["ledger_id", "state", "entry_count", "byte_count",
                               "start_offset"], empty="(no segments)"))
    shell_common.emit(args, data, text)
    return 0


def _readlog_args(p: argparse.ArgumentParser) -> None:
    _log_name_args(p)
    p.add_argument("--from", dest="start", default="earliest", metavar="POS",
                   help="earliest (default), latest, or LEDGER:ENTRY")
    p.add_argument("--follow", "-f", action="store_true", help="keep tailing (Ctrl-C stops)")
    p.add_argument("--max", type=int, default=0, metavar="N", help="stop after N records")
    p.add_argument("--hex", action="store_true", help="print raw payloads as hex")
    password_arg(p)
    p.add_argument("--extra-password", dest="extra_passwords", action="append", default=[],
                   metavar="PW", help="another password to try per segment, for a log whose "
                                      "segments were written under different passwords "
                                      "(repeatable)")


def _parse_position(text: str) -> Start:
    if text in ("earliest", "latest"):
        return text
    try:
        ledger, entry = text.split(":")
        return int(ledger), int(entry)
    except ValueError:
        raise errors.IncorrectParameter(f"bad position {text!r}: earliest, latest or "
                                        "LEDGER:ENTRY") from None


def _dataframe_decoder(store: MetadataStore,
                       name: str) -> Optional[Callable[[bytes], list[dict]]]:
    """For a DataFrame log (its metadata records an Arrow schema): a function
    payload -> list of row dicts; None for a log of raw payloads."""
    md, _ = read_log(store, name)
    if not md.schema:
        return None

    def decode(payload: bytes) -> list[dict]:
        try:
            return pa.ipc.open_stream(payload).read_all().to_pylist()
        except (pa.ArrowInvalid, OSError) as exc:
            return [{"_undecodable": f"{type(exc).__name__}: {exc}"}]
    return decode


def _row_text(row: dict) -> str:
    return " ".join(f"{k}={v!r}" if isinstance(v, str) else f"{k}={v}" for k, v in row.items())


def _readlog(args: argparse.Namespace) -> int:
    start = _parse_position(args.start)
    limit = args.max if args.max > 0 else None
    as_json = getattr(args, "json", False)
    count = 0
    binary = False
    records: list[dict] = []
    with client(args) as bk:
        decode = _dataframe_decoder(bk.metadata_store, args.name)
        reader = LogReader(bk, args.name, start, password=password_of(args) or b"",
                           other_passwords=[p.encode() for p in args.extra_passwords])
        try:
            while limit is None or count < limit:
                want = 100_000 if limit is None else limit - count
                got = reader.read_available(want)[:want]
                if not got:
                    if not args.follow:
                        break
                    index, _lid, batch = reader.read_batch(timeout_s=1.0)
                    if batch is None:
                        continue
                    got = records_of(index, batch)[:want]
                for r in got:
                    count += 1
                    row = {"ledger": r.position.ledger_id, "entry": r.position.entry_id,
                           "size": len(r.payload),
                           "payload": r.payload.decode("utf-8", errors="replace")[:200]}
                    rows = decode(r.payload) if decode is not None else None
                    if as_json:
                        if rows is not None:
                            row["rows"] = rows
                        records.append(row)
                    elif rows is not None:
                        for i, dfrow in enumerate(rows):
                            print(f"{row['ledger']}:{row['entry']}.{i}\t{_row_text(dfrow)}",
                                  flush=True)
                    else:
                        text, is_binary = preview(r.payload, args.hex, width=200)
                        binary = binary or is_binary
                        print(f"{row['ledger']}:{row['entry']}\t{text}", flush=True)
        except KeyboardInterrupt:
            pass
        finally:
            reader.close()
    if as_json:
        shell_common.emit(args, {"log": args.name, "records": records})
    else:
        print(f"({count} records{', DataFrame log: one line per row' if decode else ''})"
              + (f" {HEX_HINT}" if binary else ""), flush=True)
    return 0


shell_common.register("listlogs", "list logs", lambda p: None, _listlogs,
                      writes=None)
shell_common.register("logmetadata", "show a log's segments", _log_name_args, _logmetadata,
                      writes=None)
shell_common.register("readlog", "print a log's records (optionally tail it)", _readlog_args, _readlog,
                      writes=None)
