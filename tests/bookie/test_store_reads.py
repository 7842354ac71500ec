"""The entry store's reads of every stored id of a span (a pull's and a
replicas check's sparse reads): each stored batch read whole from its file
around the page cache (``SegmentFiles.read_direct``), the same rows as the
memory-mapped reads give; buffered where the file system refuses O_DIRECT;
a file shorter than its index says is an I/O error, never short rows."""
from __future__ import annotations

import os
import shutil

import pytest

from bookie_server.storage.entry_store import EntryStore
from pybk_spark import errors
from pybk_spark.testing.bookie_process import entries_bytes, payload_for
from pybk_spark.wire.entries import batch_from_bytes, one_batch

LEDGER = 5


def _stored(directory: str) -> EntryStore:
    """A store holding ids 0..2999 of LEDGER in its segment files, in
    batches of 500 rows (stored as received) and 7 rows (merged)."""
    store = EntryStore(directory)
    for first in range(0, 2000, 500):
        store.add(LEDGER, batch_from_bytes(entries_bytes(LEDGER, range(first, first + 500))))
    for first in range(2000, 3000, 7):
        store.add(LEDGER, batch_from_bytes(
            entries_bytes(LEDGER, range(first, min(first + 7, 3000)))))
    store.flush()
    assert not store.cache.by_ledger
    return store


def _check_rows(store: EntryStore, first: int, last: int) -> None:
    whole, _ = store.read(LEDGER, first, last, max_entries=5000, max_bytes=64 << 20,
                          sparse=True)
    mapped, _ = store.read(LEDGER, first, last, max_entries=5000, max_bytes=64 << 20)
    assert whole.column(1).to_pylist() == list(range(first, last + 1))
    assert whole.column(3).to_pylist() == [payload_for(LEDGER, e) for e in range(first, last + 1)]
    # a large sparse read stays a table of its stored batches (sent gathered)
    assert one_batch(whole).equals(mapped)


def test_a_sparse_read_reads_stored_batches_whole_around_the_page_cache(tmp_path):
    store = _stored(str(tmp_path))
    for first, last in ((0, 2999), (250, 1750), (1999, 2011), (2990, 2999), (7, 7)):
        _check_rows(store, first, last)
    assert store.files.direct == hasattr(os, "O_DIRECT")


def test_a_file_system_without_o_direct_is_read_buffered(tmp_path):
    shm = "/dev/shm"
    if not os.path.isdir(shm) or not os.access(shm, os.W_OK):
        pytest.skip("no writable /dev/shm (tmpfs)")
    directory = os.path.join(shm, f"pybk-store-{os.getpid()}")
    try:
        store = _stored(directory)
        probe = store.files.path(next(iter(store.files.size)))
        try:
            os.close(os.open(probe, os.O_RDONLY | os.O_DIRECT))
            pytest.skip("this kernel's tmpfs accepts O_DIRECT")
        except OSError:
            pass
        _check_rows(store, 0, 2999)
        assert store.files.direct is False
    finally:
        shutil.rmtree(directory, ignore_errors=True)


def test_buffered_reads_give_the_same_rows(tmp_path):
    store = _stored(str(tmp_path))
    store.files.direct = False          # what a refusal of O_DIRECT leaves
    for first, last in ((0, 2999), (1999, 2011)):
        _check_rows(store, first, last)


def test_a_segment_shorter_than_its_index_is_an_io_error(tmp_path):
    store = _stored(str(tmp_path))
    (seg,) = [s for s in store.files.size if os.path.exists(store.files.path(s))]
    with open(store.files.path(seg), "r+b") as fh:
        fh.truncate(store.files.size[seg] // 2)
    with pytest.raises(errors.BookieIOError, match="ends before"):
        store.read(LEDGER, 0, 2999, max_entries=5000, max_bytes=64 << 20, sparse=True)
