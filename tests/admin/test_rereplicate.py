"""Re-replication on a private 4-bookie cluster (destructive: a bookie is
SIGKILLed and its data dir wiped).  The job is run once through
spark-submit; decommission runs in-process."""
import shutil


from pybk_spark.admin.operations import rereplicate as rr

from admin_helpers import one_json_document, pybk, registered, spark_submit, wait_until


def _payloads(tag, n, size=200):
    return [(f"{tag}-{i}-".encode() + b"p" * size)[:size] for i in range(n)]


def _write(bk, tag, n, e, w, a, close=True):
    lh = bk.create_ledger(e, w, a)
    lh.add_entries(_payloads(tag, n))
    if close:
        lh.close()
    return lh


def _assert_readable(bk, ledger_id, tag, n):
    rh = bk.open_ledger(ledger_id, recovery=False)
    assert rh.last_add_confirmed == n - 1
    got = [e.payload for e in rh.read(0, n - 1)]
    assert got == _payloads(tag, n)


def _holders(bk, bookie):
    return [l for l in bk.list_ledgers() if bookie in bk.get_ledger_metadata(l).all_bookies()]


def test_lost_bookie_rereplicated_by_spark_job(own_cluster, bk):
    uri = own_cluster.metadata_uri
    l1 = _write(bk, "l1", 1200, 3, 2, 2)
    l2 = _write(bk, "l2", 1000, 3, 3, 2)
    l3 = _write(bk, "l3", 300, 3, 2, 2, close=False)       # writer "dies": lease revoked
    l3._lease.revoke()
    l3._lease = None
    common = (l1.metadata.all_bookies() & l2.metadata.all_bookies()
              & l3.metadata.all_bookies())
    victim = sorted(common)[0]

    own_cluster.kill_bookie(victim)
    shutil.rmtree(own_cluster.bookie_data_dir(victim))
    store = bk.metadata_store
    wait_until(lambda: not registered(store, victim), 60, f"{victim} unregistered")

    # lostBookieRecoveryDelay: missing is recorded, but not lost before the delay
    early = rr.run_audit(bk, delay_s=3600, plan=False)
    assert victim not in early.lost and early.work == []
    assert store.get(f"audit/missing/{victim}") is not None
    listed = pybk("--json", "listunderreplicated", "--metadata-uri", uri)
    assert listed.rc == 0 and victim in listed.json()["lost"]
    assert {r["ledger"] for r in listed.json()["under_replicated"]} >= {
        l1.ledger_id, l2.ledger_id, l3.ledger_id}

    res = spark_submit("rereplicate.py", "--metadata-uri", uri, "--verify", "--json")
    assert res.rc == 0, res.out[-3000:] + res.err[-3000:]
    report = one_json_document(res)
    assert "tasks done" in res.err, res.err[-2000:]
    assert report["under_replicated"] == []
    assert [f["ledger"] for f in report["fenced"]] == [l3.ledger_id]
    assert {c["outcome"] for c in report["copies"]} == {"replicated"}
    assert report["summary"]["entries"] > 0 and report["summary"]["bytes"] > 0
    print("rereplicate summary:", report["summary"])

    assert _holders(bk, victim) == []
    for lh, tag, n in ((l1, "l1", 1200), (l2, "l2", 1000), (l3, "l3", 300)):
        _assert_readable(bk, lh.ledger_id, tag, n)
    again = pybk("--json", "rereplicate", "--metadata-uri", uri, "--verify")
    assert again.rc == 0 and again.json()["copies"] == [] and again.json()["under_replicated"] == []


def test_decommission_moves_fragments_of_live_bookie(own_cluster, bk):
    uri = own_cluster.metadata_uri
    own_cluster.add_bookie()                 # 4 live bookies again: room for replacements
    l5 = _write(bk, "l5", 600, 3, 2, 2)
    target = sorted(l5.metadata.all_bookies())[0]
    res = pybk("decommission", "--metadata-uri", uri, "--bookie", target)
    assert res.rc == 0, res.out + res.err
    assert "safe to stop it" in res.out
    assert _holders(bk, target) == []
    _assert_readable(bk, l5.ledger_id, "l5", 600)
    for _ in range(5):                       # placement skips a bookie being decommissioned
        fresh = bk.create_ledger(3, 2, 2)
        assert target not in fresh.metadata.current_ensemble
        fresh.close()
    own_cluster.kill_bookie(target)          # gone for good: data is elsewhere
    _assert_readable(bk, l5.ledger_id, "l5", 600)
    verify = pybk("--json", "rereplicate", "--metadata-uri", uri, "--verify")
    assert verify.rc == 0 and verify.json()["under_replicated"] == []
    cancel = pybk("decommission", "--metadata-uri", uri, "--bookie", target, "--cancel")
    assert cancel.rc == 0


def test_decommission_and_rereplicate_errors(own_cluster):
    uri = own_cluster.metadata_uri
    bad = pybk("decommission", "--metadata-uri", uri, "--bookie", "no-such-bookie")
    assert bad.rc == 1 and "IncorrectParameter" in bad.err
    usage = pybk("decommission", "--metadata-uri", uri)
    assert usage.rc == 2
    no_uri = pybk("rereplicate", "--metadata-uri", "")
    assert no_uri.rc == 1 and "metadata URI" in no_uri.err
