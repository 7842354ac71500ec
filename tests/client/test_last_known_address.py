"""A bookie briefly absent from the registry, against real processes: the
client reads from the address it last registered while the bookie still
answers there, refuses to send it adds, and fails a read the address does
not answer with the usual typed errors.

The bookies register with a long lease (``registration_ttl_s = 60``), so a
registration deleted by the test stays absent for the refresh period
(ttl / 3) while the process keeps serving."""
from __future__ import annotations

import signal

import pytest

from pybk_spark import errors
from pybk_spark.ledger.client import BookKeeper
from pybk_spark.metadata import keys
from pybk_spark.testing.fixtures import bookie_server_available, private_cluster
from pybk_spark.transport.grpc_bookie import registration_of

pytestmark = pytest.mark.skipif(not bookie_server_available(),
                                reason="bookie_server is not available yet")

PAYLOADS = [b"entry-%d" % i for i in range(20)]


@pytest.fixture(scope="module")
def slow_lease_cluster(tmp_path_factory):
    yield from private_cluster(tmp_path_factory.mktemp("last-known"), num_bookies=2,
                               bookie_conf={"registration_ttl_s": 60})


def _single_replica_ledger(uri: str) -> tuple[int, str]:
    """A closed ledger whose only replica is on one bookie (every read goes there)."""
    with BookKeeper(uri) as writer:
        lh = writer.create_ledger(1, 1, 1)
        lh.add_entries(PAYLOADS)
        lh.close()
        return lh.ledger_id, lh.metadata.current_ensemble[0]


def _unregister(cluster, bookie_id: str) -> None:
    """Delete the bookie's registration key; its process keeps running."""
    assert cluster.store.delete(keys.bookie_key("writable", bookie_id))
    assert registration_of(cluster.store, bookie_id) is None
    assert cluster.bookie_pid(bookie_id) is not None


def test_reads_go_to_the_last_known_address_while_unregistered(slow_lease_cluster):
    cluster = slow_lease_cluster
    ledger_id, bookie = _single_replica_ledger(cluster.metadata_uri)
    with BookKeeper(cluster.metadata_uri) as reader:
        rh = reader.open_ledger(ledger_id, recovery=False)
        assert [e.payload for e in rh.read(0, 19)] == PAYLOADS
        address = reader.transports.last_known_address(bookie)
        assert address == cluster.bookie_address(bookie)

        _unregister(cluster, bookie)
        reader.transports.invalidate(bookie)    # what a read does after a lost connection
        assert [e.payload for e in rh.read(0, 19)] == PAYLOADS
        batches = list(rh.read_batches(5, 14))
        assert [p for b in batches for p in b.column("payload").to_pylist()] == PAYLOADS[5:15]
        again = reader.open_ledger(ledger_id, recovery=False)     # a new handle, same client
        assert [e.payload for e in again.read(19, 19)] == PAYLOADS[19:]
        # adds are not sent to an address the registry no longer vouches for
        with pytest.raises(errors.BookieUnavailable, match="bookie not registered"):
            reader.transports.get(bookie).add(ledger_id, b"", b"").result(10)
        # the test proved something only if the registration stayed absent throughout
        assert registration_of(cluster.store, bookie) is None



def test_a_read_the_last_known_address_does_not_answer_is_a_typed_error(slow_lease_cluster):
    cluster = slow_lease_cluster
    ledger_id, bookie = _single_replica_ledger(cluster.metadata_uri)
    try:
        with BookKeeper(cluster.metadata_uri) as reader:
            rh = reader.open_ledger(ledger_id, recovery=False)
            assert [e.payload for e in rh.read(0, 0)] == PAYLOADS[:1]
            _unregister(cluster, bookie)
            reader.transports.invalidate(bookie)
            cluster.kill_bookie(bookie, signal.SIGKILL)
            with pytest.raises(errors.ReadError, match="read failed on every replica") as err:
                rh.read(0, 19)
            assert "last known address" in str(err.value)
            assert cluster.bookie_address(bookie) in str(err.value)
    finally:
        cluster.heal()


def test_a_bookie_never_seen_registered_stays_unavailable(slow_lease_cluster):
    with BookKeeper(slow_lease_cluster.metadata_uri) as client:
        with pytest.raises(errors.BookieUnavailable, match="bookie not registered"):
            client.transports.get("no-such-bookie").read(1, 0, 0).result(10)
        assert client.transports.last_known_address("no-such-bookie") == ""
