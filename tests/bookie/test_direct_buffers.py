"""Memory for direct I/O (bookie_server/direct_buffers.py) and the reads
that use it: huge-page views aligned for ``O_DIRECT``, pooled read buffers
that come back when the last Arrow object over them is freed, stored
batches lying next to each other in a file read with one ``read_direct``
(``SegmentFiles.batches_whole``), and journal groups staged from Arrow
buffers."""
from __future__ import annotations

import ctypes
import gc
import os

import pyarrow as pa

from bookie_server import direct_buffers
from bookie_server.direct_buffers import HUGE_PAGE, BufferPool, huge_mapping
from bookie_server.journal.direct_write import ALIGN, DirectWriter
from bookie_server.storage import segment_files as sf
from bookie_server.storage.write_cache import Ref
from pybk_spark.testing.bookie_process import entries_bytes, payload_for
from pybk_spark.wire.entries import batch_from_bytes

LEDGER = 9


def _address(view: memoryview) -> int:
    return ctypes.addressof(ctypes.c_char.from_buffer(view))


def test_a_huge_mapping_view_starts_on_a_huge_page_boundary():
    raw, view = huge_mapping(3 * HUGE_PAGE + 5)
    assert len(view) == 3 * HUGE_PAGE + 5
    assert _address(view) % HUGE_PAGE == 0
    view[:4] = b"abcd"
    assert bytes(view[:4]) == b"abcd"
    view.release()
    raw.close()


def test_a_read_buffer_comes_back_when_its_last_arrow_object_is_freed():
    pool = BufferPool(max_idle_bytes=2 * HUGE_PAGE)
    view, buf = pool.take(HUGE_PAGE + 100)
    assert len(view) == HUGE_PAGE + 100 and buf.size == HUGE_PAGE + 100
    assert _address(view) % ALIGN == 0
    view[:5] = b"hello"
    part = buf.slice(1, 3)
    del view, buf
    gc.collect()
    assert pool.idle_bytes() == 0             # the slice still holds it
    assert part.to_pybytes() == b"ell"
    del part
    gc.collect()
    assert pool.idle_bytes() == 2 * HUGE_PAGE
    again, buf2 = pool.take(2 * HUGE_PAGE)     # the same size class: reused
    assert pool.idle_bytes() == 0
    assert bytes(again[:5]) == b"hello"
    del again, buf2


def test_the_pool_keeps_no_more_idle_than_its_cap():
    pool = BufferPool(max_idle_bytes=HUGE_PAGE)
    held = [pool.take(HUGE_PAGE) for _ in range(3)]
    del held
    gc.collect()
    assert pool.idle_bytes() == HUGE_PAGE


def test_past_its_cap_the_pool_lets_go_of_the_buffers_returned_longest_ago():
    """A size no longer asked for does not hold the pool: the newest
    returns stay, whatever their size, and are the ones taken again."""
    pool = BufferPool(max_idle_bytes=6 * HUGE_PAGE)
    small = [pool.take(HUGE_PAGE) for _ in range(6)]
    for view, _buf in small:
        view[:1] = b"s"
    del small, view, _buf
    gc.collect()
    assert pool.idle_bytes() == 6 * HUGE_PAGE
    big = [pool.take(3 * HUGE_PAGE) for _ in range(2)]      # a new size class: mapped afresh
    for view, _buf in big:
        view[:1] = b"b"
    del big, view, _buf
    gc.collect()
    assert pool.idle_bytes() == 6 * HUGE_PAGE                 # the two big ones, no small one
    again = [pool.take(3 * HUGE_PAGE) for _ in range(2)]
    assert [bytes(v[:1]) for v, _b in again] == [b"b", b"b"]
    assert pool.idle_bytes() == 0
    del again
    gc.collect()
    too_big = pool.take(7 * HUGE_PAGE)
    del too_big
    gc.collect()
    assert pool.idle_bytes() == 6 * HUGE_PAGE                 # over the cap alone: unmapped


def test_reserved_buffers_wait_in_the_pool_touched_and_serve_smaller_takes():
    """A reserve is there before the first transfer that needs it: its
    pages are written (zeros), and a take of its size class or down to
    half of it gets one instead of a new mapping."""
    pool = BufferPool(max_idle_bytes=64 * HUGE_PAGE)
    pool.reserve(4 * HUGE_PAGE, 3)
    assert pool.idle_bytes() == 12 * HUGE_PAGE
    reserved = {_address(idle.view) for idle in pool._idle[4 * HUGE_PAGE]}
    view, buf = pool.take(2 * HUGE_PAGE + 1)           # down to half the reserve's size
    assert _address(view) in reserved and len(view) == 2 * HUGE_PAGE + 1
    assert bytes(view[-4:]) == bytes(4)
    other, obuf = pool.take(HUGE_PAGE)                 # under half: a mapping of its own
    assert _address(other) not in reserved
    assert pool.idle_bytes() == 8 * HUGE_PAGE
    del view, buf, other, obuf
    gc.collect()
    assert pool.idle_bytes() == 13 * HUGE_PAGE         # each back under its own size


def test_a_reserve_stays_within_the_pools_cap():
    pool = BufferPool(max_idle_bytes=5 * HUGE_PAGE)
    pool.reserve(2 * HUGE_PAGE, 4)
    assert pool.idle_bytes() == 4 * HUGE_PAGE


def test_a_bookie_reserves_its_read_buffers_on_a_thread_of_its_own(monkeypatch):
    reads, answers = BufferPool(64 << 20), BufferPool(64 << 20, huge=False)
    records = BufferPool(64 << 20)
    monkeypatch.setattr(direct_buffers, "READ_BUFFERS", reads)
    monkeypatch.setattr(direct_buffers, "ANSWER_BUFFERS", answers)
    monkeypatch.setattr(direct_buffers, "STAGED_RECORDS", records)
    assert direct_buffers.reserve_read_buffers(0, 0) is None
    thread = direct_buffers.reserve_read_buffers(32)
    assert thread is not None and thread.daemon
    thread.join()
    assert reads.idle_bytes() == answers.idle_bytes() == 16 << 20
    assert set(reads._idle) == {direct_buffers.RESERVED_READ_BYTES}
    assert records.idle_bytes() == 0


def test_a_bookie_reserves_the_records_its_pulls_receive_into(monkeypatch):
    """A replacement's first pulls find the journal records their answers
    land in already touched (``pull_buffers_at_start_mb``)."""
    reads, answers, records = BufferPool(64 << 20), BufferPool(64 << 20), BufferPool(64 << 20)
    monkeypatch.setattr(direct_buffers, "READ_BUFFERS", reads)
    monkeypatch.setattr(direct_buffers, "ANSWER_BUFFERS", answers)
    monkeypatch.setattr(direct_buffers, "STAGED_RECORDS", records)
    thread = direct_buffers.reserve_read_buffers(0, 24)
    assert thread is not None
    thread.join()
    assert records.idle_bytes() == 24 << 20 and reads.idle_bytes() == answers.idle_bytes() == 0
    assert set(records._idle) == {direct_buffers.RESERVED_READ_BYTES}


def _files(tmp_path) -> sf.SegmentFiles:
    return sf.SegmentFiles(str(tmp_path), segment_max_bytes=1 << 30, batch_cache_size=4,
                           mmap_cache_size=4, journal_dir=None, fsync=lambda fd: None)


def _write_with_gaps(files: sf.SegmentFiles, gaps: list[int], rows: int = 1000
                     ) -> list[Ref]:
    """Stored batches of ``rows`` 1 KiB entries in one segment file, each
    after a gap of the given bytes (what frame headers and PADs leave
    between journaled batches)."""
    refs, first = [], 0
    path = files.path(1)
    with open(path, "wb") as fh:
        for gap in gaps:
            fh.write(b"\0" * gap)
            raw = entries_bytes(LEDGER, range(first, first + rows), size=1024)
            refs.append(Ref(LEDGER, segment=1, offset=fh.tell(), length=len(raw)))
            fh.write(raw)
            first += rows
    files.size[1] = os.path.getsize(path)
    return refs


def _ids(batch: pa.RecordBatch) -> list[int]:
    return batch.column(1).to_pylist()


def test_neighbouring_batches_are_read_together_and_decode_as_each_alone(tmp_path, monkeypatch):
    files = _files(tmp_path)
    refs = _write_with_gaps(files, [0, 40, 4096, 0, sf.COALESCE_GAP + 1, 17])
    reads = []
    real = files.read_direct
    monkeypatch.setattr(files, "read_direct",
                        lambda seg, off, n: reads.append((off, n)) or real(seg, off, n))
    shuffled = [refs[i] for i in (3, 0, 5, 1, 4, 2)]
    got = files.batches_whole(shuffled)
    # the gap over COALESCE_GAP splits them in two reads, the rest go together
    assert len(reads) == 2
    assert reads[0][0] == refs[0].offset
    assert reads[1][0] == refs[4].offset
    for ref, batch in zip(shuffled, got):
        alone = files.batch_whole(ref)
        assert batch.equals(alone)
        first = _ids(alone)[0]
        assert _ids(batch) == list(range(first, first + 1000))
        assert batch.column(3)[7].as_py() == payload_for(LEDGER, first + 7, 1024)


def test_a_coalesced_read_stops_at_its_size_cap(tmp_path, monkeypatch):
    files = _files(tmp_path)
    refs = _write_with_gaps(files, [0] * 6)
    monkeypatch.setattr(sf, "COALESCE_MAX", 2 * refs[0].length + 10)
    reads = []
    real = files.read_direct
    monkeypatch.setattr(files, "read_direct",
                        lambda seg, off, n: reads.append(n) or real(seg, off, n))
    got = files.batches_whole(refs)
    assert len(reads) == 3 and max(reads) <= sf.COALESCE_MAX
    assert [_ids(b)[0] for b in got] == [0, 1000, 2000, 3000, 4000, 5000]


def test_batches_in_memory_or_in_the_cache_are_not_read(tmp_path, monkeypatch):
    files = _files(tmp_path)
    refs = _write_with_gaps(files, [0, 0])
    in_memory = Ref(LEDGER, batch_from_bytes(entries_bytes(LEDGER, range(7000, 7003))))
    for ref in refs:
        files.batch_of(ref)             # read through the map, and cached
    monkeypatch.setattr(files, "read_direct", lambda *a: (_ for _ in ()).throw(AssertionError))
    got = files.batches_whole([in_memory, refs[1], refs[0]])
    assert [_ids(b)[0] for b in got] == [7000, 1000, 0]


def test_a_direct_group_stages_arrow_buffers_byte_for_byte(tmp_path):
    writes = []
    writer = DirectWriter(1, lambda fd, pieces, off: writes.append(b"".join(
        bytes(p) for p in pieces)) or sum(len(p) for p in pieces), lambda need: None)
    pieces = [pa.py_buffer(b"x" * 5000), memoryview(b"y" * 3000), b"z" * 100]
    view = writer.stage(pieces, 0)
    assert len(view) % ALIGN == 0
    assert bytes(view[:8100]) == b"x" * 5000 + b"y" * 3000 + b"z" * 100
    assert _address(view) % HUGE_PAGE == 0
    view.release()
