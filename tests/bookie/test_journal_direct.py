"""The journal's O_DIRECT path (bookie_server/journal/direct_write.py): big
groups are written aligned, from the staging buffer, on the direct
descriptor; PAD records fill the gaps; replay, the bookie's restart and the
fault seams see the same journal as with buffered writes."""
from __future__ import annotations

import logging
import os

import pytest

from bookie_server.config import BookieConfig
from bookie_server.journal.direct_write import ALIGN, PAD_MIN, pad_before
from bookie_server.journal.journal import Journal, Position, RecordType
from bookie_server.journal.journal_replay import replay
from pybk_spark import errors


def test_pad_before_reaches_an_aligned_offset_with_room_for_a_frame():
    assert pad_before(0) == 0 and pad_before(ALIGN) == 0 and pad_before(3 * ALIGN) == 0
    assert pad_before(1) == ALIGN - 1
    assert pad_before(ALIGN - PAD_MIN) == PAD_MIN
    assert pad_before(ALIGN - PAD_MIN + 1) == PAD_MIN - 1 + ALIGN     # too small for a frame
    assert pad_before(ALIGN - 1) == 1 + ALIGN
    for off in range(0, 3 * ALIGN, 97):
        gap = pad_before(off)
        assert (off + gap) % ALIGN == 0 and (gap == 0 or gap >= PAD_MIN)


class _Writes:
    """The journal's pwritev seam, recording (fd, offset, bytes) of each call."""

    def __init__(self):
        self.calls: list[tuple[int, int, int]] = []
        self.fail_on_direct = False
        self.direct_errno = 5            # EIO: a failing device
        self.journal: Journal | None = None

    def __call__(self, fd, pieces, offset):
        if self.fail_on_direct and self.journal is not None and fd == self.journal.file.direct.fd:
            raise OSError(self.direct_errno, f"{os.strerror(self.direct_errno)} (injected)")
        n = os.pwritev(fd, pieces, offset)
        self.calls.append((fd, offset, n))
        return n


def _direct_journal(path: str, writes: _Writes, **kw) -> Journal:
    j = Journal(path, direct_min_bytes=8192, pwritev=writes, **kw)
    writes.journal = j
    return j


def _need_direct(j: Journal) -> None:
    if j.file.direct.fd < 0:
        pytest.skip(f"the file system of {j.dir} refuses O_DIRECT: the direct path is not testable here")


@pytest.mark.parametrize("prealloc", [0, 1 << 16])
def test_big_groups_are_written_aligned_on_the_direct_descriptor_and_replay(tmp_path, prealloc):
    writes = _Writes()
    j = _direct_journal(str(tmp_path), writes, prealloc_bytes=prealloc, lead_max_bytes=-1)
    durable = []
    j.start(lambda group, pos: durable.extend(group))
    _need_direct(j)
    bodies = [(RecordType.FENCE, (1).to_bytes(8, "little")),               # unaligned end
              (RecordType.ADD_BATCH, os.urandom(20_000)),                  # direct
              (RecordType.ADD_BATCH, os.urandom(100)),                     # buffered
              (RecordType.ADD_BATCH, os.urandom(3 * ALIGN - 9)),           # direct, exact fit
              (RecordType.ADD_BATCH, os.urandom(300_000))]                 # direct, past prealloc
    positions = [j.submit([rec]).result(10) for rec in bodies]
    direct_fd = j.file.direct.fd
    j.close()

    direct_writes = [(off, n) for fd, off, n in writes.calls if fd == direct_fd]
    assert len(direct_writes) == 3
    assert all(off % ALIGN == 0 and n % ALIGN == 0 for off, n in direct_writes)
    assert positions[1].offset % ALIGN == 0 and positions[3].offset % ALIGN == 0
    assert positions[4].offset % ALIGN == 0
    # every record is where the journal said it wrote it
    data = open(j.path_of(positions[0].seq), "rb").read()
    for sub in durable:
        at = sub.body_at
        assert sub.seq == positions[0].seq
        body = sub.records[0][1]
        assert data[at:at + len(body)] == body
    got = list(replay(str(tmp_path), Position(0, 0)))
    assert [(t, b) for _p, t, b in got if t != RecordType.PAD] == bodies
    pads = [b for _p, t, b in got if t == RecordType.PAD]
    assert pads and all(not any(b) for b in pads)


def test_a_record_staged_ahead_is_its_frame_and_a_pad_in_aligned_blocks():
    """``stage_record``: header, body and a closing PAD, a whole number of
    ALIGN blocks from a page boundary; the body's own CRC, where given,
    makes the same header as hashing the body."""
    import ctypes

    import google_crc32c

    from bookie_server.journal.direct_write import stage_record
    from bookie_server.journal.journal_format import HEADER, frame
    for n in (8, 4096 - 9, 4096 - 9 - PAD_MIN + 1, 100_000, 3 << 20):
        body = os.urandom(n)
        staged = stage_record(RecordType.ADD_BATCH, body)
        view = staged.view
        assert len(view) % ALIGN == 0
        assert ctypes.addressof(ctypes.c_char.from_buffer(view)) % ALIGN == 0
        framed = b"".join(frame(RecordType.ADD_BATCH, body))
        assert bytes(view[:len(framed)]) == framed
        pad = pad_before(len(framed))
        assert len(view) == len(framed) + pad
        if pad:                   # a valid PAD frame of zeros closes it
            ptype = bytes(view[len(framed) + HEADER.size - 1:len(framed) + HEADER.size])
            assert ptype == bytes([RecordType.PAD])
        again = stage_record(RecordType.ADD_BATCH, body, google_crc32c.value(body))
        assert bytes(again.view) == bytes(view)


def test_staged_records_are_written_from_their_buffers_and_replay(tmp_path):
    """A group of staged records only goes out as their own buffers, with
    no staging copy; a group with any other record copies them like the
    rest.  Either way every record is where the journal says, and replays."""
    from bookie_server.journal.direct_write import DirectWriter
    writes = _Writes()
    j = _direct_journal(str(tmp_path), writes, prealloc_bytes=0, lead_max_bytes=-1)
    durable = []
    j.start(lambda group, pos: durable.extend(group))
    _need_direct(j)
    staged_calls = []
    stage = DirectWriter.stage

    def counting_stage(self, pieces, offset):
        staged_calls.append(len(pieces))
        return stage(self, pieces, offset)
    j.file.direct.stage = counting_stage.__get__(j.file.direct)
    key = (RecordType.MASTER_KEY, (5).to_bytes(8, "little") + b"k" * 20)
    bodies = [os.urandom(n) for n in (20_000, 3 * ALIGN - 9, 300_001, 50_000)]
    futures = []
    for i, body in enumerate(bodies):
        records = ([key] if i == 2 else []) + [(RecordType.ADD_BATCH, body)]
        staged = j.stage_ahead(RecordType.ADD_BATCH, body)
        assert staged is not None
        futures.append(j.submit(records, staged=staged))
    positions = [f.result(10) for f in futures]
    j.submit([(RecordType.FENCE, (1).to_bytes(8, "little"))]).result(10)    # buffered
    j.close()
    assert len(staged_calls) == 1, "only the group with a key record is copied"
    assert all(p.offset % ALIGN == 0 for p in positions)
    data = open(j.path_of(positions[0].seq), "rb").read()
    for sub in durable:
        body = sub.records[-1][1]
        assert data[sub.body_at:sub.body_at + len(body)] == body
        assert getattr(sub, "staged", None) is None, "the buffer goes back once written"
    got = [(t, b) for _p, t, b in replay(str(tmp_path), Position(0, 0)) if t != RecordType.PAD]
    want = []
    for i, body in enumerate(bodies):
        want += ([key] if i == 2 else []) + [(RecordType.ADD_BATCH, body)]
    assert got == want + [(RecordType.FENCE, (1).to_bytes(8, "little"))]


def test_a_body_received_into_a_record_space_is_framed_where_it_lies(tmp_path):
    """A pull's answer lands in a ``RecordSpace``: ``stage_ahead`` frames it
    there (the staged record is the space's own memory, no copy) into the
    same bytes ``stage_record`` makes, and it replays like any record."""
    from bookie_server.journal.direct_write import RecordSpace, stage_record
    import pyarrow as pa
    j = _direct_journal(str(tmp_path), _Writes(), prealloc_bytes=0, lead_max_bytes=-1)
    durable = []
    j.start(lambda group, pos: durable.extend(group))
    _need_direct(j)
    body = os.urandom(300_001)
    space = RecordSpace(len(body))
    space.body_view()[:] = body
    data = space.body()
    assert space.holds(data) and not space.holds(pa.py_buffer(body))
    staged = j.stage_ahead(RecordType.ADD_BATCH, data, space=space)
    assert staged is not None and staged.owner is space.buffer, "framed in place"
    assert bytes(staged.view) == bytes(stage_record(RecordType.ADD_BATCH, body).view)
    other = j.stage_ahead(RecordType.ADD_BATCH, body, space=space)     # not its body: copied
    assert other is not None and other.owner is not space.buffer
    pos = j.submit([(RecordType.ADD_BATCH, data)], staged=staged).result(10)
    j.close()
    assert pos.offset % ALIGN == 0
    got = [(t, bytes(b)) for _p, t, b in replay(str(tmp_path), Position(0, 0))
           if t != RecordType.PAD]
    assert got == [(RecordType.ADD_BATCH, body)]


def test_a_small_record_is_not_staged(tmp_path):
    j = _direct_journal(str(tmp_path), _Writes())
    j.start(lambda group, pos: None)
    _need_direct(j)
    assert j.stage_ahead(RecordType.ADD_BATCH, os.urandom(100)) is None
    assert j.stage_ahead(RecordType.ADD_BATCH, os.urandom(10_000)) is not None
    j.close()


def test_a_failed_direct_write_poisons_the_journal(tmp_path):
    writes = _Writes()
    j = _direct_journal(str(tmp_path), writes, prealloc_bytes=0)
    j.start(lambda group, pos: None)
    _need_direct(j)
    assert j.submit([(RecordType.FENCE, b"\0" * 8)]).result(10)
    writes.fail_on_direct = True
    with pytest.raises(errors.BookieIOError):
        j.submit([(RecordType.ADD_BATCH, os.urandom(50_000))]).result(10)
    assert j.failed is not None
    with pytest.raises(errors.BookieIOError):
        j.submit([(RecordType.FENCE, b"\0" * 8)]).result(10)
    j.close()
    got = [t for _p, t, _b in replay(str(tmp_path), Position(0, 0)) if t != RecordType.PAD]
    assert got == [RecordType.FENCE], "only the acknowledged record"


def test_a_direct_write_refused_with_einval_is_written_buffered_and_nothing_is_lost(
        tmp_path, caplog):
    """A file system that opens O_DIRECT but refuses the write (it needs a
    larger alignment): the group goes out buffered at the same offsets, is
    acknowledged, and the journal stays buffered, across a roll too."""
    import errno
    writes = _Writes()
    j = _direct_journal(str(tmp_path), writes, prealloc_bytes=0, max_file_bytes=200_000)
    j.start(lambda group, pos: None)
    _need_direct(j)
    writes.fail_on_direct, writes.direct_errno = True, errno.EINVAL
    bodies = [(RecordType.FENCE, (7).to_bytes(8, "little"))] + \
             [(RecordType.ADD_BATCH, os.urandom(90_000)) for _ in range(4)]   # rolls once
    with caplog.at_level(logging.WARNING, logger="bookie.journal"):
        for rec in bodies:
            j.submit([rec]).result(10)
        assert j.failed is None
        j.close()
    assert caplog.text.count("event=journal_direct_refused") == 1
    assert j.file.direct.fd == -1 and j.file.direct.min_bytes == 0
    got = list(replay(str(tmp_path), Position(0, 0)))
    assert [(t, b) for _p, t, b in got if t != RecordType.PAD] == bodies


def test_without_o_direct_every_group_is_buffered(tmp_path, monkeypatch, caplog):
    """A file system that refuses O_DIRECT (EINVAL at open, like tmpfs on
    older kernels): one warning, then every group goes through the page cache."""
    import errno

    from bookie_server.journal import direct_write
    real_open = os.open

    def no_direct(path, flags, *args):
        if flags & os.O_DIRECT:
            raise OSError(errno.EINVAL, "Invalid argument (no O_DIRECT here)")
        return real_open(path, flags, *args)

    monkeypatch.setattr(direct_write.os, "open", no_direct)
    writes = _Writes()
    j = _direct_journal(str(tmp_path), writes, prealloc_bytes=0, max_file_bytes=60_000)
    with caplog.at_level(logging.WARNING, logger="bookie.journal"):
        j.start(lambda group, pos: None)
        bodies = [os.urandom(50_000) for _ in range(3)]              # rolls: one warning only
        for body in bodies:
            j.submit([(RecordType.ADD_BATCH, body)]).result(10)
        j.close()
    assert caplog.text.count("event=journal_direct_unavailable") == 1
    assert {fd for fd, _off, _n in writes.calls} and j.file.direct.fd == -1
    assert [b for _p, _t, b in replay(str(tmp_path), Position(0, 0))] == bodies


def test_a_bookie_reads_back_directly_written_batches_before_and_after_restart(tmp_path):
    from bookie_server.bookie import Bookie
    from pybk_spark.testing.bookie_process import entries_bytes, payload_for

    cfg = BookieConfig(data_dir=str(tmp_path), flush_interval_s=3600,
                       journal_direct_write_min_bytes=64 * 1024, journal_prealloc_bytes=1 << 20)
    b = Bookie(cfg).open(background=False)
    b.add(1, b"k", entries_bytes(1, range(0, 3), size=10))              # small, buffered
    b.add(1, b"k", entries_bytes(1, range(3, 303), size=1000))          # ~300 KB: direct
    b.add(1, b"k", entries_bytes(1, range(303, 305), size=10))
    b.add(1, b"k", entries_bytes(1, range(305, 505), size=1000))

    def check(bookie) -> None:
        got = bookie.read(1, 0, 504).batch
        assert got.column(1).to_pylist() == list(range(505))
        sizes = [10] * 3 + [1000] * 300 + [10] * 2 + [1000] * 200
        assert got.column(3).to_pylist() == [payload_for(1, e, s) for e, s in enumerate(sizes)]

    check(b)
    b.checkpoint()
    check(b)
    b.close()
    b = Bookie(cfg).open(background=False)
    check(b)
    b.close()


def test_readjournal_names_pad_records_and_unknown_types():
    from bookie_server.offline import _describe
    assert _describe(int(RecordType.PAD), bytes(PAD_MIN))["type"] == "PAD"
    assert _describe(int(RecordType.PAD), bytes(PAD_MIN))["ledger"] is None
    assert _describe(99, bytes(8))["type"] == "99"
