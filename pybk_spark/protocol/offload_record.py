"""The record of a segment offloaded to Parquet files, as the log's metadata
keeps it (``Segment.offload``; protocol/offload.py decides with it).

A record names its files relative to the log's dataset directory under
``location`` (a URI: a local path or any ``pyarrow.fs`` filesystem), each
with its size, SHA-256 and entry range; ``digest`` is the SHA-256 of the
segment's per-entry digests in entry order, so the files can be checked
against the ledger they were written from.  ``state`` is ``offloaded``
(the files are the segment's copy; the ledger may still be on bookies) or
``ledger_deleted`` (the files are its only copy).

Pure: no I/O.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

from pybk_spark import errors

STATE_OFFLOADED = "offloaded"
STATE_LEDGER_DELETED = "ledger_deleted"
STATES = (STATE_OFFLOADED, STATE_LEDGER_DELETED)


@dataclass(frozen=True)
class OffloadFile:
    path: str                 # relative to the log's dataset directory
    size: int                 # bytes
    sha256: str               # hex digest of the file's bytes
    rows: int
    first_entry: int
    last_entry: int

    def to_dict(self) -> dict[str, Any]:
        return {"path": self.path, "size": self.size, "sha256": self.sha256, "rows": self.rows,
                "first_entry": self.first_entry, "last_entry": self.last_entry}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "OffloadFile":
        return cls(str(d["path"]), int(d["size"]), str(d["sha256"]), int(d["rows"]),
                   int(d["first_entry"]), int(d["last_entry"]))


@dataclass(frozen=True)
class SegmentOffload:
    location: str                      # URI of the offload root
    directory: str                     # the log's dataset directory under it
    files: tuple[OffloadFile, ...]
    first_entry: int
    last_entry: int
    rows: int                          # table rows (entries, for a raw log)
    digest: str                        # SHA-256 of the per-entry digests
    state: str = STATE_OFFLOADED
    committed_us: int = -1             # wall-clock time of the commit, µs

    def to_dict(self) -> dict[str, Any]:
        return {"location": self.location, "directory": self.directory,
                "files": [f.to_dict() for f in self.files], "first_entry": self.first_entry,
                "last_entry": self.last_entry, "rows": self.rows, "digest": self.digest,
                "state": self.state, "committed_us": self.committed_us}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "SegmentOffload":
        try:
            state = str(d.get("state", STATE_OFFLOADED))
            if state not in STATES:
                raise ValueError(f"unknown offload state {state!r}")
            return cls(str(d["location"]), str(d["directory"]),
                       tuple(OffloadFile.from_dict(f) for f in d["files"]),
                       int(d["first_entry"]), int(d["last_entry"]), int(d["rows"]),
                       str(d["digest"]), state, int(d.get("committed_us", -1)))
        except (KeyError, TypeError, ValueError) as exc:
            raise errors.MetadataError(f"corrupt offload record: {exc}") from None

    @property
    def size(self) -> int:
        return sum(f.size for f in self.files)
