"""A recovery add's batch (a pull's or a client's copy of entries written
before) is journal-resident and not held in memory: the write cache counts
no bytes for it, reads come from the journal file before and after a
checkpoint and after a restart, and nothing the store keeps holds the
received buffer.  An ordinary add's batch stays in memory until the
checkpoint."""
from __future__ import annotations

import gc
import weakref

import numpy as np
import pyarrow as pa

from bookie_server.bookie import Bookie
from bookie_server.config import BookieConfig
from bookie_server.storage.run_index import runs_of
from pybk_spark.testing.bookie_process import entries_bytes, payload_for
from pybk_spark.testing.waiting import wait_until

KEY = b"key"
COLD, WARM = 7, 8
IDS = range(0, 1000)


def _open(tmp_path) -> Bookie:
    return Bookie(BookieConfig(data_dir=str(tmp_path / "b"))).open(background=False)


def _check(bookie: Bookie, ledger: int) -> None:
    for sparse in (False, True):
        res = bookie.read(ledger, 0, 999, max_entries=5000, max_bytes=64 << 20, sparse=sparse)
        assert res.batch.column("entry_id").to_pylist() == list(IDS)
        assert res.batch.column("payload")[500].as_py() == payload_for(ledger, 500)


def _refs(bookie: Bookie, ledger: int) -> list:
    return [bookie.store.refs[r] for r in bookie.store.cache.by_ledger.get(ledger, [])]


def test_a_recovery_batch_is_read_from_the_journal_not_held_in_memory(tmp_path):
    bookie = _open(tmp_path)
    try:
        data = pa.py_buffer(entries_bytes(COLD, IDS))
        gone = weakref.finalize(data, lambda: None)
        bookie.add(COLD, KEY, data, recovery=True)
        (ref,) = _refs(bookie, COLD)
        assert ref.cold and ref.batch is None and ref.in_memory and ref.segment >= 0
        assert bookie.store.write_cache_bytes == 0
        del data
        # no index array, ref or journal thread keeps the received bytes
        # (the journal's threads let go once they have handed the group on)
        wait_until(lambda: gc.collect() >= 0 and not gone.alive, "the received buffer freed", 30)
        _check(bookie, COLD)

        bookie.add(WARM, KEY, entries_bytes(WARM, IDS))
        (warm,) = _refs(bookie, WARM)
        assert not warm.cold and warm.batch is not None and bookie.store.write_cache_bytes > 0

        bookie.checkpoint()
        assert not _refs(bookie, COLD) and bookie.store.write_cache_bytes == 0
        _check(bookie, COLD)
        _check(bookie, WARM)
    finally:
        bookie.close()
    again = _open(tmp_path)
    try:
        _check(again, COLD)
        _check(again, WARM)
    finally:
        again.close()


def test_a_restart_before_the_checkpoint_replays_a_recovery_batch(tmp_path):
    bookie = _open(tmp_path)
    try:
        bookie.add(COLD, KEY, entries_bytes(COLD, IDS), recovery=True)
    finally:
        bookie.close(checkpoint=False)
    again = _open(tmp_path)
    try:
        _check(again, COLD)
    finally:
        again.close()


def test_runs_of_consecutive_ids_shares_no_memory_with_them():
    ids = np.arange(100, 600, dtype=np.int64)
    starts, ends, _rows = runs_of(ids)
    assert (int(starts[0]), int(ends[0])) == (100, 599)
    assert not np.shares_memory(starts, ids) and not np.shares_memory(ends, ids)
