"""The journal's page-cache window: the pure bookkeeping, and a real journal
whose synced bytes beyond the window leave the OS page cache."""
from __future__ import annotations

import ctypes
import mmap
import os

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bookie_server.journal.journal import Journal, Position, RecordType, file_name, list_files
from bookie_server.journal.journal_replay import replay
from bookie_server.storage.page_cache import PAGE, SyncedWindow


def test_nothing_is_dropped_inside_the_window():
    w = SyncedWindow(keep_bytes=1000, slack=0)
    assert w.synced(1, 0, 600) == []
    assert w.synced(1, 600, 1000) == []
    assert w.held == 1000


def test_the_oldest_bytes_go_first_and_exactly_down_to_the_window():
    P = PAGE
    w = SyncedWindow(keep_bytes=10 * P, slack=0)
    w.synced(1, 0, 6 * P)
    w.synced(2, 0, 3 * P)                     # the next file
    assert w.synced(2, 3 * P, 7 * P) == [(1, 0, 3 * P)]          # part of the oldest range
    assert w.held == 10 * P
    assert w.synced(2, 7 * P, 15 * P) == [(1, 3 * P, 6 * P), (2, 0, 5 * P)]
    assert w.held == 10 * P


def test_slack_batches_the_drops():
    w = SyncedWindow(keep_bytes=10 * PAGE, slack=4 * PAGE)
    assert w.synced(1, 0, 13 * PAGE) == []            # over the window, within the slack
    assert w.synced(1, 13 * PAGE, 15 * PAGE) == [(1, 0, 5 * PAGE)]
    assert w.held == 10 * PAGE


def test_keep_zero_drops_each_range_from_its_page_start():
    w = SyncedWindow(keep_bytes=0)
    assert w.synced(3, 100, 5000) == [(3, 0, 5000)]
    assert w.synced(3, 5000, 9000) == [(3, 5000 & ~(PAGE - 1), 9000)]
    assert w.held == 0


def test_a_negative_window_is_refused():
    with pytest.raises(ValueError):
        SyncedWindow(keep_bytes=-1)


def test_extend_takes_only_a_continuation_that_drops_nothing():
    w = SyncedWindow(keep_bytes=4096, slack=1024)
    assert not w.extend(1, 0, 1000)             # nothing to continue yet
    assert w.synced(1, 0, 1000) == []
    assert w.extend(1, 1000, 2000) and w.held == 2000
    assert not w.extend(1, 2500, 3000)          # a gap
    assert not w.extend(2, 2000, 3000)          # another file
    assert not w.extend(1, 2000, 2000)          # empty
    assert not w.extend(1, 2000, 6000)          # past keep + slack: synced drops
    assert w.held == 2000


@settings(max_examples=300, deadline=None)
@given(keep=st.integers(0, 5000), slack=st.integers(0, 2000),
       writes=st.lists(st.tuples(st.booleans(), st.integers(0, 3000)), max_size=40))
def test_extend_then_synced_answers_as_synced_alone(keep, slack, writes):
    """The journal's step (``extend``, else ``synced``) drops the same
    ranges and holds the same bytes as ``synced`` alone."""
    fast, plain = SyncedWindow(keep, slack), SyncedWindow(keep, slack)
    seq, offset = 1, 0
    for new_file, size in writes:
        if new_file:
            seq, offset = seq + 1, 0
        got = [] if fast.extend(seq, offset, offset + size) else fast.synced(seq, offset,
                                                                            offset + size)
        assert got == plain.synced(seq, offset, offset + size)
        assert fast.held == plain.held
        offset += size


@settings(max_examples=300, deadline=None)
@given(keep=st.integers(0, 5000), slack=st.integers(0, 2000),
       writes=st.lists(st.tuples(st.booleans(), st.integers(0, 3000)), max_size=40))
def test_window_drops_exactly_the_oldest_bytes_beyond_it(keep, slack, writes):
    """Model: the reported bytes form one stream, oldest first.  Every drop
    must take the stream's head (its start only rounded down to a page), and
    what is held is the rest, at most keep + slack, exactly keep after a drop."""
    w = SyncedWindow(keep_bytes=keep, slack=slack)
    stream: list[list[int]] = []            # [seq, start, end] not yet dropped
    seq, offset = 1, 0
    for new_file, size in writes:
        if new_file:
            seq, offset = seq + 1, 0
        got = w.synced(seq, offset, offset + size)
        if size:
            stream.append([seq, offset, offset + size])
        offset += size
        for s, a, b in got:               # may span contiguous ranges of one file
            assert stream and s == stream[0][0] and a == stream[0][1] & ~(PAGE - 1)
            pos = stream[0][1]
            while stream and stream[0][0] == s and stream[0][1] == pos and pos < b:
                pos = min(b, stream[0][2])
                if pos == stream[0][2]:
                    stream.pop(0)
                else:
                    stream[0][1] = pos
            assert pos == b
        held = sum(e - a for _, a, e in stream)
        assert w.held == held <= keep + slack
        if got:
            assert held == keep


# -- a real journal ------------------------------------------------------------------------
def _resident_bytes(path: str) -> int:
    """Bytes of ``path`` in the page cache: mincore(2) over a read-only map
    (mapping a file does not fault its pages in)."""
    size = os.path.getsize(path)
    if size == 0:
        return 0
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]
    pages = (size + PAGE - 1) // PAGE
    vec = (ctypes.c_ubyte * pages)()
    with open(path, "rb") as fh:
        mm = mmap.mmap(fh.fileno(), size, prot=mmap.PROT_READ)
        try:
            if libc.mincore(_address(mm), size, vec) != 0:
                pytest.skip(f"mincore failed: errno {ctypes.get_errno()}")
        finally:
            mm.close()
    return sum(v & 1 for v in vec) * PAGE


def _address(mm: mmap.mmap) -> int:
    """Start address of a read-only map (numpy reads it without copying)."""
    import numpy as np
    return np.frombuffer(mm, dtype=np.uint8).ctypes.data


def _fadvise_drops_here(directory: str) -> bool:
    probe = os.path.join(directory, "probe")
    fd = os.open(probe, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        os.write(fd, b"p" * (16 * PAGE))
        os.fdatasync(fd)
        os.posix_fadvise(fd, 0, 16 * PAGE, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)
    try:
        return _resident_bytes(probe) < 16 * PAGE
    finally:
        os.unlink(probe)


def test_journal_keeps_only_its_window_in_the_page_cache(tmp_path):
    jdir = str(tmp_path / "journal")
    os.makedirs(jdir)
    if not _fadvise_drops_here(jdir):
        pytest.skip("this filesystem ignores POSIX_FADV_DONTNEED (e.g. tmpfs)")
    keep = 256 * 1024
    j = Journal(jdir, max_file_bytes=1 << 20, prealloc_bytes=0, page_cache_keep_bytes=keep)
    j.start(lambda group, pos: None)
    body = os.urandom(64 * 1024)
    for _ in range(48):                           # 3 MiB over three or four files
        j.write([(RecordType.ADD_BATCH, body)]).result(10)
    # the page advice runs after the acks, so an add's future can resolve before
    # its range is released: close() joins the sync thread, then measure
    j.close()
    files = list_files(jdir)
    resident = sum(_resident_bytes(os.path.join(jdir, file_name(s))) for s in files)
    slack = min(16 << 20, keep // 8)
    # DONTNEED drops whole pages only: each file may keep one partial page at
    # the end of its dropped range, and the window may straddle one more
    edge_pages = (len(files) + 1) * PAGE
    assert resident <= keep + slack + edge_pages, f"{resident} bytes still cached"
    assert resident >= keep // 2, "the newest bytes stay cached for readers"
    # nothing was lost: every record replays
    assert len(list(replay(jdir, Position(0, 0)))) == 48


def test_failing_advice_never_fails_the_journal(tmp_path, monkeypatch):
    from bookie_server.storage import page_cache

    def broken(*args, **kwargs):
        raise RuntimeError("injected: advice failed")
    monkeypatch.setattr(page_cache, "drop", broken)
    j = Journal(str(tmp_path), prealloc_bytes=0, page_cache_keep_bytes=0)
    j.start(lambda group, pos: None)
    for i in range(5):
        j.write([(RecordType.FENCE, i.to_bytes(8, "little"))]).result(10)
    j.close()
    assert len(list(replay(str(tmp_path), Position(0, 0)))) == 5
