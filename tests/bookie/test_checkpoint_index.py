"""The checkpoint's run index: a whole base and deltas of the ledgers that
changed (bookie_server/checkpoint_file.py, storage/store_index.py).

What a restart loads must always be the whole index as it stood at the
checkpoint, while a checkpoint writes only what changed since the last one.
"""
from __future__ import annotations

import json

import numpy as np
import pyarrow as pa
import pytest

from bookie_server import checkpoint_file
from bookie_server.bookie import Bookie
from bookie_server.config import BookieConfig
from bookie_server.storage import store_index
from bookie_server.storage.entry_store import EntryStore
from pybk_spark import errors
from pybk_spark.testing.bookie_process import entries_bytes, payload_for
from pybk_spark.wire.entries import batch_from_bytes


def rows(table) -> list[tuple]:
    return sorted(zip(*(table.column(n).to_pylist() for n in table.column_names)))


def doc(tmp_path) -> dict:
    return json.loads((tmp_path / "checkpoint.json").read_text())


def loaded_matches_store(tmp_path, bookie) -> None:
    _doc, table = checkpoint_file.read(str(tmp_path))
    assert rows(table) == rows(store_index.index_table(bookie.store))


@pytest.fixture
def cfg(tmp_path):
    return BookieConfig(data_dir=str(tmp_path), flush_interval_s=3600,
                        compaction_min_live_ratio=0.5)


def test_a_checkpoint_writes_only_the_ledgers_that_changed(tmp_path, cfg):
    b = Bookie(cfg).open(background=False)
    try:
        for ledger in range(1, 41):
            b.add(ledger, b"k", entries_bytes(ledger, range(0, 5)))
        b.checkpoint()                              # the first one: the whole index
        first = doc(tmp_path)
        assert first["index_deltas"] == []
        for e in range(5, 8):                       # one ledger grows: one new run
            b.add(7, b"k", entries_bytes(7, [e]))
        b.checkpoint()
        second = doc(tmp_path)
        assert second["index"] == first["index"]
        (delta,) = second["index_deltas"]
        # ledger 7's new run (entries 5-7, flushed together), no other's
        assert delta["appended"] == [7] and delta["replaced"] == [] and delta["rows"] == 1
        loaded_matches_store(tmp_path, b)
        names = {p.name for p in tmp_path.glob("index-*")}
        assert names == {first["index"], delta["file"]}
    finally:
        b.close(checkpoint=False)


def test_a_checkpoint_with_nothing_changed_writes_nothing(tmp_path, cfg):
    b = Bookie(cfg).open(background=False)
    try:
        b.add(1, b"k", entries_bytes(1, range(0, 5)))
        b.checkpoint()
        before = doc(tmp_path)
        mtime = (tmp_path / "checkpoint.json").stat().st_mtime_ns
        b.checkpoint()
        b.checkpoint()
        assert doc(tmp_path) == before
        assert (tmp_path / "checkpoint.json").stat().st_mtime_ns == mtime
        b.fence(1, b"k")                            # a state change: a new document, no index file
        b.checkpoint()
        after = doc(tmp_path)
        assert after["generation"] == before["generation"] + 1
        assert after["index"] == before["index"] and after["index_deltas"] == []
        assert any(s["fenced"] for s in after["states"])
    finally:
        b.close(checkpoint=False)


def test_deltas_fold_into_a_new_base(tmp_path, cfg, monkeypatch):
    monkeypatch.setattr(checkpoint_file, "MAX_DELTAS", 3)
    b = Bookie(cfg).open(background=False)
    try:
        b.add(1, b"k", entries_bytes(1, [0]))
        b.checkpoint()
        bases = {doc(tmp_path)["index"]}
        lengths = []
        for e in range(1, 9):
            b.add(2, b"k", entries_bytes(2, [2 * e]))     # a gap each time: a new run
            b.checkpoint()
            d = doc(tmp_path)
            bases.add(d["index"])
            lengths.append(len(d["index_deltas"]))
            loaded_matches_store(tmp_path, b)
            assert {p.name for p in tmp_path.glob("index-*")} == \
                {d["index"], *(x["file"] for x in d["index_deltas"])}
        assert lengths == [1, 2, 3, 0, 1, 2, 3, 0]
        assert len(bases) == 3
    finally:
        b.close(checkpoint=False)


def test_deleted_and_compacted_ledgers_in_deltas_survive_a_restart(tmp_path, cfg):
    b = Bookie(cfg).open(background=False)
    for i in range(10):
        b.add(1, b"k", entries_bytes(1, range(10 * i, 10 * i + 10), size=500))
    b.add(2, b"k", entries_bytes(2, range(0, 10), size=500))
    b.add(3, b"k", entries_bytes(3, range(0, 3), size=500))
    b.checkpoint()                                  # base
    b.delete_ledger(1)                              # its segment goes sparse: 2 and 3 move
    b.checkpoint()
    (delta,) = doc(tmp_path)["index_deltas"]
    assert delta["replaced"] == [1, 2, 3] and delta["appended"] == []
    loaded_matches_store(tmp_path, b)
    b.close(checkpoint=False)

    b = Bookie(cfg).open(background=False)
    try:
        with pytest.raises(errors.NoSuchLedger):
            b.read(1, 0, 0)
        assert b.read(2, 0, 9).batch.column(3).to_pylist() == \
            [payload_for(2, e, 500) for e in range(10)]
        assert b.read(3, 0, 2).batch.num_rows == 3
    finally:
        b.close(checkpoint=False)


def test_every_change_to_segment_runs_marks_its_ledger(tmp_path):
    """flush, quarantine and drop each mark exactly the ledgers they touch."""
    store = EntryStore(str(tmp_path))
    for ledger in (1, 2, 3):
        store.add(ledger, batch_from_bytes(entries_bytes(ledger, range(0, 4))))
    store.flush()
    delta = store_index.take_delta(store)
    assert delta.appended == [1, 2, 3] and delta.replaced == [] and delta.table.num_rows == 3
    assert store_index.take_delta(store).empty
    (ref_id,) = np.unique(store.ledgers[2].table_parts()[2]).tolist()
    assert store.quarantine(ref_id) == [(0, 3)]
    store.drop_ledger(3)
    delta = store_index.take_delta(store)
    assert delta.replaced == [2, 3] and delta.appended == [] and delta.table.num_rows == 0
    assert set(store_index.index_table(store).column("ledger").to_pylist()) == {1}


def test_a_checkpoint_cuts_only_changed_ledgers_even_for_a_new_base(tmp_path, cfg, monkeypatch):
    """Under the store lock a checkpoint visits the ledgers that changed,
    never the whole store, also when it writes a new base: that one is
    folded from the files."""
    monkeypatch.setattr(checkpoint_file, "MAX_DELTAS", 1)
    cut_sizes: list[int] = []
    rows_of = store_index._rows

    def counting(store, wanted):
        cut_sizes.append(len(wanted))
        return rows_of(store, wanted)
    monkeypatch.setattr(store_index, "_rows", counting)
    b = Bookie(cfg).open(background=False)
    try:
        for ledger in range(1, 31):
            b.add(ledger, b"k", entries_bytes(ledger, range(0, 3)))
        b.checkpoint()
        deltas = []
        for e in (5, 7, 9):                         # a delta, then a new base, then a delta
            b.add(4, b"k", entries_bytes(4, [e]))
            cut_sizes.clear()
            b.checkpoint()
            assert cut_sizes == [1]
            deltas.append(len(doc(tmp_path)["index_deltas"]))
            loaded_matches_store(tmp_path, b)
        assert deltas == [1, 0, 1]
    finally:
        b.close(checkpoint=False)


def test_a_restart_goes_on_from_the_files_it_loaded(tmp_path, cfg):
    b = Bookie(cfg).open(background=False)
    for ledger in range(1, 11):
        b.add(ledger, b"k", entries_bytes(ledger, range(0, 4)))
    b.checkpoint()
    b.add(3, b"k", entries_bytes(3, [6]))
    b.checkpoint()
    before = doc(tmp_path)
    b.close(checkpoint=False)

    b = Bookie(cfg).open(background=False)
    try:
        b.add(5, b"k", entries_bytes(5, [9]))
        b.checkpoint()
        after = doc(tmp_path)
        assert after["index"] == before["index"]                  # no new base for a restart
        assert after["index_deltas"][-1]["appended"] == [5]
        assert after["index_deltas"][:-1] == before["index_deltas"]
        loaded_matches_store(tmp_path, b)
    finally:
        b.close(checkpoint=False)


def test_a_checkpoint_from_before_index_rows_folds_a_new_base(tmp_path, cfg):
    """A checkpoint document written before ``index_rows`` was recorded: the
    next checkpoint folds its files into a new base (it cannot size them)."""
    b = Bookie(cfg).open(background=False)
    for ledger in (1, 2):
        b.add(ledger, b"k", entries_bytes(ledger, range(0, 4)))
    b.checkpoint()
    b.close(checkpoint=False)
    old = doc(tmp_path)
    del old["index_rows"]
    (tmp_path / "checkpoint.json").write_text(json.dumps(old))

    b = Bookie(cfg).open(background=False)
    try:
        b.add(2, b"k", entries_bytes(2, [8]))
        b.checkpoint()
        new = doc(tmp_path)
        assert new["index"] != old["index"] and new["index_deltas"] == []
        assert new["index_rows"] == 3
        loaded_matches_store(tmp_path, b)
    finally:
        b.close(checkpoint=False)


def test_fold_keeps_the_last_delta_naming_a_ledger():
    def t(runs):
        cols = list(zip(*runs)) if runs else [[] for _ in range(7)]
        return pa.Table.from_arrays([pa.array(c, pa.int64()) for c in cols],
                                    schema=store_index.INDEX_SCHEMA)
    base = t([(1, 0, 3, 1, 0, 10, 4), (2, 0, 3, 1, 10, 10, 4), (3, 0, 0, 1, 20, 5, 1)])
    d1 = t([(2, 0, 5, 2, 0, 20, 6), (4, 0, 1, 2, 20, 5, 2)])
    d2 = t([(2, 0, 7, 3, 0, 30, 8)])
    d3 = t([(1, 4, 6, 4, 0, 10, 3), (2, 8, 9, 4, 10, 10, 2)])
    D = store_index.IndexDelta
    folded = store_index.fold(base, [D(d1, [2, 3, 4]), D(d2, [2])])
    assert rows(folded) == [(1, 0, 3, 1, 0, 10, 4), (2, 0, 7, 3, 0, 30, 8), (4, 0, 1, 2, 20, 5, 2)]
    # appends add to what stands; a later replacement supersedes earlier appends
    folded = store_index.fold(base, [D(d3, [], [1, 2]), D(d2, [2])])
    assert rows(folded) == [(1, 0, 3, 1, 0, 10, 4), (1, 4, 6, 4, 0, 10, 3),
                            (2, 0, 7, 3, 0, 30, 8), (3, 0, 0, 1, 20, 5, 1)]
    folded = store_index.fold(base, [D(d2, [2]), D(d3, [], [1, 2])])
    assert rows(folded) == [(1, 0, 3, 1, 0, 10, 4), (1, 4, 6, 4, 0, 10, 3),
                            (2, 0, 7, 3, 0, 30, 8), (2, 8, 9, 4, 10, 10, 2), (3, 0, 0, 1, 20, 5, 1)]
    assert store_index.fold(base, []) is base


def test_a_long_ledger_persists_only_its_new_runs(tmp_path, cfg):
    """A ledger written across many checkpoints: each one persists the runs
    its flush added, not every run the ledger has."""
    b = Bookie(cfg).open(background=False)
    try:
        sizes = []
        for i in range(6):
            b.add(1, b"k", entries_bytes(1, range(10 * i, 10 * i + 10)))
            b.checkpoint()
            d = doc(tmp_path)
            sizes.append(d["index_deltas"][-1]["rows"] if d["index_deltas"] else d["index_rows"])
            loaded_matches_store(tmp_path, b)
        assert sizes == [1] * 6
    finally:
        b.close(checkpoint=False)


def test_a_delta_written_before_appends_reads_as_a_replacement(tmp_path, cfg):
    """Checkpoints written by the previous version name their deltas'
    ledgers under ``ledgers``: every one replaced."""
    b = Bookie(cfg).open(background=False)
    for ledger in (1, 2):
        b.add(ledger, b"k", entries_bytes(ledger, range(0, 4)))
    b.checkpoint()
    b.add(2, b"k", entries_bytes(2, range(4, 8)))
    b.delete_ledger(1)
    b.checkpoint()
    b.close(checkpoint=False)
    old = doc(tmp_path)
    (delta,) = old["index_deltas"]
    # what the previous version wrote: ledger 2's whole run set, ledger 1 gone
    whole = checkpoint_file.read(str(tmp_path))[1]
    checkpoint_file._write_table(str(tmp_path / delta["file"]), whole, lambda fd: None)
    old["index_deltas"] = [{"file": delta["file"], "ledgers": [1, 2], "rows": whole.num_rows}]
    (tmp_path / "checkpoint.json").write_text(json.dumps(old))

    b = Bookie(cfg).open(background=False)
    try:
        with pytest.raises(errors.NoSuchLedger):
            b.read(1, 0, 0)
        assert b.read(2, 0, 7).batch.num_rows == 8
    finally:
        b.close(checkpoint=False)


@pytest.mark.parametrize("order", [[0, 1, 2, 3, 4, 5], [3, 0, 5, 1, 4, 2]])
def test_a_flush_stores_small_batches_in_entry_order_and_empties_the_cache(tmp_path, order):
    """Small batches are merged per ledger into one id-sorted batch: added in
    order (sorting skipped) or not (re-replication, recovery); the write
    cache's byte count goes back to zero."""
    store = EntryStore(str(tmp_path))
    for e in order:
        store.add(7, batch_from_bytes(entries_bytes(7, [e * 2, e * 2 + 1])))
    assert store.write_cache_bytes > 0
    store.flush()
    assert store.write_cache_bytes == 0 and not store.cache.by_ledger
    batch, limited = store.read(7, 0, 11, max_entries=100, max_bytes=1 << 20)
    assert not limited and batch.column(1).to_pylist() == list(range(12))
    assert batch.column(3).to_pylist() == [payload_for(7, e) for e in range(12)]
