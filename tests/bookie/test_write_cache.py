"""The write cache's lone adds: a ledger's records held as received in one
growing run (one ref, one index run per stretch of consecutive ids), read
from memory as the same rows a segment gives after the checkpoint, counted
in the write cache's bytes until then; a checkpoint's snapshot closes the
runs, so adds made while it writes go to new ones."""
from __future__ import annotations

import pyarrow as pa
import pytest

from bookie_server.storage.entry_store import EntryStore
from bookie_server.storage.write_cache import Ref, decode_records
from pybk_spark.testing.bookie_process import payload_for
from pybk_spark.wire.entries import entry_record_head

LEDGER = 9


def _record(entry_id: int, digest: bytes = b"dg") -> bytes:
    payload = payload_for(LEDGER, entry_id)
    return entry_record_head(LEDGER, entry_id, entry_id - 1, 100 * entry_id, digest) + payload


def _rows(batch: pa.RecordBatch) -> list[tuple]:
    return list(zip(*(batch.column(i).to_pylist() for i in range(batch.num_columns))))


def _read(store: EntryStore, first: int, last: int, **kw) -> pa.RecordBatch:
    batch, _ = store.read(LEDGER, first, last, max_entries=1000, max_bytes=64 << 20, **kw)
    return batch


def _add(store: EntryStore, ids) -> int:
    return sum(store.add_entry(LEDGER, e, _record(e)) for e in ids)


def test_lone_adds_of_a_ledger_are_one_run_read_like_their_segment(tmp_path):
    store = EntryStore(str(tmp_path))
    assert _add(store, [*range(0, 40), *range(50, 60)]) == 50
    assert _add(store, [3, 55]) == 0                          # the first copy is kept
    assert len(store.refs) == 1 and store.cache.by_ledger == {LEDGER: [1]}
    assert len(store.ledgers[LEDGER].table_parts()[0]) == 2   # ids 0..39 and 50..59
    assert store.write_cache_bytes == sum(len(_record(e)) for e in [*range(40), *range(50, 60)])
    cases = [((0, 39), {}), ((5, 5), {}), ((30, 59), {"sparse": True}),
             ((0, 59), {"sparse": True, "stripe": (3, 1)}), ((52, 57), {"sparse": True})]
    before = [_rows(_read(store, a, b, **kw)) for (a, b), kw in cases]
    assert [r[1] for r in before[0]] == list(range(40))
    assert [r[1] for r in before[2]] == [*range(30, 40), *range(50, 60)]
    assert [r[1] for r in before[3]] == [e for e in [*range(40), *range(50, 60)] if e % 3 == 1]
    assert before[4][0] == (LEDGER, 52, 51, payload_for(LEDGER, 52), b"dg", 5200)
    store.flush()
    assert store.write_cache_bytes == 0 and not store.cache.by_ledger
    assert all(not ref.in_memory for ref in store.refs.values())
    assert [_rows(_read(store, a, b, **kw)) for (a, b), kw in cases] == before


def test_adds_during_a_checkpoint_go_to_a_new_run(tmp_path):
    store = EntryStore(str(tmp_path))
    _add(store, range(0, 10))
    snap = store.flush_begin()
    _add(store, range(10, 20))                  # after the snapshot: a new run
    assert len(store.refs) == 2
    assert [r[1] for r in _rows(_read(store, 0, 19))] == list(range(20))
    store.write_snapshot(snap)
    store.flush_commit(snap)
    assert store.write_cache_bytes == sum(len(_record(e)) for e in range(10, 20))
    assert [r[1] for r in _rows(_read(store, 0, 19, sparse=True))] == list(range(20))
    store.flush()
    assert store.write_cache_bytes == 0
    assert [r[1] for r in _rows(_read(store, 0, 19))] == list(range(20))


def test_a_dropped_ledger_leaves_no_bytes_and_a_new_run_after_it(tmp_path):
    store = EntryStore(str(tmp_path))
    _add(store, range(0, 5))
    store.drop_ledger(LEDGER)
    assert store.write_cache_bytes == 0 and not store.refs
    _add(store, range(0, 3))                   # the id again: a run of its own
    assert [r[1] for r in _rows(_read(store, 0, 4))] == [0, 1, 2]
    assert store.write_cache_bytes == sum(len(_record(e)) for e in range(3))


def test_records_of_mixed_digest_sizes_decode_alike(tmp_path):
    store = EntryStore(str(tmp_path))
    for e in range(6):
        store.add_entry(LEDGER, e, _record(e, b"d" * (e % 3)))
    before = _rows(_read(store, 0, 5))
    assert [r[4] for r in before] == [b"d" * (e % 3) for e in range(6)]
    store.flush()
    assert _rows(_read(store, 0, 5)) == before


def test_lone_adds_out_of_order_are_read_in_id_order(tmp_path):
    store = EntryStore(str(tmp_path))
    order = [3, 1, 2, 0, 4, 7, 5, 6]
    _add(store, order)
    want = list(range(8))
    assert [r[1] for r in _rows(_read(store, 0, 7))] == want
    assert [r[1] for r in _rows(_read(store, 0, 7, sparse=True))] == want
    before = _rows(_read(store, 0, 7))
    store.flush()
    assert _rows(_read(store, 0, 7)) == before


def test_a_run_is_read_from_a_copy_of_its_rows_and_never_decoded_in_place(tmp_path):
    # a checkpoint frees a flushed run's list without the store's lock, so a
    # read decodes the rows it copied under the lock, not the run's list
    store = EntryStore(str(tmp_path))
    _add(store, range(0, 10))
    (ref,) = store.refs.values()
    assert ref.batch is None and ref.in_memory
    with store.lock:
        taken = ref.records(2, 5)
    store.flush()                               # the run's list is freed
    assert ref.entries == [] and ref.batch is None
    assert taken == [_record(e) for e in range(2, 7)]
    assert [r[1] for r in _rows(decode_records(taken))] == list(range(2, 7))
    assert [r[1] for r in _rows(_read(store, 0, 9))] == list(range(10))


def test_a_run_handed_to_the_segment_reads_is_refused_naming_it(tmp_path):
    """A run is records, not a stored batch: ``segment_files``' whole-batch
    reads refuse it (and a memory ref with no segment) with a ValueError
    naming the ref, rather than open segment -1; the store still reads the
    run through its records."""
    store = EntryStore(str(tmp_path))
    _add(store, range(0, 5))
    (run,) = store.refs.values()
    assert run.entries is not None and run.batch is None and run.segment == -1
    for read in (store.files.batch_of, store.files.batch_whole):
        with pytest.raises(ValueError, match=rf"ref of ledger {LEDGER} \(segment -1, offset 0\) "
                                             r"is a write-cache run of 5 lone add\(s\)"):
            read(run)
        with pytest.raises(ValueError, match="a memory ref with no batch and no segment"):
            read(Ref(LEDGER))
    assert [r[1] for r in _rows(_read(store, 0, 4, sparse=True))] == list(range(5))
