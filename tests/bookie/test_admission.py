"""Bookie admission: past max_adds_in_progress / max_add_memory_bytes an add is
answered TooManyRequests (not journaled), and admission reopens once adds
become durable.  In-process Bookie; the journal's fdatasync is held back
through the ``fsync`` seam to keep adds in progress."""
from __future__ import annotations

import os
import threading
import time

import pytest

from bookie_server.bookie import Bookie
from bookie_server.config import BookieConfig, validate
from pybk_spark import errors
from pybk_spark.testing.bookie_process import entries_bytes


def _wait(pred, timeout=30.0):
    deadline = time.monotonic() + timeout
    while not pred():
        assert time.monotonic() < deadline, "condition not reached"
        time.sleep(0.005)


@pytest.mark.parametrize("bound", ["count", "bytes"])
def test_overload_refused_then_admitted_again(tmp_path, bound):
    gate = threading.Event()
    gate.set()

    def fdatasync(fd):
        gate.wait()
        os.fdatasync(fd)

    size = 2000
    one = len(entries_bytes(7, [0], size=size))
    if bound == "count":
        cfg = BookieConfig(data_dir=str(tmp_path), flush_interval_s=3600, max_adds_in_progress=2)
    else:
        cfg = BookieConfig(data_dir=str(tmp_path), flush_interval_s=3600, max_entry_bytes=4096,
                           max_batch_bytes=one * 2 + 100, max_add_memory_bytes=one * 2 + 100,
                           write_cache_max_bytes=1 << 30)
    b = Bookie(cfg, fsync=fdatasync).open(background=False)
    try:
        assert b.add(7, b"k", entries_bytes(7, [0], size=size)) == (0, 0)
        b.checkpoint()                                  # empty the write cache
        gate.clear()                                    # hold every fdatasync
        done = []
        threads = [threading.Thread(target=lambda i=i: done.append(
            b.add(7, b"k", entries_bytes(7, [i], size=size)))) for i in (1, 2)]
        for t in threads:
            t.start()
        _wait(lambda: b.admission.adds == 2)
        with pytest.raises(errors.TooManyRequests) as info:
            b.add_async(7, b"k", entries_bytes(7, [3], size=size))
        assert ("max_adds_in_progress" if bound == "count" else "max_add_memory_bytes") \
            in str(info.value)
        assert b.metrics.adds_refused._value.get() == 1
        gate.set()
        for t in threads:
            t.join(30)
        assert sorted(done) == [(1, 1), (2, 2)]
        assert b.admission.adds == 0 and b.admission.bytes == 0
        if bound == "bytes":
            b.checkpoint()                              # the write cache counts too
        assert b.add(7, b"k", entries_bytes(7, [3], size=size)) == (3, 3)
        # the refused add was never stored
        assert b.read(7, 0, 3).batch.column("entry_id").to_pylist() == [0, 1, 2, 3]
    finally:
        gate.set()
        b.close(checkpoint=False)


def test_write_cache_counts_against_the_memory_bound(tmp_path):
    size = 2000
    one = len(entries_bytes(7, [0], size=size))
    cfg = BookieConfig(data_dir=str(tmp_path), flush_interval_s=3600, max_entry_bytes=4096,
                       max_batch_bytes=one + 100, max_add_memory_bytes=one * 3,
                       write_cache_max_bytes=1 << 30)
    b = Bookie(cfg).open(background=False)
    try:
        n = 0
        with pytest.raises(errors.TooManyRequests):
            for n in range(100):
                b.add(7, b"k", entries_bytes(7, [n], size=size))
        assert 1 <= n < 100 and b.store.write_cache_bytes <= cfg.max_add_memory_bytes
        b.checkpoint()
        assert b.add(7, b"k", entries_bytes(7, [n], size=size)) == (n, n)
    finally:
        b.close(checkpoint=False)


def test_config_bounds_are_validated():
    with pytest.raises(ValueError, match="max_add_memory_bytes"):
        validate(BookieConfig(max_add_memory_bytes=1024))
    with pytest.raises(ValueError, match="max_adds_in_progress"):
        validate(BookieConfig(max_adds_in_progress=-1))
    validate(BookieConfig(max_add_memory_bytes=0, max_adds_in_progress=0))
