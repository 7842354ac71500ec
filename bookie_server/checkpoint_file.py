"""The bookie's checkpoint on disk: ``checkpoint.json`` and the run index it
names (``index-<generation>.arrow``).

Theory of operation
-------------------
A checkpoint is one JSON document: the journal position P it covers, the
ledger states, the lost ranges, and the name of an Arrow IPC file holding the
entry store's run index at that cut (``store_index.index_table``).

Ordering obligations (``write``):
  * the index file is written and fsync'd first, then ``checkpoint.json`` is
    replaced atomically (write a temp file, fsync, rename, fsync the dir):
    a crash leaves the old checkpoint or the new one, never half of either;
  * index files of older generations are deleted only after the rename.
A failure propagates (the bookie pins itself read-only).
"""
from __future__ import annotations

import json
import os
from typing import Callable, Optional

import pyarrow as pa

CHECKPOINT = "checkpoint.json"


def write(data_dir: str, generation: int, position, table: pa.Table, states: list[dict],
          lost: dict, fsync: Callable[[int], None]) -> None:
    """Persist checkpoint ``generation`` at journal ``position`` (seq, offset)."""
    index_name = f"index-{generation:010d}.arrow"
    index_path = os.path.join(data_dir, index_name)
    with pa.OSFile(index_path, "wb") as sink:
        with pa.ipc.new_file(sink, table.schema) as w:
            w.write_table(table)
    fsync_path(index_path, fsync)
    doc = {"version": 1, "generation": generation, "journal_seq": position.seq,
           "journal_offset": position.offset, "index": index_name, "states": states,
           "lost": lost}
    tmp = os.path.join(data_dir, CHECKPOINT + ".tmp")
    with open(tmp, "w", encoding="utf-8") as fh:
        json.dump(doc, fh)
        fh.flush()
        fsync(fh.fileno())
    os.replace(tmp, os.path.join(data_dir, CHECKPOINT))
    fsync_path(data_dir, fsync)
    for name in os.listdir(data_dir):
        if name.startswith("index-") and name != index_name:
            os.unlink(os.path.join(data_dir, name))


def read(data_dir: str) -> Optional[tuple[dict, pa.Table]]:
    """(the checkpoint document, its run index table); None before the first."""
    path = os.path.join(data_dir, CHECKPOINT)
    if not os.path.exists(path):
        return None
    with open(path, encoding="utf-8") as fh:
        doc = json.load(fh)
    with pa.OSFile(os.path.join(data_dir, doc["index"]), "rb") as src:
        table = pa.ipc.open_file(src).read_all()
    return doc, table


def fsync_path(path: str, fsync: Callable[[int], None]) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        fsync(fd)
    finally:
        os.close(fd)
