"""Storage failure, in process: a failed journal write/fdatasync or checkpoint
fsync pins the bookie read-only until restart (docs/bookie.md, "Storage
failure").  Faults go in through the syscall seams (``fsync``, ``pwritev``,
``store_fsync``); everything else is real: files, threads, replay."""
from __future__ import annotations

import errno
import json
import os
import threading

import pytest

from bookie_server.background import DiskChecker, next_read_only
from bookie_server.bookie import Bookie
from bookie_server.checkpoint_file import CHECKPOINT
from bookie_server.config import BookieConfig
from bookie_server.journal.journal import Journal, Position, RecordType
from bookie_server.journal.journal_replay import replay
from pybk_spark import errors
from pybk_spark.testing.bookie_process import entries_bytes
from pybk_spark.wire.entries import entry_record_head

KEY = b"k"


class FailingFsync:
    """An fsync seam: real until ``fail`` is set, then EIO; counts calls."""

    def __init__(self, real=os.fdatasync):
        self.real = real
        self.fail = threading.Event()
        self.calls = 0
        self.calls_after_failure = 0

    def __call__(self, fd: int) -> None:
        self.calls += 1
        if self.fail.is_set():
            self.calls_after_failure += 1
            raise OSError(errno.EIO, "injected EIO")
        self.real(fd)


def test_disk_checker_cannot_lift_a_pinned_read_only():
    assert next_read_only(True, 0.0, 0.95, 0.90, pinned=True) is True
    assert next_read_only(False, 0.0, 0.95, 0.90, pinned=True) is True
    assert next_read_only(True, 0.0, 0.95, 0.90) is False


def test_groups_written_behind_a_failed_fdatasync_are_never_acknowledged(tmp_path, caplog):
    """The writer stage writes groups 2 and 3 into the file while group 1's
    fdatasync is running; that fdatasync fails.  No group is acknowledged
    (2 and 3 would have been "synced" by the next fdatasync of a file whose
    pages may be gone), nothing is fsynced again (not even at close), the
    failure is logged once with errno and path, and later submissions fail."""
    writes = []
    wrote = threading.Condition()
    release = threading.Event()
    fsync_calls = []
    failures = []

    def pwritev(fd, buffers, offset):
        n = os.pwritev(fd, buffers, offset)
        with wrote:
            writes.append(offset)
            wrote.notify_all()
        return n

    def wait_writes(n):
        with wrote:
            return wrote.wait_for(lambda: len(writes) >= n, 30)

    def fsync(fd):
        fsync_calls.append(fd)
        release.wait(30)          # group 1's fdatasync "runs" until 2 and 3 are written
        raise OSError(errno.EIO, "injected EIO")

    j = Journal(str(tmp_path), lead_max_bytes=-1, prealloc_bytes=0, fsync=fsync,
                pwritev=pwritev, on_failure=failures.append)
    durable = []
    j.start(lambda group, pos: durable.extend(group))
    f1 = j.submit([(RecordType.FENCE, (1).to_bytes(8, "little"))])
    while not fsync_calls:                      # group 1 is in its fdatasync
        threading.Event().wait(0.005)           # poll, not synchronisation
    f2 = j.submit([(RecordType.FENCE, (2).to_bytes(8, "little"))])
    assert wait_writes(2), "the writer stage wrote group 2 behind group 1"
    f3 = j.submit([(RecordType.FENCE, (3).to_bytes(8, "little"))])
    assert wait_writes(3), "the writer stage wrote group 3 behind group 1"
    with caplog.at_level("ERROR", logger="bookie.journal"):
        release.set()
        for f in (f1, f2, f3):
            with pytest.raises(errors.BookieIOError):
                f.result(30)
        with pytest.raises(errors.BookieIOError):
            j.submit([(RecordType.FENCE, (4).to_bytes(8, "little"))]).result(30)
        j.close()
    assert durable == [] and len(failures) == 1
    assert len(fsync_calls) == 1, "a failed fdatasync is never retried"
    lines = [r.getMessage() for r in caplog.records if "event=journal_failed" in r.getMessage()]
    assert len(lines) == 1 and "op=fdatasync errno=EIO" in lines[0]
    assert f"path={j.path_of(1)}" in lines[0]
    # the un-acknowledged records are on disk here (the page cache survived):
    # BookKeeper's model allows it - an un-acknowledged add may exist
    assert len(list(replay(str(tmp_path), Position(0, 0)))) == 3


def test_failed_fdatasync_refuses_everything_that_needs_the_journal(tmp_path):
    """After the failure: adds (recovery adds too), fences and explicit LACs
    are refused with ReadOnly at once, reads of acknowledged entries are
    served, the disk checker cannot lift the mode, no checkpoint is written,
    no fsync is retried; a restart replays and serves what was acked."""
    fsync = FailingFsync()
    cfg = BookieConfig(data_dir=str(tmp_path), flush_interval_s=3600)
    b = Bookie(cfg, fsync=fsync).open()
    try:
        b.add(7, KEY, entries_bytes(7, [0, 1]))
        b.checkpoint()
        b.add(7, KEY, entries_bytes(7, [2, 3], lac=1))
        ckpt = json.loads((tmp_path / CHECKPOINT).read_text())
        fsync.fail.set()
        with pytest.raises(errors.BookieIOError):
            b.add(7, KEY, entries_bytes(7, [4], lac=3))
        assert b.io_error and "EIO" in b.io_error
        for refused in (lambda: b.add(7, KEY, entries_bytes(7, [5], lac=3)),
                        lambda: b.add(7, KEY, entries_bytes(7, [5], lac=3), recovery=True),
                        lambda: b.fence(7, KEY),
                        lambda: b.read(7, 0, 0, fence=True, master_key=KEY),
                        lambda: b.write_lac(7, KEY, 3),
                        lambda: b.delete_ledger(7)):
            with pytest.raises(errors.ReadOnly):
                refused()
        got = b.read(7, 0, 10)
        assert got.batch.column("entry_id").to_pylist() == [0, 1, 2, 3]
        assert b.lac_of(7).lac == 1 and not b.lac_of(7).fenced
        checker = DiskChecker(b, cfg, on_change=lambda ro: None, usage_fn=lambda: 0.0)
        assert checker.check_once() is True
        assert not b.set_read_only(False)
        assert b.read_only
        with pytest.raises(errors.BookieIOError):
            b.checkpoint()
        assert json.loads((tmp_path / CHECKPOINT).read_text()) == ckpt
    finally:
        b.close()                   # no checkpoint, no fsync of the failed file
    assert fsync.calls_after_failure == 1
    assert json.loads((tmp_path / CHECKPOINT).read_text()) == ckpt
    b = Bookie(cfg).open()
    try:
        assert not b.read_only and b.io_error is None
        ids = b.read(7, 0, 10).batch.column("entry_id").to_pylist()
        # 4 was never acknowledged; here it did reach the disk (page cache),
        # which BookKeeper's model allows.  The LAC is what the entries carry.
        assert ids[:4] == [0, 1, 2, 3] and set(ids) <= {0, 1, 2, 3, 4}
        assert b.lac_of(7).lac in (1, 3)
        b.add(7, KEY, entries_bytes(7, [5], lac=3))
    finally:
        b.close()


def _lone(ledger: int, entry_id: int, lac: int) -> bytes:
    return entry_record_head(ledger, entry_id, lac, 8, b"d") + b"x" * 8


def test_a_lone_add_led_inline_fails_and_poisons_like_a_queued_one(tmp_path, caplog):
    """A lone add on an idle journal is written and synced on the caller's
    thread with no future (Journal.claim / lead_now).  Its fdatasync
    failing fails that add (never acknowledged, never applied), poisons the
    journal once, releases its admission and refuses every later add."""
    fsync = FailingFsync()
    cfg = BookieConfig(data_dir=str(tmp_path), flush_interval_s=3600)
    b = Bookie(cfg, fsync=fsync).open()
    try:
        fut, ledger_id, entry_id = b.add_entry(_lone(8, 0, -1), KEY)
        assert (fut, ledger_id, entry_id) == (None, 8, 0), "an idle journal: led inline"
        fsync.fail.set()
        with caplog.at_level("ERROR", logger="bookie.journal"):
            with pytest.raises(errors.BookieIOError, match="injected EIO"):
                b.add_entry(_lone(8, 1, 0), KEY)
        assert b.admission.adds == 0 and b.admission.bytes == 0
        assert b.io_error and "EIO" in b.io_error
        with pytest.raises(errors.ReadOnly):
            b.add_entry(_lone(8, 2, 0), KEY)
        assert b.read(8, 0, 10).batch.column("entry_id").to_pylist() == [0]
        lines = [r.getMessage() for r in caplog.records if "event=journal_failed" in r.getMessage()]
        assert len(lines) == 1 and "op=fdatasync errno=EIO" in lines[0]
    finally:
        b.close()
    assert fsync.calls_after_failure == 1


def test_failed_checkpoint_fsync_pins_read_only_and_keeps_the_old_checkpoint(tmp_path, caplog):
    """A segment fsync that fails at checkpoint: the checkpoint does not
    advance (checkpoint.json and the journal files stay), the bookie is
    read-only until restart, reads are served from the write cache; a later
    checkpoint is refused (it would persist a position past entries no
    segment holds durably); a restart replays them."""
    store_fsync = FailingFsync(real=os.fsync)
    cfg = BookieConfig(data_dir=str(tmp_path), flush_interval_s=3600)
    b = Bookie(cfg, store_fsync=store_fsync).open()
    modes = []
    b.add_mode_listener(modes.append)
    try:
        b.add(3, KEY, entries_bytes(3, [0, 1]))
        b.checkpoint()
        ckpt = (tmp_path / CHECKPOINT).read_text()
        b.add(3, KEY, entries_bytes(3, [2, 3], lac=1))
        journal_files = sorted(os.listdir(tmp_path / "journal"))
        store_fsync.fail.set()
        with caplog.at_level("ERROR", logger="bookie.core"):
            with pytest.raises(errors.BookieIOError):
                b.checkpoint()
        assert any("event=checkpoint_failed errno=EIO" in r.getMessage() for r in caplog.records)
        assert (tmp_path / CHECKPOINT).read_text() == ckpt
        assert sorted(os.listdir(tmp_path / "journal")) == journal_files
        assert b.io_error and "checkpoint" in b.io_error
        with pytest.raises(errors.ReadOnly):
            b.add(3, KEY, entries_bytes(3, [4], lac=3))
        assert b.read(3, 0, 10).batch.column("entry_id").to_pylist() == [0, 1, 2, 3]
        store_fsync.fail.clear()            # the disk "recovers": still no checkpoint
        with pytest.raises(errors.BookieIOError):
            b.checkpoint()
        assert (tmp_path / CHECKPOINT).read_text() == ckpt
        for _ in range(3000):               # the registrar is told on its own thread
            if modes:
                break
            threading.Event().wait(0.01)
        assert modes == [True] and b.read_only
    finally:
        b.close()
    assert (tmp_path / CHECKPOINT).read_text() == ckpt
    b = Bookie(cfg).open()
    try:
        assert not b.read_only
        assert b.read(3, 0, 10).batch.column("entry_id").to_pylist() == [0, 1, 2, 3]
        b.add(3, KEY, entries_bytes(3, [4], lac=3))
        b.checkpoint()
    finally:
        b.close()
