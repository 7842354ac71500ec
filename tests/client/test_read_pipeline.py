"""Pipelined range reads (``read_windows_in_flight``): several windows are
requested ahead, yet batches come out contiguous, in order and verified, even
when windows are answered short (a corrupt row, a replica missing entries) or
fail (a bookie down).  In-memory bookies; the same reads run against real
bookie-server processes in test_client_real.py and the Spark suites."""
import concurrent.futures as cf
import json
import random

import pytest

from pybk_spark import errors
from pybk_spark.ledger.client import BookKeeper
from pybk_spark.config import ClientConfig
from pybk_spark.metadata.memory_store import MemoryMetadataStore
from pybk_spark.transport.memory import MemoryTransportPool

N = 200


class CountingPool(MemoryTransportPool):
    """Counts read requests, so a test can see how far ahead the reader asked."""

    def __init__(self):
        super().__init__()
        self.reads = 0
        self.lookup_fails: set[str] = set()     # get() raises, as with etcd down
        self.hold_after = 1 << 62                # reads past this many never answer...
        self.held: list = []                     # ...and their futures land here

    def get(self, bookie_id):
        if bookie_id in self.lookup_fails:
            raise errors.MetadataUnavailable("etcd unavailable (test)")
        return _CountingTransport(self, super().get(bookie_id))


class _CountingTransport:
    def __init__(self, pool: CountingPool, inner):
        self._pool, self._inner = pool, inner

    def read(self, *a, **k):
        self._pool.reads += 1
        if self._pool.reads > self._pool.hold_after:
            fut = cf.Future()
            self._pool.held.append(fut)
            return fut
        return self._inner.read(*a, **k)

    def __getattr__(self, name):
        return getattr(self._inner, name)


def _client(depth: int, seed: int):
    store, pool = MemoryMetadataStore(), CountingPool()
    for i in range(5):
        pool.add_bookie(f"b{i}")
        store.put(f"bookies/writable/b{i}", json.dumps({"bookie_id": f"b{i}", "address": "",
                                                          "rack": ""}).encode())
    conf = ClientConfig(read_windows_in_flight=depth)
    return BookKeeper(store=store, transports=pool, rng=random.Random(seed), background=False,
                      conf=conf), pool


def _damage(pool, lh, rng: random.Random, max_victims: int) -> None:
    """Per entry, corrupt one copy and drop another on up to ``max_victims``
    replicas of its write set; at least one intact copy always remains."""
    md = lh.metadata
    ensemble = md.current_ensemble
    for e in range(N):
        holders = [ensemble[(e + k) % len(ensemble)] for k in range(md.write_quorum)]
        for j, b in enumerate(rng.sample(holders, rng.randint(0, max_victims))):
            rows = pool.bookies[b].ledgers[lh.ledger_id].rows
            if j == 0:
                rows[e] = dict(rows[e], payload=b"garbage")
            else:
                del rows[e]


@pytest.mark.parametrize("depth", [1, 2, 3, 5])
@pytest.mark.parametrize("quorum", [(3, 3, 2), (4, 2, 2)], ids=["run", "striped"])
def test_windows_in_flight_keep_order_through_short_and_failed_answers(depth, quorum):
    seed = depth * 100 + quorum[0]
    rng = random.Random(seed)
    bk, pool = _client(depth, seed)
    lh = bk.create_ledger(*quorum)
    lh.add_entries([b"p%d" % i for i in range(N)])
    lh.close()
    _damage(pool, lh, rng, max_victims=quorum[1] - 1)
    rh = bk.open_ledger(lh.ledger_id)
    for max_entries in (1, 7, 64, 500):
        batches = list(rh.read_batches(0, N - 1, max_entries=max_entries))
        ids = [i for b in batches for i in b.column("entry_id").to_pylist()]
        payloads = [p for b in batches for p in b.column("payload").to_pylist()]
        assert ids == list(range(N)), f"seed {seed}, max_entries {max_entries}"
        assert payloads == [b"p%d" % i for i in range(N)], f"seed {seed}"
        assert all(0 < b.num_rows <= max_entries for b in batches)
    bk.close()


@pytest.mark.parametrize("depth", [1, 3])
def test_reader_asks_at_most_depth_windows_ahead(depth):
    bk, pool = _client(depth, 1)
    lh = bk.create_ledger(3, 3, 2)
    lh.add_entries([b"q%d" % i for i in range(N)])
    lh.close()
    rh = bk.open_ledger(lh.ledger_id)
    pool.reads = 0
    batches = rh.read_batches(0, N - 1, max_entries=10)
    next(batches)
    assert pool.reads == depth
    assert sum(b.num_rows for b in batches) == N - 10
    assert pool.reads == N // 10
    bk.close()


def test_a_bookie_down_mid_pipeline_fails_over():
    bk, pool = _client(3, 2)
    lh = bk.create_ledger(3, 3, 2)
    lh.add_entries([b"d%d" % i for i in range(N)])
    lh.close()
    rh = bk.open_ledger(lh.ledger_id)
    batches = rh.read_batches(0, N - 1, max_entries=20)
    first = next(batches)
    pool.down.add(lh.metadata.current_ensemble[1])    # the next windows asked of it fail
    rest = [p for b in batches for p in b.column("payload").to_pylist()]
    assert first.column("payload").to_pylist() + rest == [b"d%d" % i for i in range(N)]
    bk.close()


@pytest.mark.parametrize("quorum", [(3, 3, 2), (4, 2, 2)], ids=["run", "striped"])
def test_a_replica_that_cannot_be_looked_up_is_skipped_not_fatal(quorum):
    """A window requested ahead whose bookie's address lookup fails (etcd
    down, client not cached) fails over like a dead replica; only when no
    replica can be asked does the metadata error reach the reader."""
    bk, pool = _client(3, 3)
    lh = bk.create_ledger(*quorum)
    lh.add_entries([b"m%d" % i for i in range(N)])
    lh.close()
    rh = bk.open_ledger(lh.ledger_id)
    batches = rh.read_batches(0, N - 1, max_entries=20)
    first = next(batches)
    pool.lookup_fails.add(lh.metadata.current_ensemble[0])
    rest = [p for b in batches for p in b.column("payload").to_pylist()]
    assert first.column("payload").to_pylist() + rest == [b"m%d" % i for i in range(N)]
    pool.lookup_fails.update(lh.metadata.current_ensemble)
    with pytest.raises(errors.MetadataUnavailable):
        list(rh.read_batches(0, N - 1, max_entries=20))
    bk.close()


@pytest.mark.parametrize("quorum", [(3, 3, 2), (4, 2, 2)], ids=["run", "striped"])
def test_windows_still_in_flight_are_cancelled_when_the_reader_stops(quorum):
    """A consumer that stops early (a Spark LIMIT) must not leave reads
    running: closing the generator cancels every request still in flight."""
    bk, pool = _client(3, 4)
    lh = bk.create_ledger(*quorum)
    lh.add_entries([b"c%d" % i for i in range(N)])
    lh.close()
    rh = bk.open_ledger(lh.ledger_id)
    held: list[cf.Future] = []
    pool.hold_after = pool.reads + (1 if quorum[0] == quorum[1] else quorum[0])
    pool.held = held
    batches = rh.read_batches(0, N - 1, max_entries=10)
    assert next(batches).column("entry_id").to_pylist()[0] == 0
    assert held and not any(f.done() for f in held)
    batches.close()
    assert all(f.cancelled() for f in held)
    bk.close()
