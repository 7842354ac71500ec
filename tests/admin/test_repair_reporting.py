"""What an operator sees while bookies die, against a private etcd + 4 real
``bookie-server`` processes (SIGKILLed): the autorecovery round line names
each ledger it could not repair and why, ``triggeraudit`` reports a killed
bookie whose lease has not lapsed yet, and ``decommission`` retires a dead
id only once its data is safe."""
import re

import pytest

from pybk_spark.admin.decisions import audit
from pybk_spark.metadata import keys

from admin_helpers import pybk, registered, wait_until

TTL_S = 12          # registration lease: long enough to probe a killed bookie before it lapses


@pytest.fixture(scope="module")
def ttl_cluster(tmp_path_factory):
    from pybk_spark.testing.fixtures import bookie_server_available, private_cluster
    if not bookie_server_available():
        pytest.skip("bookie_server is not available")
    yield from private_cluster(tmp_path_factory.mktemp("repair-cluster"), num_bookies=4,
                               bookie_conf={"registration_ttl_s": TTL_S}, metrics=False)


@pytest.fixture(scope="module")
def bk(ttl_cluster):
    from pybk_spark.ledger.client import BookKeeper
    client = BookKeeper(ttl_cluster.metadata_uri)
    try:
        yield client
    finally:
        client.close()


def _closed_ledger(bk, n=200):
    lh = bk.create_ledger(3, 2, 2)
    lh.add_entries(b"r-%d" % i for i in range(n))
    lh.close()
    return lh


def _kill(cluster, bk, *victims):
    for v in victims:
        cluster.kill_bookie(v)
    for v in victims:
        wait_until(lambda: not registered(bk.metadata_store, v), 3 * TTL_S,  # noqa: B023
                   f"{v} unregistered")


def test_triggeraudit_reports_a_killed_bookie_as_suspect(ttl_cluster, bk):
    uri = ttl_cluster.metadata_uri
    victim = ttl_cluster.bookie_ids[-1]
    try:
        ttl_cluster.kill_bookie(victim)
        res = pybk("--json", "triggeraudit", "--metadata-uri", uri)
        assert res.rc == 0, res.out + res.err
        doc = res.json()
        assert doc["triggered"] and doc["bookies_probed"] == 4
        assert [s["bookie"] for s in doc["suspects"]] == [victim]
        assert 0 <= doc["suspects"][0]["lease_lapses_in_s"] <= TTL_S
        assert doc["suspects"][0]["address"] == ttl_cluster.bookie_address(victim)
        text = pybk("triggeraudit", "--metadata-uri", uri)
        assert text.rc == 0 and f"suspect: {victim} is registered at " in text.out, text.out
        assert "lease lapses in " in text.out and "triggeraudit --wait" in text.out
        waited = pybk("--json", "triggeraudit", "--metadata-uri", uri, "--wait")
        assert waited.rc == 0, waited.out + waited.err
        doc = waited.json()
        assert doc["still_registered"] == [] and not registered(bk.metadata_store, victim)
        healthy = pybk("--json", "triggeraudit", "--metadata-uri", uri)
        assert healthy.json()["suspects"] == [] and healthy.json()["bookies_probed"] == 3
    finally:
        ttl_cluster.heal()


def test_round_line_names_the_ledger_and_why(ttl_cluster, bk):
    uri = ttl_cluster.metadata_uri
    lh = _closed_ledger(bk)
    ensemble = list(lh.metadata.current_ensemble)
    outsider = next(b for b in ttl_cluster.bookie_ids if b not in ensemble)
    lost = ensemble[0]
    try:
        _kill(ttl_cluster, bk, lost, outsider)     # the two survivors are both in the ensemble
        res = pybk("autorecovery", "--metadata-uri", uri, "--rounds", "1", "--interval", "0")
        assert res.rc == 1, res.out + res.err
        line = res.out.strip().splitlines()[-1]
        assert "failed=1 (NotEnoughBookies=1)" in line, line
        assert (f"not repaired: ledger {lh.ledger_id}: NotEnoughBookies: no bookie outside the "
                f"ensemble {{{','.join(ensemble)}}} is writable") in line, line
        assert f"{outsider}: lost (unregistered for " in line, line
        js = pybk("--json", "autorecovery", "--metadata-uri", uri, "--rounds", "1")
        row = js.json()
        [failed] = row["failed_ledgers"]
        assert failed["ledger"] == lh.ledger_id and failed["reason"] == "NotEnoughBookies"
        assert failed["ensemble"] == ensemble and list(failed["excluded"]) == [outsider]
        assert failed["excluded"][outsider].startswith("lost")
    finally:
        ttl_cluster.heal()
    # both back: nothing is lost, the round names no ledger
    again = pybk("--json", "autorecovery", "--metadata-uri", uri, "--rounds", "1")
    assert again.json()["failed_ledgers"] == [] and again.json()["fragments_failed"] == 0


def test_a_round_line_caps_the_ledgers_it_names():
    from pybk_spark.admin.operations import rereplicate as rr
    rows = [{"ledger": i, "outcome": "failed", "reason": "NotEnoughBookies",
             "error": f"NotEnoughBookies: x{i}"} for i in range(8)]
    failed = rr.failed_ledgers(rows + [{"ledger": 3, "outcome": "failed", "reason": "ReadError",
                                        "error": "ReadError: y"}])
    assert [f["ledger"] for f in failed] == list(range(8)) and failed[3]["fragments"] == 2
    text = rr.failed_ledgers_text(failed)
    assert text.startswith("ledger 0: NotEnoughBookies: x0; ") and "ledger 5" not in text
    assert text.endswith("and 3 more (--json lists all)")


def test_decommission_refuses_until_rereplicated_then_retires_the_id(ttl_cluster, bk):
    uri = ttl_cluster.metadata_uri
    store = bk.metadata_store
    lh = _closed_ledger(bk, 300)
    victim = lh.metadata.current_ensemble[1]
    alive = next(b for b in ttl_cluster.bookie_ids if b != victim)
    _kill(ttl_cluster, bk, victim)
    listed = pybk("--json", "listunderreplicated", "--metadata-uri", uri)
    assert victim in listed.json()["lost"]

    live = pybk("decommission", "--metadata-uri", uri, alive, "--no-copy")
    assert live.rc == 1 and f"bookie {alive} is still registered" in live.err, live.err
    unsafe = pybk("decommission", "--metadata-uri", uri, victim, "--no-copy")
    assert unsafe.rc == 1 and len(unsafe.err.strip().splitlines()) == 1, unsafe.err
    named = re.search(r"in the ensembles of ledgers? ([0-9, ]+) with entries not re-replicated",
                      unsafe.err)
    assert "IllegalOp" in unsafe.err and named, unsafe.err
    assert lh.ledger_id in [int(i) for i in named.group(1).split(", ")], unsafe.err
    assert store.get(keys.cookie_key(victim)) is not None       # nothing removed

    copied = pybk("rereplicate", "--metadata-uri", uri, "--bookie", victim)
    assert copied.rc == 0, copied.out + copied.err
    done = pybk("--json", "decommission", "--metadata-uri", uri, victim, "--no-copy")
    assert done.rc == 0, done.out + done.err
    assert done.json()["retired"] and keys.cookie_key(victim) in done.json()["deleted"]

    for key in (keys.cookie_key(victim), f"{keys.INSTANCES_PREFIX}{victim}",
                f"{keys.DAMAGED_PREFIX}{victim}", audit.MISSING_PREFIX + victim,
                audit.DECOMMISSIONED_PREFIX + victim):
        assert store.get(key) is None, key
    assert victim not in pybk("--json", "listunderreplicated", "--metadata-uri", uri).json()["lost"]
    round_row = pybk("--json", "autorecovery", "--metadata-uri", uri, "--rounds", "1").json()
    assert victim not in round_row["lost"]
    status = pybk("--json", "autorecoveryctl", "--metadata-uri", uri).json()
    assert victim not in status["missing_bookies"]
    rh = bk.open_ledger(lh.ledger_id, recovery=False)
    assert [e.payload for e in rh.read(0, 299)] == [b"r-%d" % i for i in range(300)]
    again = pybk("decommission", "--metadata-uri", uri, victim)
    assert again.rc == 1 and "unknown bookie" in again.err
