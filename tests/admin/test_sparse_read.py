"""Sparse reads (ReadRequest.sparse), the re-replication / replicas-check read:
the run index's vectorised lookup against a naive oracle, and the real bookie
and the in-memory twin answering the same requests the same way."""
import random

import numpy as np
import pytest

from bookie_server.storage.run_index import LedgerIndex
from pybk_spark import errors
from pybk_spark.ledger.client import BookKeeper
from pybk_spark.transport.memory import MemoryTransportPool
from pybk_spark.protocol import ledger_metadata as lm
from pybk_spark.wire.entries import batch_to_bytes, make_batch


def _index(stored):
    idx = LedgerIndex()
    ids = np.array(sorted(stored), np.int64)
    if len(ids):
        breaks = np.flatnonzero(np.diff(ids) != 1) + 1
        starts = ids[np.concatenate(([0], breaks))]
        ends = ids[np.concatenate((breaks - 1, [len(ids) - 1]))]
        idx.add_runs(starts, ends, np.arange(len(starts), dtype=np.int64),
                     np.zeros(len(starts), np.int64))
    return idx


@pytest.mark.parametrize("seed", range(20))
def test_locate_sparse_matches_oracle(seed):
    rng = random.Random(seed)
    stored = {i for i in range(200) if rng.random() < 0.6}
    idx = _index(stored)
    first = rng.randrange(0, 220)
    last = first + rng.randrange(0, 80)
    limit = rng.randrange(1, 60)
    refs, rows, counts, piece_first = idx.locate_sparse(first, last, limit)
    got = []
    starts = idx.starts
    for r, row, n in zip(refs, rows, counts):
        got.extend(range(int(starts[r]) + int(row), int(starts[r]) + int(row) + int(n)))
    assert [int(f) for f in piece_first] == [int(starts[r]) + int(row) for r, row in zip(refs, rows)]
    want = sorted(e for e in stored if first <= e <= last)[:limit]
    assert got == want, (seed, first, last, limit)


def _entries(ledger_id, ids):
    return make_batch(ledger_id, ids, [-1] * len(ids), [2 * (i + 1) for i in ids],
                      [f"p{i}".encode() for i in ids], [b""] * len(ids))


def _check_sparse(transport, ledger_id, key):
    # stored: 0..9 and 20..29 except 25; written as two batches
    first = [i for i in range(10)]
    second = [i for i in range(20, 30) if i != 25]
    transport.add(ledger_id, key, batch_to_bytes(_entries(ledger_id, first))).result()
    transport.add(ledger_id, key, batch_to_bytes(_entries(ledger_id, second))).result()
    res = transport.read(ledger_id, 5, 27, max_entries=100, sparse=True).result()
    assert res.batch.column("entry_id").to_pylist() == [5, 6, 7, 8, 9, 20, 21, 22, 23, 24,
                                                        26, 27]
    assert res.end == "COMPLETE"
    lim = transport.read(ledger_id, 0, 29, max_entries=12, sparse=True).result()
    assert lim.end == "LIMIT" and lim.batch.column("entry_id").to_pylist()[-1] == 21
    empty = transport.read(ledger_id, 10, 19, max_entries=100, sparse=True).result()
    assert empty.batch.num_rows == 0 and empty.end == "COMPLETE"
    with pytest.raises(errors.NoSuchLedger):
        transport.read(ledger_id + 10**9, 0, 5, sparse=True).result()
    # striped by first replica: only ids e % E == slot; max_entries counts before the filter
    mine = transport.read(ledger_id, 5, 27, max_entries=100, sparse=True, stripe=(3, 1)).result()
    assert mine.batch.column("entry_id").to_pylist() == [7, 22] and mine.end == "COMPLETE"
    mine = transport.read(ledger_id, 0, 29, max_entries=12, sparse=True, stripe=(3, 0)).result()
    assert mine.batch.column("entry_id").to_pylist() == [0, 3, 6, 9, 21] and mine.end == "LIMIT"
    none = transport.read(ledger_id, 0, 29, max_entries=2, sparse=True, stripe=(3, 2)).result()
    assert none.batch.num_rows == 0 and none.end == "LIMIT"
    # the default (contiguous) read is unchanged
    run = transport.read(ledger_id, 20, 29, max_entries=100).result()
    assert run.batch.column("entry_id").to_pylist() == [20, 21, 22, 23, 24]


def test_sparse_read_real_bookie(cluster):
    with BookKeeper(cluster.metadata_uri) as bk:
        lid = bk.metadata_store.next_id()
        _check_sparse(bk.transports.get(cluster.bookie_ids[0]), lid, lm.master_key(b""))


def test_sparse_read_memory_twin():
    pool = MemoryTransportPool()
    pool.add_bookie("b0")
    _check_sparse(pool.get("b0"), 77, lm.master_key(b""))


class _NoSparse:
    """A bookie that predates sparse reads: ignores the flag."""

    def __init__(self, inner):
        self.inner = inner

    def read(self, *a, sparse=False, **k):
        return self.inner.read(*a, **k)


@pytest.mark.parametrize("legacy", [False, True])
def test_read_ids_sparse_and_legacy_fallback(legacy):
    from pybk_spark.admin.decisions.entry_sets import slot_entries
    from pybk_spark.admin.operations.replica_reads import read_ids
    pool = MemoryTransportPool()
    pool.add_bookie("b0")
    t = pool.get("b0")
    key = lm.master_key(b"")
    held = slot_entries(0, 299, 3, 2, 1)               # a striped slot: runs of 2
    t.add(5, key, batch_to_bytes(_entries(5, [int(i) for i in held]))).result()
    want = held[held % 7 != 0]                           # ask for a subset
    got = read_ids(_NoSparse(t) if legacy else t, 5, want, key, max_entries=40)
    assert not got.unreachable
    assert sorted(got.present_ids().tolist()) == want.tolist()
