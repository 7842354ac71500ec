"""What a journal submission applies once it is durable.

A submission (``journal.Journal.submit``) carries the framed records it
writes (``journal_format``: the file format) and one of these values, which
the bookie applies on the journal thread after the group's fdatasync
(``Bookie._on_durable``): an add's batch (or a lone add's entry record)
goes into the entry store, a GC
delete drops the ledger, an explicit LAC advances the ledger's LAC.  A
submission without one (keys, fences) applies nothing beyond the in-memory
decision already taken.

These are built once per add, on the add path: slotted dataclasses, not
frozen ones, whose ``__init__`` costs about three times as much; nothing
changes them after construction.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Union

import pyarrow as pa

from pybk_spark.wire.entries import Record


@dataclass(slots=True)
class AddRecord:
    """An ADD_BATCH record (the submission's last record): its validated
    batch and the bytes as received."""
    ledger_id: int
    batch: pa.RecordBatch
    raw: bytes


@dataclass(slots=True)
class EntryRecord:
    """An ADD_ENTRY record (a lone add): the entry record as received."""
    ledger_id: int
    entry_id: int
    lac: int
    record: Record


@dataclass(slots=True)
class DeleteRecord:
    """A LEDGER_DELETED record written by GC."""
    ledger_id: int


@dataclass(slots=True)
class LacRecord:
    """An EXPLICIT_LAC record."""
    ledger_id: int
    lac: int


JournalRecord = Union[AddRecord, EntryRecord, DeleteRecord, LacRecord]
