"""Journal replay resynchronisation on crafted journal files (no processes)."""
from __future__ import annotations

import logging
import os
import random

from bookie_server.journal import journal_replay
from bookie_server.journal.journal import LEDGER, Position, RecordType, file_name, frame
from bookie_server.journal.journal_replay import Damage, find_next_frame, replay


def _records(n: int, seed: int = 1, size: tuple[int, int] = (8, 3000)) -> list[tuple[int, bytes]]:
    rnd = random.Random(seed)
    out = []
    for i in range(n):
        body = LEDGER.pack(i) + rnd.randbytes(rnd.randint(size[0], size[1]))
        out.append((RecordType.ADD_BATCH if i % 3 else RecordType.MASTER_KEY, body))
    return out


def _write(tmp_path, records, seq: int = 1, tail: bytes = b"") -> tuple[str, list[int]]:
    """Write a journal file; returns (path, offset of each record's frame)."""
    path = os.path.join(str(tmp_path), file_name(seq))
    offsets = []
    with open(path, "wb") as fh:
        for rtype, body in records:
            offsets.append(fh.tell())
            for part in frame(rtype, body):
                fh.write(part)
        fh.write(tail)
    return path, offsets


def _flip(path: str, offset: int, nbytes: int = 4) -> None:
    with open(path, "r+b") as fh:
        fh.seek(offset)
        old = fh.read(nbytes)
        fh.seek(offset)
        fh.write(bytes(b ^ 0x5A for b in old))


def _replay(tmp_path):
    damages: list[Damage] = []
    bodies = [body for _p, _t, body in replay(str(tmp_path), Position(0, 0), damages.append)]
    return bodies, damages


def test_damage_in_the_middle_keeps_every_later_record(tmp_path, caplog):
    recs = _records(40)
    path, offs = _write(tmp_path, recs)
    size = os.path.getsize(path)
    _flip(path, offs[10] + 20)                      # inside record 10's body
    with caplog.at_level(logging.ERROR, "bookie.journal"):
        bodies, damages = _replay(tmp_path)
    assert bodies == [b for _t, b in recs[:10] + recs[11:]]
    assert damages == [Damage(file_name(1), offs[10], offs[11] - offs[10])]
    assert os.path.getsize(path) == size            # nothing truncated
    assert f"event=journal_damage file={file_name(1)} offset={offs[10]}" in caplog.text
    # a second replay finds the same (the damaged bytes stay; the checkpoint moves past them)
    assert _replay(tmp_path)[0] == bodies


def test_damaged_header_and_several_damaged_records(tmp_path):
    recs = _records(60, seed=2)
    path, offs = _write(tmp_path, recs)
    _flip(path, offs[5], 9)                          # a whole header
    _flip(path, offs[20] + 100)                      # two adjacent records
    _flip(path, offs[21] + 9)
    _flip(path, offs[40] + 3)                        # the length field
    bodies, damages = _replay(tmp_path)
    lost = {5, 20, 21, 40}
    assert bodies == [b for i, (_t, b) in enumerate(recs) if i not in lost]
    assert [d.offset for d in damages] == [offs[5], offs[20], offs[40]]
    assert damages[1].nbytes == offs[22] - offs[20]


def test_intact_record_between_two_damaged_ones_is_kept(tmp_path):
    recs = _records(12, seed=3)
    path, offs = _write(tmp_path, recs)
    _flip(path, offs[4] + 30)
    _flip(path, offs[6] + 30)                        # record 5 is intact, its successor is not
    bodies, damages = _replay(tmp_path)
    assert bodies == [b for i, (_t, b) in enumerate(recs) if i not in (4, 6)]
    assert len(damages) == 2


def test_torn_tail_is_truncated(tmp_path):
    recs = _records(20, seed=4)
    path, offs = _write(tmp_path, recs)
    with open(path, "r+b") as fh:                    # a crash mid-write: last record cut short
        fh.truncate(offs[19] + 50)
    bodies, damages = _replay(tmp_path)
    assert bodies == [b for _t, b in recs[:19]]
    assert damages == []
    assert os.path.getsize(path) == offs[19]


def test_damaged_last_record_is_a_tail(tmp_path):
    recs = _records(20, seed=5)
    path, offs = _write(tmp_path, recs)
    _flip(path, offs[19] + 40)
    bodies, damages = _replay(tmp_path)
    assert bodies == [b for _t, b in recs[:19]] and damages == []
    assert os.path.getsize(path) == offs[19]


def test_preallocated_zeros_are_not_damage(tmp_path, caplog):
    recs = _records(10, seed=6)
    path, offs = _write(tmp_path, recs, tail=bytes(1 << 20))
    with caplog.at_level(logging.WARNING, "bookie.journal"):
        bodies, damages = _replay(tmp_path)
    assert bodies == [b for _t, b in recs] and damages == []
    assert "journal_tail_truncated" not in caplog.text
    assert os.path.getsize(path) == offs[-1] + 9 + len(recs[-1][1])


def test_zeroed_block_in_the_middle_is_damage(tmp_path):
    recs = _records(30, seed=7)
    path, offs = _write(tmp_path, recs)
    with open(path, "r+b") as fh:                    # a lost sector reads back as zeros
        fh.seek(offs[8])
        fh.write(bytes(offs[9] + 17 - offs[8]))
    bodies, damages = _replay(tmp_path)
    assert bodies == [b for i, (_t, b) in enumerate(recs) if i not in (8, 9)]
    assert damages[0].offset == offs[8] and damages[0].nbytes == offs[10] - offs[8]


def test_damage_then_torn_tail(tmp_path):
    recs = _records(15, seed=8)
    path, offs = _write(tmp_path, recs, tail=b"\x01\x02garbage-torn")
    _flip(path, offs[3] + 12)
    bodies, damages = _replay(tmp_path)
    assert bodies == [b for i, (_t, b) in enumerate(recs) if i != 3]
    assert len(damages) == 1
    assert os.path.getsize(path) == offs[-1] + 9 + len(recs[-1][1])


def test_scan_over_random_bytes_finds_no_frame(tmp_path):
    data = random.Random(9).randbytes(4 << 20)
    assert find_next_frame(data, 0) is None


def test_scan_cost_is_bounded(tmp_path, monkeypatch):
    """Random bytes mostly read as huge lengths: the unchained candidates'
    CRC work stays within the budget."""
    seen = []
    real = journal_replay._read_frame
    monkeypatch.setattr(journal_replay, "_read_frame",
                        lambda data, pos, size: seen.append(pos) or real(data, pos, size))
    data = random.Random(10).randbytes(8 << 20)
    assert find_next_frame(data, 0) is None
    assert len(seen) < 100_000
