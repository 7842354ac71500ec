"""What a journal submission carries: its records, and what it applies once durable.

A ``Submission`` (``journal.Journal.submit`` / ``claim``) carries the records
it writes (``journal_format``: the file format) and one of these values, which
the bookie applies on the journal thread after the group's fdatasync
(``Bookie._on_durable``): an add's batch (or a lone add's entry record)
goes into the entry store, a GC
delete drops the ledger, an explicit LAC advances the ledger's LAC.  A
submission without one (keys, fences) applies nothing beyond the in-memory
decision already taken.

These and a ``Submission`` are built once per add, on the add path:
slotted classes, not frozen dataclasses, whose ``__init__`` costs about
three times as much.  Nothing changes a payload after construction.
"""
from __future__ import annotations

from concurrent.futures import Future
from dataclasses import dataclass
from typing import Optional, Union

import pyarrow as pa

from bookie_server.journal.journal_crc import Body
from bookie_server.journal.journal_format import Position
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


class Submission:
    """Records the journal writes as one unit, in order, and what they
    apply once durable.  ``future`` completes once they are durable; it is
    None for a submission its submitter leads inline (``Journal.lead_now``),
    which learns the outcome from ``error``.  The write sets ``seq`` and
    ``body_at``: the file and offset of the last record's body, so the
    store can keep pointing at the bytes (journal-resident batches).

    Hand-written slots: every add makes one, and a slotted dataclass with
    defaults costs about 1.7 times as much to build."""
    __slots__ = ("records", "payload", "future", "nbytes", "error", "seq", "body_at")

    def __init__(self, records: list[tuple[int, Body]], payload: Optional[JournalRecord],
                 future: Optional[Future[Position]], nbytes: int) -> None:
        self.records = records
        self.payload = payload
        self.future = future
        self.nbytes = nbytes
        self.error: Optional[str] = None     # why it failed (a ``lead_now`` submission)
        self.seq = -1                        # set by the write (JournalFile.write_group)
        self.body_at = -1
