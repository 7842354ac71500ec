"""What a journal submission carries: its records, and what it applies once durable.

A ``Submission`` (``journal.Journal.submit`` / ``enqueue`` / ``claim``)
carries the records it writes (``journal_format``: the file format) and one
of these values, which the bookie applies on the journal thread after the
group's fdatasync (``Bookie._on_durable``): an add's batch goes into the
entry store, a GC delete drops the ledger, an explicit LAC advances the
ledger's LAC.  A submission without one (keys, fences) applies nothing
beyond the in-memory decision already taken.  A lone add is an
``EntryRecord``: the submission itself carries the entry it applies.

These are built once per add, on the add path: slotted classes, not frozen
dataclasses, whose ``__init__`` costs about three times as much.  Nothing
changes a payload after construction.
"""
from __future__ import annotations

from concurrent.futures import Future
from dataclasses import dataclass
from typing import Callable, Optional, Union

import pyarrow as pa

from bookie_server.journal.direct_write import StagedRecord
from bookie_server.journal.journal_crc import Body
from bookie_server.journal.journal_format import HEADER, Position
from pybk_spark.wire.entries import Record


@dataclass(slots=True)
class AddRecord:
    """An ADD_BATCH record (the submission's last record): its validated
    batch and the bytes as received; ``cold``: the store reads it back from
    the journal instead of keeping it in memory (a recovery add's copy)."""
    ledger_id: int
    batch: pa.RecordBatch
    raw: bytes
    cold: bool = False


@dataclass(slots=True)
class DeleteRecord:
    """A LEDGER_DELETED record written by GC."""
    ledger_id: int


@dataclass(slots=True)
class LacRecord:
    """An EXPLICIT_LAC record."""
    ledger_id: int
    lac: int


JournalRecord = Union[AddRecord, DeleteRecord, LacRecord]


class Submission:
    """Records the journal writes as one unit, in order, and what they
    apply once durable (``payload``).  ``future`` completes once they are
    durable; it is None for a submission its submitter leads inline
    (``Journal.lead_now``), which learns the outcome from ``error``.  The
    write sets ``seq`` and ``body_at``: the file and offset of the last
    record's body, so the store can keep pointing at the bytes
    (journal-resident batches).

    Hand-written slots: every add makes one, and a slotted dataclass with
    defaults costs about 1.7 times as much to build."""
    __slots__ = ("records", "payload", "future", "nbytes", "error", "seq", "body_at")
    seq: int            # set by the write (JournalFile.write_group), read after it
    body_at: int

    def __init__(self, records: list[tuple[int, Body]],
                 payload: Optional[JournalRecord] = None) -> None:
        self.records = records
        self.payload = payload
        self.future: Optional[Future[Position]] = None
        if len(records) == 1:               # every add of a ledger after its first
            self.nbytes = HEADER.size + len(records[0][1])
        else:
            self.nbytes = sum(HEADER.size + len(body) for _, body in records)
        self.error: Optional[str] = None     # why it failed (a ``lead_now`` submission)

    def applied(self) -> None:
        """Called once the submission is durable and applied, when it has
        no future (its submitter leads it inline: ``Journal.lead_now``);
        nothing to do for most."""


class StagedSubmission(Submission):
    """A submission whose last record its submitter framed ahead for a
    direct write (``direct_write.stage_record``): the writer writes
    ``staged`` in that record's place.  ``nbytes`` counts the staged
    frames, closing PAD included.  The write lets go of ``staged`` (its
    buffer goes back to its pool)."""
    __slots__ = ("staged",)

    def __init__(self, records: list[tuple[int, Body]], payload: Optional[JournalRecord],
                 staged: StagedRecord) -> None:
        Submission.__init__(self, records, payload)
        self.staged: Optional[StagedRecord] = staged
        self.nbytes += len(staged.view) - HEADER.size - len(records[-1][1])


class EntryRecord(Submission):
    """A lone add, its own submission: its records (an ADD_ENTRY record,
    after the key records of a ledger's first add) and the entry record as
    received, which it applies once durable.  One object per lone add
    where a payload and a submission would be two.  ``Submission.__init__``
    is the one home of the shared fields; calling it costs a lone add about
    0.1 us warm.

    ``on_applied(ledger id, entry id)``: for an add its submitter leads
    inline, called on the leading thread as soon as the entry is durable
    and applied, before the journal's bookkeeping (metrics, page-cache
    advice, giving the file back), so the answer leaves first."""
    __slots__ = ("ledger_id", "entry_id", "lac", "record", "on_applied")

    def __init__(self, records: list[tuple[int, Body]], ledger_id: int, entry_id: int,
                 lac: int, record: Record,
                 on_applied: Optional[Callable[[int, int], None]] = None) -> None:
        Submission.__init__(self, records)
        self.ledger_id = ledger_id
        self.entry_id = entry_id
        self.lac = lac
        self.record = record
        self.on_applied = on_applied

    def applied(self) -> None:
        if self.on_applied is not None:
            self.on_applied(self.ledger_id, self.entry_id)
