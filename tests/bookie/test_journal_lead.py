"""The journal's inline leader path for a lone add (``Journal.claim`` /
``lead_now``, ``JournalFile.write_one``, ``SyncStage.sync_one``): the record
is written whole even when ``pwritev`` writes it short, the submission is
answered through its ``applied`` hook right after it is applied, on the
leading thread, and an answer that fails never poisons the journal."""
from __future__ import annotations

import os
import threading

from bookie_server.journal.journal import Journal, Position, RecordType
from bookie_server.journal.journal_replay import replay
from bookie_server.journal.records import EntryRecord, Submission
from pybk_spark.wire.entries import entry_record_head


def _record(entry_id: int, size: int = 1024) -> bytes:
    return entry_record_head(7, entry_id, entry_id - 1, size, b"\0\0\0\0") + os.urandom(size)


def _entry(entry_id: int, on_applied=None) -> EntryRecord:
    rec = _record(entry_id)
    return EntryRecord([(RecordType.ADD_ENTRY, rec)], 7, entry_id, entry_id - 1, rec, on_applied)


class _ShortWrites:
    """The pwritev seam writing at most ``limit`` bytes per call, as a
    kernel may."""

    def __init__(self, limit: int):
        self.limit = limit
        self.short = 0

    def __call__(self, fd, pieces, offset):
        data = b"".join(bytes(p) for p in pieces)
        if len(data) > self.limit:
            self.short += 1
            data = data[:self.limit]
        return os.pwrite(fd, data, offset)


def test_a_short_write_on_the_lead_path_and_the_group_path_is_finished(tmp_path):
    writes = _ShortWrites(100)
    j = Journal(str(tmp_path), pwritev=writes)
    j.start(lambda group, pos: None)
    led = _entry(0)
    assert j.claim(led)
    j.lead_now(led)
    queued = [(RecordType.ADD_ENTRY, _record(1)), (RecordType.ADD_ENTRY, _record(2))]
    j.write(queued).result(10)
    j.close()
    assert writes.short >= 2
    bodies = [bytes(b) for _p, t, b in replay(str(tmp_path), Position(0, 0))
              if t == RecordType.ADD_ENTRY]
    assert bodies == [led.record, queued[0][1], queued[1][1]]


def test_a_led_add_is_answered_on_its_thread_right_after_it_is_applied(tmp_path):
    events: list[tuple[str, object]] = []
    j = Journal(str(tmp_path))
    j.start(lambda group, pos: events.append(("applied", [s.entry_id for s in group])))
    sub = _entry(0, lambda ledger_id, entry_id: events.append(
        ("answered", (ledger_id, entry_id, threading.current_thread().name))))
    assert j.claim(sub)
    position = j.lead_now(sub)
    j.close()
    assert events == [("applied", [0]),
                      ("answered", (7, 0, threading.current_thread().name))]
    assert position == Position(j.file.seq, j.file.offset)


def test_a_queued_add_is_answered_by_its_future_and_never_by_its_hook(tmp_path):
    answered = []
    j = Journal(str(tmp_path))
    j.start(lambda group, pos: None)
    sub = _entry(0, lambda ledger_id, entry_id: answered.append(entry_id))
    j.enqueue(sub).result(10)
    j.close()
    assert answered == []


def test_an_answer_that_raises_leaves_the_journal_working(tmp_path, caplog):
    def broken(ledger_id: int, entry_id: int) -> None:
        raise RuntimeError("the client's socket went away")

    j = Journal(str(tmp_path))
    j.start(lambda group, pos: None)
    sub = _entry(0, broken)
    assert j.claim(sub)
    j.lead_now(sub)                                  # durable: no error for the add
    assert j.failed is None
    assert "event=journal_applied_callback_error" in caplog.text
    after = Submission([(RecordType.ADD_ENTRY, _record(1))])
    assert j.claim(after)
    j.lead_now(after)
    j.close()
    assert j.failed is None
