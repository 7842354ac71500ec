"""The bookie's checkpoint on disk: ``checkpoint.json`` and the run index
files it names (``index-<generation>.arrow``).

Theory of operation
-------------------
A checkpoint is one JSON document: the journal position P it covers, the
ledger states, the lost ranges, and the names of the Arrow IPC files that
hold the entry store's run index at that cut: a *base* (the whole index)
and, after it, *deltas* in order (``store_index.take_delta``): a ledger a
delta *replaces* has exactly that delta's runs (none: dropped), a ledger it
*appends* to gains that delta's runs. A checkpoint cuts only what changed
since the previous one, so its cost under the store's lock follows what
changed, not what the bookie stores nor how long a ledger is. It appends
that delta to the files; when the deltas would pass half the base's rows or
``MAX_DELTAS`` files (``wants_base``), it folds the files it names and the
new delta into a new base instead (``store_index.fold``): that reads and
writes the whole index, but from files, with no lock of the store held. A
restart goes on from the files the checkpoint it loaded names. A checkpoint
whose index did not change writes no index file at all.

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
from typing import Any, Callable, Optional

import pyarrow as pa

from bookie_server.journal.journal_format import Position
from bookie_server.storage.store_index import IndexDelta, fold

CHECKPOINT = "checkpoint.json"
MAX_DELTAS = 64


@dataclass(frozen=True)
class IndexFiles:
    """The index files a checkpoint names: the base and its deltas, in order
    (``{"file", "replaced", "appended", "rows"}`` each; a delta written
    before appends were persisted has ``"ledgers"``, all replaced).  No
    delta has ``"ledgers"`` now, so a version that knew only replacing
    deltas refuses to load a checkpoint that appends instead of reading it
    short."""
    base: str
    base_rows: int
    deltas: tuple[dict[str, Any], ...] = field(default=())

    def delta_rows(self) -> int:
        return sum(int(d["rows"]) for d in self.deltas)

    def names(self) -> set[str]:
        return {self.base, *(d["file"] for d in self.deltas)}

    @classmethod
    def of(cls, doc: dict[str, Any]) -> "IndexFiles":
        """The files a loaded checkpoint document names."""
        deltas = tuple(doc.get("index_deltas", ()))
        return cls(doc["index"], int(doc.get("index_rows", -1)), deltas)


def wants_base(files: Optional[IndexFiles], delta_rows: int) -> bool:
    """Whether the next checkpoint writes the whole index rather than a delta
    of ``delta_rows`` rows: no base yet (a new bookie; its first delta holds
    every ledger it has flushed), a base of unrecorded size (written by a
    version before ``index_rows``), or the deltas would pass ``MAX_DELTAS``
    files or half the base's rows (so a load reads at most about 1.5x the
    index)."""
    if files is None or files.base_rows < 0:
        return True
    return (len(files.deltas) >= MAX_DELTAS
            or 2 * (files.delta_rows() + delta_rows) > max(files.base_rows, 4096))


def write(data_dir: str, generation: int, position: Position, files: Optional[IndexFiles],
          delta: IndexDelta, states: list[dict[str, Any]],
          lost: dict[str, Any], fsync: Callable[[int], None]) -> IndexFiles:
    """Persist checkpoint ``generation`` at journal ``position`` (seq, offset)
    and return the index files it names.  ``delta`` is the change since the
    checkpoint that named ``files`` (None: there was none, so ``delta``
    holds the whole index).  No index file is written when ``delta`` is
    empty and ``files`` exist."""
    index_name = f"index-{generation:010d}.arrow"
    rows = delta.table.num_rows
    if files is None:
        _write_table(os.path.join(data_dir, index_name), delta.table, fsync)
        files = IndexFiles(index_name, rows)
    elif not delta.empty and wants_base(files, rows):
        whole = fold(read_index(data_dir, files), [delta])
        _write_table(os.path.join(data_dir, index_name), whole, fsync)
        files = IndexFiles(index_name, whole.num_rows)
    elif not delta.empty:
        _write_table(os.path.join(data_dir, index_name), delta.table, fsync)
        files = IndexFiles(files.base, files.base_rows, files.deltas + (
            {"file": index_name, "replaced": [int(x) for x in delta.replaced],
             "appended": [int(x) for x in delta.appended], "rows": rows},))
    doc = {"version": 1, "generation": generation, "journal_seq": position.seq,
           "journal_offset": position.offset, "index": files.base,
           "index_rows": files.base_rows, "index_deltas": list(files.deltas),
           "states": states, "lost": lost}
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


def read_index(data_dir: str, files: IndexFiles) -> pa.Table:
    """The run index ``files`` hold: the base with every delta applied."""
    return fold(_read_table(os.path.join(data_dir, files.base)),
                [IndexDelta(_read_table(os.path.join(data_dir, d["file"])),
                            d["replaced"] if "replaced" in d else d["ledgers"],
                            d.get("appended", []))
                 for d in files.deltas])


def read(data_dir: str) -> Optional[tuple[dict[str, Any], pa.Table]]:
    """(the checkpoint document, its run index: the base with every delta
    applied in order); None before the first."""
    path = os.path.join(data_dir, CHECKPOINT)
    if not os.path.exists(path):
        return None
    with open(path, encoding="utf-8") as fh:
        doc = json.load(fh)
    return doc, read_index(data_dir, IndexFiles.of(doc))


def fsync_path(path: str, fsync: Callable[[int], None]) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        fsync(fd)
    finally:
        os.close(fd)
