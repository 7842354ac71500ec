"""A checkpoint syncs its segment writes every ``checkpoint_sync_bytes``,
not once at the end (docs/bookie.md, "Checkpoint"): the journal shares the
disk, and its fdatasync waits for what the device holds queued.  Counts and
faults go in through the ``store_fsync`` seam; files, threads and replay
are real."""
from __future__ import annotations

import errno
import os

import pytest

from bookie_server.bookie import Bookie
from bookie_server.checkpoint_file import CHECKPOINT
from bookie_server.config import BookieConfig
from pybk_spark import errors
from pybk_spark.testing.bookie_process import entries_bytes, payload_for

KEY = b"k"
STEP = 8192


class SegmentSyncs:
    """An fsync seam counting the syncs of segment files (``*.seg``);
    with ``fail_at``, that sync (1-based) and every later one fail (EIO)."""

    def __init__(self, fail_at: int = 0):
        self.fail_at = fail_at
        self.count = 0

    def __call__(self, fd: int) -> None:
        if os.readlink(f"/proc/self/fd/{fd}").endswith(".seg"):
            self.count += 1
            if self.fail_at and self.count >= self.fail_at:
                raise OSError(errno.EIO, "injected EIO")
        os.fsync(fd)


def _fill(b: Bookie, start: int = 0) -> list[int]:
    """20 small batches of ledger 3 from entry ``start`` on (merged into
    one segment write at the checkpoint), 10 entries of 1 KiB each; the
    entry ids."""
    ids = []
    for first in range(start, start + 200, 10):
        b.add(3, KEY, entries_bytes(3, range(first, first + 10), lac=first - 1, size=1024))
        ids += range(first, first + 10)
    return ids


def _cfg(tmp_path, step: int) -> BookieConfig:
    return BookieConfig(data_dir=str(tmp_path), flush_interval_s=3600, checkpoint_sync_bytes=step)


@pytest.mark.parametrize("step", [0, STEP])
def test_checkpoint_syncs_segment_writes_in_steps(tmp_path, step):
    syncs = SegmentSyncs()
    b = Bookie(_cfg(tmp_path, step), store_fsync=syncs).open()
    try:
        ids = _fill(b)
        b.checkpoint()
        seg_bytes = sum(os.path.getsize(os.path.join(b.store.seg_dir, f))
                        for f in os.listdir(b.store.seg_dir))
    finally:
        b.close()
    assert seg_bytes > 200 * 1024
    # a sync per step (and one at the end); 0: once per segment file
    assert syncs.count >= (seg_bytes // STEP if step else 1), syncs.count
    if not step:
        assert syncs.count <= 2              # the checkpoint's, close's
    b = Bookie(_cfg(tmp_path, step)).open()  # the segments hold every entry
    try:
        got = b.read(3, 0, len(ids))
        assert got.batch.column("entry_id").to_pylist() == ids
        assert got.batch.column("payload").to_pylist() == [payload_for(3, e, 1024) for e in ids]
    finally:
        b.close()


def test_a_failed_step_sync_fails_the_checkpoint_and_keeps_the_last(tmp_path):
    """A sync in the middle of the segment writes fails: the checkpoint
    does not advance, the bookie is read-only until restart, and the
    restart replays every entry from the journal."""
    syncs = SegmentSyncs()
    b = Bookie(_cfg(tmp_path, STEP), store_fsync=syncs).open()
    try:
        b.add(3, KEY, entries_bytes(3, [0], size=1024))
        b.checkpoint()
        ckpt = (tmp_path / CHECKPOINT).read_text()
        ids = [0] + _fill(b, 1)
        syncs.fail_at = syncs.count + 3           # the third step of the next checkpoint
        with pytest.raises(errors.BookieIOError):
            b.checkpoint()
        assert (tmp_path / CHECKPOINT).read_text() == ckpt
        assert b.read_only
    finally:
        b.close()
    b = Bookie(_cfg(tmp_path, STEP)).open()
    try:
        assert b.read(3, 0, len(ids)).batch.column("entry_id").to_pylist() == ids
    finally:
        b.close()

