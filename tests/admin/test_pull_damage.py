"""A pull never copies an entry whose stored bytes are damaged on its
source (private etcd + 4 bookie-server processes; destructive).

The source bookie serves the ledger from its files (a clean restart first);
one stored payload is then damaged on its disk, under the running bookie,
which does not know it.  The replacement's digest check refuses that entry:
the pull copies every other id and reports the damaged one as not copied,
the replacement never stores it, and when no intact replica of it is left
the fragment's copy fails with a typed error and its ensemble is not
changed."""
from __future__ import annotations

import os
import signal

import pytest

from pybk_spark import errors
from pybk_spark.admin.decisions import entry_sets as es
from pybk_spark.admin.operations import rereplicate as rr
from pybk_spark.protocol.distribution import holds
from pybk_spark.transport.base import PullSource
from pybk_spark.transport.grpc_bookie import registration_of

from admin_helpers import registered, wait_until

N = 3000
E, QW = 3, 2


@pytest.fixture(scope="module")
def damage_cluster(tmp_path_factory):
    from pybk_spark.testing.fixtures import bookie_server_available, private_cluster
    if not bookie_server_available():
        pytest.skip("bookie_server is not available")
    yield from private_cluster(tmp_path_factory.mktemp("pull-damage"), num_bookies=4)


def _payloads(n: int) -> list[bytes]:
    return [f"entry-{i:06d}-".encode() + os.urandom(290) for i in range(n)]


def _damage(data_dir, payload: bytes) -> int:
    """Flip 4 bytes in the middle of ``payload`` in every file of the bookie
    that holds it (journal and segment files); the copies damaged."""
    hits = 0
    for root, _dirs, files in os.walk(data_dir):
        for name in files:
            path = os.path.join(root, name)
            with open(path, "rb") as fh:
                data = fh.read()
            at = data.find(payload)
            while at >= 0:
                with open(path, "r+b") as fh:
                    fh.seek(at + len(payload) // 2)
                    fh.write(bytes(b ^ 0xFF for b in payload[len(payload) // 2:][:4]))
                    os.fsync(fh.fileno())
                hits += 1
                at = data.find(payload, at + 1)
    return hits


def test_an_entry_damaged_on_the_source_is_never_copied(damage_cluster):
    from pybk_spark.ledger.client import BookKeeper
    cluster = damage_cluster
    with BookKeeper(cluster.metadata_uri) as bk:
        data = _payloads(N)
        lh = bk.create_ledger(E, QW, 2)
        lh.add_entries(data)
        lh.close()
        lid = lh.ledger_id
        md = bk.get_ledger_metadata(lid)
        ensemble = md.current_ensemble
        lost_slot = 0
        wanted = es.slot_entries(0, N - 1, E, QW, lost_slot)
        bad = int(wanted[len(wanted) // 2])
        source_slot = next(s for s in (bad % E, (bad % E + 1) % E) if s != lost_slot)
        source = ensemble[source_slot]
        held = wanted[holds(wanted, E, QW, source_slot)]     # what only the source holds now

        cluster.kill_bookie(source, signal.SIGTERM)          # a clean stop: served from files
        cluster.start_bookie(source)
        assert _damage(cluster.bookie_data_dir(source), data[bad]) >= 1

        target = next(b for b in cluster.bookie_ids if b not in ensemble)
        reg = registration_of(bk.metadata_store, source)
        key, digester = rr.access_key(bk, md, None)
        got = bk.transports.get(target).pull(
            lid, key, PullSource(source, reg["address"], reg.get("add_lane_address") or ""),
            held, digester.digest_type, timeout=120).result()
        assert list(got.missing) == [bad], got
        assert got.entries == len(held) - 1
        assert "absent or corrupt on the peer" in got.message, got.message
        target_reads = bk.transports.get(target)
        with pytest.raises(errors.NoSuchEntry):
            target_reads.read(lid, bad, bad, master_key=key, timeout=10).result()
        other = int(held[held != bad][0])
        res = target_reads.read(lid, other, other, master_key=key, timeout=10).result()
        assert res.batch.column("payload")[0].as_py() == data[other]

        # the lost bookie gone, the damaged entry has no intact replica left:
        # the fragment's copy fails, typed, and its ensemble stays as it was
        victim = ensemble[lost_slot]
        cluster.kill_bookie(victim)
        wait_until(lambda: not registered(bk.metadata_store, victim), 60, f"{victim} unregistered")
        (work,) = [w for w in rr.run_audit(bk, named=[victim]).work if w.ledger_id == lid]
        row = rr.copy_fragment(bk, work)
        assert row["outcome"] == "failed" and row["reason"] == "ReadError", row
        assert str(bad) in row["error"] and "no surviving intact replica" in row["error"], row
        assert "absent or corrupt on the peer" in row.get("pull_error", ""), row
        assert bk.get_ledger_metadata(lid).current_ensemble == ensemble
