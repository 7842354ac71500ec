"""Every ``pybk`` admin command against the shared real cluster, each with an
error path (typed error, non-zero exit).  Destructive commands
(rereplicate after a wipe, decommission) are in test_rereplicate.py."""
import uuid

import pytest


from admin_helpers import pybk


@pytest.fixture
def bk(cluster_bk):
    return cluster_bk


def test_simpletest_and_ledger_commands(uri):
    st = pybk("--json", "simpletest", "--metadata-uri", uri, "-n", "50", "--keep")
    assert st.rc == 0, st.err
    lid = st.json()["ledger"]

    listed = pybk("listledgers", "--metadata-uri", uri)
    assert listed.rc == 0 and str(lid) in listed.out and "CLOSED" in listed.out
    js = pybk("--json", "listledgers", "--metadata-uri", uri)
    assert lid in [r["ledger"] for r in js.json()]

    md = pybk("--json", "ledgermetadata", "--metadata-uri", uri, lid)
    assert md.rc == 0 and md.json()["state"] == "CLOSED" and md.json()["last_entry_id"] == 49
    human = pybk("ledgermetadata", "--metadata-uri", uri, lid)
    assert "first_entry" in human.out and "E/Qw/Qa=3/2/2" in human.out

    rd = pybk("--json", "readledger", "--metadata-uri", uri, lid, "--first", "10", "--last", "12")
    assert rd.rc == 0
    assert [e["entry"] for e in rd.json()["entries"]] == [10, 11, 12]
    assert rd.json()["entries"][0]["payload"].startswith("simpletest-10-")

    beyond = pybk("readledger", "--metadata-uri", uri, lid, "--first", "0", "--last", "500")
    assert beyond.rc == 1 and "NoSuchEntry" in beyond.err

    deleted = pybk("deleteledger", "--metadata-uri", uri, lid)
    assert deleted.rc == 0 and f"deleted ledger {lid}" in deleted.out
    again = pybk("--json", "deleteledger", "--metadata-uri", uri, lid)
    assert again.rc == 1 and again.json()["error"] == "NoSuchLedger"
    gone = pybk("ledgermetadata", "--metadata-uri", uri, lid)
    assert gone.rc == 1 and "NoSuchLedger" in gone.err


def test_readledger_force_recovery_closes_open_ledger(uri, bk):
    lh = bk.create_ledger(3, 2, 2, password=b"pw")
    lh.add_entries([b"one", b"two"])
    plain = pybk("--json", "readledger", "--metadata-uri", uri, lh.ledger_id, "--password", "pw")
    assert plain.rc == 0 and bk.get_ledger_metadata(lh.ledger_id).state == "OPEN"
    wrong = pybk("readledger", "--metadata-uri", uri, lh.ledger_id, "--password", "nope")
    assert wrong.rc == 1 and "Unauthorized" in wrong.err
    forced = pybk("--json", "readledger", "--metadata-uri", uri, lh.ledger_id,
                  "--password", "pw", "--force-recovery")
    assert forced.rc == 0
    assert [e["payload"] for e in forced.json()["entries"]] == ["one", "two"]
    assert bk.get_ledger_metadata(lh.ledger_id).state == "CLOSED"
    lh._lease = None


def test_simpletest_errors(uri):
    bad = pybk("simpletest", "--metadata-uri", uri, "-e", "2", "-w", "3")
    assert bad.rc == 1 and "IncorrectParameter" in bad.err
    too_big = pybk("--json", "simpletest", "--metadata-uri", uri, "-e", "9", "-w", "2", "-a", "2")
    assert too_big.rc == 1 and too_big.json()["error"] == "NotEnoughBookies"


def test_bookie_commands(uri, cluster):
    lb = pybk("--json", "listbookies", "--metadata-uri", uri)
    assert lb.rc == 0 and {r["bookie_id"] for r in lb.json()} >= set(cluster.bookie_ids)
    info = pybk("--json", "bookieinfo", "--metadata-uri", uri)
    assert info.rc == 0, info.out
    rows = {r["bookie"]: r for r in info.json()}
    assert set(rows) >= set(cluster.bookie_ids)
    assert all(r["state"] == "writable" and r["total_gb"] > 0 for r in rows.values())
    human = pybk("bookieinfo", "--metadata-uri", uri, "--bookie", cluster.bookie_ids[0])
    assert human.rc == 0 and "free_gb" in human.out
    missing = pybk("bookieinfo", "--metadata-uri", uri, "--bookie", "nobody")
    assert missing.rc == 1 and "BookieUnavailable" in missing.err


def test_listunderreplicated_healthy_cluster(uri, cluster):
    res = pybk("--json", "listunderreplicated", "--metadata-uri", uri)
    assert res.rc == 0
    lost = set(res.json()["lost"])                 # live bookies are never reported
    assert not lost & set(cluster.bookie_ids)
    assert all(r["bookie"] in lost or r["bookie"] == ""
               for r in res.json()["under_replicated"])
    human = pybk("listunderreplicated", "--metadata-uri", uri)
    assert human.rc == 0 and "lost/unregistered bookies" in human.out


def test_log_commands(uri, bk):
    from pybk_spark.logs.log_writer import LogWriter
    name = f"admin-log-{uuid.uuid4().hex[:8]}"
    w = LogWriter(bk, name).open()
    w.append_batch([f"rec{i}".encode() for i in range(5)])
    w.close()              # readers see an open ledger only up to its LAC; closed: all
    ll = pybk("--json", "listlogs", "--metadata-uri", uri)
    assert ll.rc == 0 and name in [r["log"] for r in ll.json()]
    lm_ = pybk("--json", "logmetadata", "--metadata-uri", uri, name)
    assert lm_.rc == 0 and len(lm_.json()["segments"]) == 1
    assert "ledger_id" in pybk("logmetadata", "--metadata-uri", uri, name).out
    rl = pybk("--json", "readlog", "--metadata-uri", uri, name)
    assert rl.rc == 0
    assert [r["payload"] for r in rl.json()["records"]] == [f"rec{i}" for i in range(5)]
    ledger = rl.json()["records"][0]["ledger"]
    part = pybk("readlog", "--metadata-uri", uri, name, "--from", f"{ledger}:3")
    assert part.rc == 0 and "rec3" in part.out and "rec2" not in part.out
    follow = pybk("--json", "readlog", "--metadata-uri", uri, name, "--follow", "--max", "2")
    assert follow.rc == 0 and len(follow.json()["records"]) == 2
    missing = pybk("logmetadata", "--metadata-uri", uri, "no-such-log-" + name)
    assert missing.rc == 1 and "LogNotFound" in missing.err
    badpos = pybk("readlog", "--metadata-uri", uri, name, "--from", "nonsense")
    assert badpos.rc == 1 and "IncorrectParameter" in badpos.err


def test_missing_metadata_uri_is_a_clear_error(monkeypatch):
    monkeypatch.delenv("PYBK_METADATA_URI", raising=False)
    res = pybk("listledgers")
    assert res.rc == 1 and "no metadata URI" in res.err
