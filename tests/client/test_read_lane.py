"""Entry reads over both read transports, against real bookie processes: the
read lane (plain TCP, transport/lane_client.py ReadLaneConnection) and gRPC's
ReadEntries must return the same batches, and the lane must survive what
the add lane survives (a restarted bookie on a new port, a reader that
stops waiting).  No timing thresholds."""
from __future__ import annotations

import signal
import time

import pytest

from pybk_spark import errors
from pybk_spark.ledger.client import BookKeeper
from pybk_spark.transport.lane_client import ReadLaneConnection
from pybk_spark.transport.grpc_bookie import registration_of


def _client(cluster, read_transport: str) -> BookKeeper:
    return BookKeeper(cluster.metadata_uri, conf={"explicit_lac_interval_ms": 0,
                                                  "read_transport": read_transport})


@pytest.mark.parametrize("quorum", [(3, 3, 2), (3, 2, 2)], ids=["run", "striped"])
def test_both_read_transports_return_the_same_batches(cluster, quorum):
    writer = _client(cluster, "lane")
    try:
        lh = writer.create_ledger(*quorum)
        payloads = [bytes([i % 251]) * (1 + 997 * (i % 7)) for i in range(3000)]
        lh.add_entries(payloads)
        lh.close()
    finally:
        writer.close()
    seen = {}
    for transport in ("lane", "grpc"):
        bk = _client(cluster, transport)
        try:
            rh = bk.open_ledger(lh.ledger_id, recovery=False)
            batches = list(rh.read_batches(0, 2999, max_bytes=1 << 20))
            seen[transport] = [p for b in batches for p in b.column("payload").to_pylist()]
            assert [e.payload for e in rh.read(10, 12)] == payloads[10:13]
            # the transport asked for is the one in use (the bookies register a lane)
            clients = [bk.transports.get(b) for b in lh.metadata.current_ensemble]
            if transport == "lane":
                assert any(isinstance(c.read_connection, ReadLaneConnection) for c in clients)
            else:
                assert not any(c.reads_over_lane for c in clients)
        finally:
            bk.close()
    assert seen["lane"] == seen["grpc"] == payloads


def test_a_cancelled_read_leaves_the_connection_usable(cluster):
    bk = _client(cluster, "lane")
    try:
        lh = bk.create_ledger(3, 3, 2)
        lh.add_entries([b"x" * 1000] * 50)
        t = bk.transports.get(lh.metadata.current_ensemble[0])
        first = t.read(lh.ledger_id, 0, 49)
        first.cancel()                  # the answer still comes; it is dropped
        again = t.read(lh.ledger_id, 0, 49).result(timeout=30)
        assert again.batch.column("entry_id").to_pylist() == list(range(50))
        lh.close()
    finally:
        bk.close()


def test_a_restarted_bookie_is_read_again_without_invalidating(cluster):
    """The read lane looks up a restarted bookie's new lane port when the
    old one refuses, like the add lane."""
    bk = _client(cluster, "lane")
    try:
        lh = bk.create_ledger(3, 3, 3)
        lh.add_entries([b"y%d" % i for i in range(20)])
        lh.close()
        bookie = lh.metadata.current_ensemble[0]
        t = bk.transports.get(bookie)
        assert t.read(lh.ledger_id, 0, 19).result(timeout=30).batch.num_rows == 20
        before = (registration_of(bk.metadata_store, bookie) or {}).get("add_lane_address")
        cluster.kill_bookie(bookie, signal.SIGKILL)
        cluster.heal()
        cluster.wait_registered(bookie)
        after = (registration_of(bk.metadata_store, bookie) or {}).get("add_lane_address")
        assert before and after and before != after
        deadline = time.monotonic() + 30
        while True:                  # the first read may meet the dead connection
            try:
                answer = t.read(lh.ledger_id, 0, 19).result(timeout=30)
                break
            except errors.BookieUnavailable:
                assert time.monotonic() < deadline
        assert answer.batch.column("payload").to_pylist() == [b"y%d" % i for i in range(20)]
        assert bk.transports.get(bookie) is t
    finally:
        bk.close()
