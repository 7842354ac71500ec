"""The bookie's checkpoint on disk: ``checkpoint.json`` and the run index
files it names (``index-<generation>.arrow``).

Theory of operation
-------------------
A checkpoint is one JSON document: the journal position P it covers, the
ledger states, the lost ranges, and the names of the Arrow IPC files that
hold the entry store's run index at that cut: a *base* (the whole index,
``store_index.index_table``) and, after it, *deltas* in order, each the
whole run set of the ledgers it names (``store_index.take_index``); a
ledger named by a delta has exactly that delta's runs (none: dropped).  A
checkpoint writes a delta of the ledgers changed since the previous one, so
its cost follows what changed, not what the bookie stores; when the deltas
pass half the base's rows or ``MAX_DELTAS`` files (``wants_base``), or
after a restart, it writes a new base instead.  A checkpoint whose index did
not change writes no index file at all.

Ordering obligations (``write``):
  * the index file is written and fsync'd first, then ``checkpoint.json`` is
    replaced atomically (write a temp file, fsync, rename, fsync the dir):
    a crash leaves the old checkpoint or the new one, never half of either;
  * index files the new document does not name are deleted only after the
    rename.
A failure propagates (the bookie pins itself read-only).
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from typing import Callable, Optional

import pyarrow as pa

from bookie_server.storage.store_index import apply_delta

CHECKPOINT = "checkpoint.json"
MAX_DELTAS = 64


@dataclass(frozen=True)
class IndexFiles:
    """The index files a checkpoint names: the base and its deltas, in order
    (``{"file", "ledgers", "rows"}`` each)."""
    base: str
    base_rows: int
    deltas: tuple[dict, ...] = field(default=())

    def delta_rows(self) -> int:
        return sum(int(d["rows"]) for d in self.deltas)

    def names(self) -> set[str]:
        return {self.base, *(d["file"] for d in self.deltas)}


def wants_base(files: Optional[IndexFiles], delta_rows: int) -> bool:
    """Whether the next checkpoint writes the whole index rather than a delta
    of ``delta_rows`` rows: no base yet (a new bookie, or a restart), or the
    deltas would pass ``MAX_DELTAS`` files or half the base's rows (so a
    load reads at most about 1.5x the index)."""
    if files is None:
        return True
    return (len(files.deltas) >= MAX_DELTAS
            or 2 * (files.delta_rows() + delta_rows) > max(files.base_rows, 4096))


def write(data_dir: str, generation: int, position, files: Optional[IndexFiles],
          table: pa.Table, ledgers: Optional[list[int]], states: list[dict],
          lost: dict, fsync: Callable[[int], None]) -> IndexFiles:
    """Persist checkpoint ``generation`` at journal ``position`` (seq, offset)
    and return the index files it names.  ``ledgers`` None: ``table`` is the
    whole index (a new base); else ``table`` holds the runs of ``ledgers``, a
    delta after ``files`` (no file at all when ``ledgers`` is empty)."""
    index_name = f"index-{generation:010d}.arrow"
    if ledgers is not None and files is None:
        raise ValueError("an index delta needs the base it follows (wants_base: a base first)")
    if ledgers is None or files is None:
        _write_table(os.path.join(data_dir, index_name), table, fsync)
        files = IndexFiles(index_name, table.num_rows)
    elif ledgers:
        _write_table(os.path.join(data_dir, index_name), table, fsync)
        files = IndexFiles(files.base, files.base_rows, files.deltas + (
            {"file": index_name, "ledgers": [int(x) for x in ledgers], "rows": table.num_rows},))
    doc = {"version": 1, "generation": generation, "journal_seq": position.seq,
           "journal_offset": position.offset, "index": files.base,
           "index_deltas": list(files.deltas), "states": states, "lost": lost}
    tmp = os.path.join(data_dir, CHECKPOINT + ".tmp")
    with open(tmp, "w", encoding="utf-8") as fh:
        json.dump(doc, fh)
        fh.flush()
        fsync(fh.fileno())
    os.replace(tmp, os.path.join(data_dir, CHECKPOINT))
    fsync_path(data_dir, fsync)
    keep = files.names()
    for name in os.listdir(data_dir):
        if name.startswith("index-") and name not in keep:
            os.unlink(os.path.join(data_dir, name))
    return files


def _write_table(path: str, table: pa.Table, fsync: Callable[[int], None]) -> None:
    with pa.OSFile(path, "wb") as sink:
        with pa.ipc.new_file(sink, table.schema) as w:
            w.write_table(table)
    fsync_path(path, fsync)


def _read_table(path: str) -> pa.Table:
    with pa.OSFile(path, "rb") as src:
        return pa.ipc.open_file(src).read_all()


def read(data_dir: str) -> Optional[tuple[dict, pa.Table]]:
    """(the checkpoint document, its run index: the base with every delta
    applied in order); None before the first."""
    path = os.path.join(data_dir, CHECKPOINT)
    if not os.path.exists(path):
        return None
    with open(path, encoding="utf-8") as fh:
        doc = json.load(fh)
    table = _read_table(os.path.join(data_dir, doc["index"]))
    for delta in doc.get("index_deltas", ()):
        table = apply_delta(table, _read_table(os.path.join(data_dir, delta["file"])),
                            delta["ledgers"])
    return doc, table


def fsync_path(path: str, fsync: Callable[[int], None]) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        fsync(fd)
    finally:
        os.close(fd)
