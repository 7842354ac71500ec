"""A bookie's own damage handling, in process: journal damage found by
replay, stored batches found damaged by the scrubber, the lost set's
persistence, reads of lost ids, and the marker's publication."""
from __future__ import annotations

import logging
import os

import numpy as np
import pytest

from bookie_server.storage import damage
from bookie_server.bookie import Bookie
from bookie_server.config import BookieConfig
from bookie_server.journal.journal import HEADER, file_name
from bookie_server.journal.journal_replay import replay
from bookie_server.journal.journal import Position
from bookie_server.storage.scrubber import Scrubber, check_batch
from pybk_spark import errors
from pybk_spark.wire.digest import Digester
from pybk_spark.metadata.memory_store import MemoryMetadataStore
from pybk_spark.protocol.ledger_metadata import master_key
from pybk_spark.wire.entries import batch_from_bytes, batch_to_bytes, cumulative_lengths, make_batch

KEY = master_key(b"pw")


def _entries(ledger_id: int, ids, size: int = 200) -> bytes:
    payloads = [bytes([e % 251]) * size for e in ids]
    lengths = cumulative_lengths(0, payloads)
    digs = Digester("crc32c", b"pw").compute(ledger_id, ids, [-1] * len(ids), lengths, payloads)
    return batch_to_bytes(make_batch(ledger_id, list(ids), [-1] * len(ids), lengths, payloads,
                                     digs))


def _cfg(tmp_path) -> BookieConfig:
    return BookieConfig(data_dir=str(tmp_path), flush_interval_s=3600)


def _interleaved(b: Bookie) -> None:
    for e in range(10):
        b.add(1, KEY, _entries(1, [e]))
        b.add(2, KEY, _entries(2, [e]))
    b.add(3, KEY, _entries(3, [0]))


def _frame_of(jdir: str, ledger_id: int, entry_id: int) -> tuple[str, int]:
    """(journal file path, offset of the frame) of the add holding an entry."""
    for pos, rtype, body in replay(jdir, Position(0, 0)):
        if rtype == 1:
            batch = batch_from_bytes(body)
            if (batch.column(0)[0].as_py() == ledger_id
                    and entry_id in batch.column(1).to_pylist()):
                return (os.path.join(jdir, file_name(pos.seq)),
                        pos.offset - len(body) - HEADER.size)
    raise AssertionError("not found")


def _flip(path: str, offset: int, nbytes: int = 4) -> None:
    with open(path, "r+b") as fh:
        fh.seek(offset)
        old = fh.read(nbytes)
        fh.seek(offset)
        fh.write(bytes(x ^ 0xA5 for x in old))


def _crash_and_damage(tmp_path, ledger_id: int, entry_id: int) -> None:
    b = Bookie(_cfg(tmp_path)).open(background=False)
    _interleaved(b)
    b.journal.close()                     # a crash: no checkpoint, the journal is replayed
    path, off = _frame_of(b.journal.dir, ledger_id, entry_id)
    _flip(path, off + HEADER.size + 40)


def test_replay_damage_reports_the_lost_range_and_reads_do_not_say_no_entry(tmp_path, caplog):
    _crash_and_damage(tmp_path, 1, 5)
    with caplog.at_level(logging.ERROR):
        b = Bookie(_cfg(tmp_path)).open(background=False)
    try:
        assert b.lost.ranges() == [(1, 5, 5)] and b.lost.unattributed
        assert "event=entries_missing ledger=1 first=5 last=5" in caplog.text
        assert "event=journal_damage" in caplog.text
        with pytest.raises(errors.BookieIOError):
            b.read(1, 5, 5)
        assert b.read(1, 6, 9).batch.num_rows == 4          # every record after the damage
        assert b.read(2, 0, 9).batch.num_rows == 10
        assert b.read(1, 0, 9).end == "MISSING"
        with pytest.raises(errors.BookieIOError):           # unattributed: not authoritative
            b.read(99, 0, 0)
        with pytest.raises(errors.BookieIOError):           # ... nor about any ledger's tail
            b.read(2, 10, 10)
        # the auditor's recovery add puts it back
        b.add(1, KEY, _entries(1, [5]), recovery=True)
        assert b.read(1, 5, 5).batch.num_rows == 1
        b.checkpoint()
    finally:
        b.close(checkpoint=False)
    b = Bookie(_cfg(tmp_path)).open(background=False)      # the lost set survives restarts
    try:
        assert b.lost.ranges() == [(1, 5, 5)] and b.lost.unattributed
        assert b.replayed_records == 0
        store = MemoryMetadataStore()
        b.lost.sync_marker(store, "me")
        store.delete(damage.marker_key("me"))               # the auditor repaired everything
        b.lost.sync_marker(store, "me")
        assert not b.lost
        with pytest.raises(errors.NoSuchEntry):             # authoritative again
            b.read(2, 10, 10)
        with pytest.raises(errors.NoSuchLedger):
            b.read(99, 0, 0)
    finally:
        b.close()


def test_damaged_tail_of_a_ledger_is_an_open_range(tmp_path):
    _crash_and_damage(tmp_path, 2, 9)                      # ledger 3's add follows it
    b = Bookie(_cfg(tmp_path)).open(background=False)
    try:
        assert b.lost.ranges() == [(1, 10, damage.OPEN), (2, 9, damage.OPEN)]
        with pytest.raises(errors.BookieIOError):
            b.read(2, 9, 9)
        assert b.read(3, 0, 0).batch.num_rows == 1
    finally:
        b.close()


def test_marker_publication_and_adoption():
    store = MemoryMetadataStore()
    lost = damage.LostSet([(1, 5, 5)], unattributed=True)
    lost.sync_marker(store, "b1")
    raw = store.get(damage.marker_key("b1"))
    assert damage.parse_marker(raw.value) == ([(1, 5, 5)], True)
    lost.add([(2, 0, 3)])                                   # new damage merges by CAS
    lost.sync_marker(store, "b1")
    assert damage.parse_marker(store.get(damage.marker_key("b1")).value)[0] == \
        [(1, 5, 5), (2, 0, 3)]
    cur = store.get(damage.marker_key("b1"))                # the auditor repaired ledger 1
    store.compare_and_swap(damage.marker_key("b1"),
                           damage.marker_value([(2, 0, 3)], False), cur.version)
    lost.sync_marker(store, "b1")
    assert lost.ranges() == [(2, 0, 3)] and not lost.unattributed
    store.delete(damage.marker_key("b1"))
    lost.sync_marker(store, "b1")
    assert not lost


def test_merge_and_gaps():
    assert damage.merge([(1, 5, 9), (1, 0, 4), (1, 20, -1), (1, 30, 40), (2, 1, 1)]) == \
        [(1, 0, 9), (1, 20, -1), (2, 1, 1)]
    starts, ends = np.array([0, 10, 20]), np.array([4, 14, 24])
    assert damage.gaps_in(starts, ends, 3, 22) == [(5, 9), (15, 19)]
    assert damage.gaps_in(starts, ends, 25, 27) == [(25, 27)]


def test_scrubber_finds_a_damaged_segment_batch_and_keeps_its_intact_rows(tmp_path, caplog):
    b = Bookie(_cfg(tmp_path)).open(background=False)
    try:
        b.add(1, KEY, _entries(1, range(0, 50)))
        b.add(1, KEY, _entries(1, range(50, 60)))
        b.checkpoint()
        refs = b.store.flushed_refs()
        assert refs
        _ref_id, ref, path = refs[0]
        data = open(path, "rb").read()[ref.offset:ref.offset + ref.length]
        batch, ok = check_batch(data, 1, KEY)
        assert ok.all()
        # one payload byte of entry 7 flipped (payloads are bytes([e]) * 200)
        where = data.find(bytes([7]) * 200)
        assert where > 0
        _flip(path, ref.offset + where + 100, 1)
        now = [0.0]
        waits = []
        scrub = Scrubber(b, 1.0, 1000, clock=lambda: now[0],
                         wait=lambda s: (waits.append(s), now.__setitem__(0, now[0] + s))[1] and False)
        with caplog.at_level(logging.ERROR):
            report = scrub.scrub_once()
        assert report.damaged == 1
        assert "event=scrub_damage" in caplog.text
        assert "event=entries_missing ledger=1 first=7 last=7" in caplog.text
        assert b.lost.ranges() == [(1, 7, 7)]
        with pytest.raises(errors.BookieIOError):
            b.read(1, 7, 7)
        got = b.read(1, 0, 59, sparse=True).batch.column(1).to_pylist()
        assert got == [e for e in range(60) if e != 7]
        assert abs(sum(waits) - report.bytes / 1000) < 1e-6      # the rate limit, by the clock
        b.checkpoint()                                            # intact rows: re-stored
        assert Scrubber(b, 1.0, 1e12).scrub_once().damaged == 0
    finally:
        b.close()
