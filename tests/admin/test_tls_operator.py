"""Re-replication on a TLS cluster (mutual TLS, roles) holding ledgers with
three different passwords, none of them known to the tool: refused for a
writer identity, done by an operator identity running the spark-submit job (the key-less path of
protocol/access.py: it learns each ledger's key from a surviving replica),
bookie to bookie (each replacement pulls from a peer over TLS with its own
certificate), and the ledgers read back intact with their own passwords
afterwards."""
import shutil

import pytest

from pybk_spark import errors
from pybk_spark.protocol import ledger_metadata as lm

from admin_helpers import pybk, registered, spark_submit, wait_until

pytest.importorskip("trustme")
pytestmark = pytest.mark.slow

PASSWORDS = (b"alpha", b"bravo", b"charlie")
DIGESTS = ("crc32c", "hmac", "crc32c")


def _payloads(tag, n, size=150):
    return [(f"{tag}-{i}-".encode() + b"p" * size)[:size] for i in range(n)]


def _write_conf(path, conf: dict) -> str:
    path.write_text("".join(f"{k} = {v}\n" for k, v in conf.items()))
    return str(path)


@pytest.fixture(scope="module")
def tls_cluster(tmp_path_factory):
    from pybk_spark.cluster.certs import OPERATOR, make_cert_files
    from pybk_spark.cluster.local import LocalCluster
    from pybk_spark.testing.fixtures import bookie_server_available
    if not bookie_server_available():
        pytest.skip("bookie_server is not available")
    root = tmp_path_factory.mktemp("tls-cluster")
    certs = make_cert_files(root / "certs")
    local = LocalCluster(root / "cluster", num_bookies=4,
                         bookie_conf=certs.bookie_conf(operators=OPERATOR))
    try:
        local.start()
        yield local, certs, root
    finally:
        local.stop()


def test_operator_rereplicates_ledgers_with_three_passwords(tls_cluster):
    from pybk_spark.ledger.client import BookKeeper
    from pybk_spark.cluster.certs import OPERATOR, WRITER
    cluster, certs, root = tls_cluster
    uri = cluster.metadata_uri
    writer_conf = certs.client_conf(WRITER)
    ledgers = []
    with BookKeeper(uri, conf=writer_conf) as bk:
        for i, (pw, digest) in enumerate(zip(PASSWORDS, DIGESTS)):
            lh = bk.create_ledger(3, 2, 2, digest=digest, password=pw)
            lh.add_entries(_payloads(f"l{i}", 400))
            lh.close()
            ledgers.append(lh.ledger_id)
        common = set.intersection(*(set(bk.get_ledger_metadata(lid).all_bookies())
                                    for lid in ledgers))
        if not common:           # 3 of 4 bookies each: make them share one
            pytest.skip("no bookie holds all three ledgers")
        victim = sorted(common)[0]
        before = {lid: set(bk.get_ledger_metadata(lid).all_bookies()) for lid in ledgers}
        cluster.kill_bookie(victim)
        shutil.rmtree(cluster.bookie_data_dir(victim))
        wait_until(lambda: not registered(bk.metadata_store, victim), 60,
                   f"{victim} unregistered")

    writer_file = _write_conf(root / "writer.conf", writer_conf)
    operator_file = _write_conf(root / "operator.conf",
                                {**certs.client_conf(OPERATOR), "operator": "true"})

    # a writer identity without the passwords: every copy refused, nothing changed
    refused = pybk("--json", "rereplicate", "--metadata-uri", uri, "--client-conf",
                   writer_file)
    assert refused.rc != 0, refused.out + refused.err
    copies = refused.json()["copies"]
    assert copies and {c["outcome"] for c in copies} == {"failed"}
    assert all("Unauthorized" in c["error"] for c in copies), copies

    # a writer identity claiming to be an operator: the bookies say no
    claimed = _write_conf(root / "claimed.conf", {**writer_conf, "operator": "true"})
    refused = pybk("--json", "rereplicate", "--metadata-uri", uri, "--client-conf", claimed)
    assert refused.rc != 0, refused.out + refused.err
    copies = refused.json()["copies"]
    assert copies and {c["outcome"] for c in copies} == {"failed"}
    assert all("tls_operator_identities" in c["error"] for c in copies), copies

    # an operator identity: no passwords needed; the spark-submit job, whose
    # executors open their clients from the same client conf
    done = spark_submit("rereplicate.py", "--metadata-uri", uri, "--client-conf",
                        operator_file, "--verify", "--json")
    assert done.rc == 0, done.out + done.err
    report = done.json()
    assert {c["outcome"] for c in report["copies"]} == {"replicated"}
    assert report["under_replicated"] == []
    # bookie to bookie: each replacement pulled over mutual TLS, presenting its
    # own certificate to the surviving peer (no copy through the client)
    assert {c.get("path") for c in report["copies"]} == {"pull"}, report["copies"]

    with BookKeeper(uri, conf=writer_conf) as bk:
        for i, (lid, pw) in enumerate(zip(ledgers, PASSWORDS)):
            md = bk.get_ledger_metadata(lid)
            assert victim not in md.all_bookies()
            rh = bk.open_ledger(lid, password=pw, recovery=False)
            assert [e.payload for e in rh.read(0, 399)] == _payloads(f"l{i}", 400)
            # the copies carry the writer's key (learned from a surviving replica):
            # the new replica refuses a wrong one like the others
            (new_bookie,) = set(md.all_bookies()) - before[lid]
            with pytest.raises(errors.Unauthorized):
                bk.transports.get(new_bookie).read_lac(
                    lid, fence=True, master_key=lm.master_key(b"wrong")).result(30)
            assert bk.transports.get(new_bookie).read_lac(
                lid, fence=True, master_key=lm.master_key(pw)).result(30).fenced


def test_operator_recovers_a_dead_writers_ledger_without_its_password(tls_cluster):
    from pybk_spark.ledger.client import BookKeeper
    from pybk_spark.cluster.certs import OPERATOR, WRITER
    cluster, certs, root = tls_cluster
    uri = cluster.metadata_uri
    writer_conf = certs.client_conf(WRITER)
    with BookKeeper(uri, conf=writer_conf) as bk:
        lh = bk.create_ledger(3, 2, 2, digest="hmac", password=b"delta")
        lh.add_entries(_payloads("open", 120))
        lh._lease.revoke()                   # the writer "dies": lease gone, ledger OPEN
        lh._lease = None
        lid = lh.ledger_id
    operator_file = _write_conf(root / "operator-recover.conf",
                                {**certs.client_conf(OPERATOR), "operator": "true"})
    out = pybk("--json", "recover", "--metadata-uri", uri, "--client-conf", operator_file,
               "--ledger", lid)
    assert out.rc == 0, out.out + out.err
    (row,) = [r for r in out.json()["ledgers"] if r["ledger"] == lid]
    assert row["outcome"] == "recovered" and row["last_entry"] == 119, row
    with BookKeeper(uri, conf=writer_conf) as bk:
        md = bk.get_ledger_metadata(lid)
        assert md.is_closed and md.last_entry_id == 119
        rh = bk.open_ledger(lid, password=b"delta", recovery=False)
        assert [e.payload for e in rh.read(0, 119)] == _payloads("open", 120)


def test_a_peer_that_does_not_admit_the_bookies_certificate_means_a_client_copy(tmp_path):
    """Bookies whose tls_writer_identities name only the writer: a
    replacement's pull (it reads its peer with the bookie certificate) is
    refused, and the copy goes through the re-replication client instead,
    with the refusal in ``pull_error``; nothing is lost either way."""
    from pybk_spark.admin.operations import rereplicate as rr
    from pybk_spark.cluster.certs import OPERATOR, WRITER, make_cert_files
    from pybk_spark.cluster.local import LocalCluster
    from pybk_spark.ledger.client import BookKeeper
    from pybk_spark.testing.fixtures import bookie_server_available
    if not bookie_server_available():
        pytest.skip("bookie_server is not available")
    certs = make_cert_files(tmp_path / "certs")
    conf = certs.bookie_conf(writers=WRITER, operators=OPERATOR)
    with LocalCluster(tmp_path / "cluster", num_bookies=3, bookie_conf=conf) as cluster:
        uri = cluster.metadata_uri
        with BookKeeper(uri, conf=certs.client_conf(WRITER)) as bk:
            lh = bk.create_ledger(3, 3, 2, password=b"pw")
            lh.add_entries(_payloads("x", 300))
            lh.close()
            lost = bk.get_ledger_metadata(lh.ledger_id).current_ensemble[0]
        cluster.add_bookie()
        cluster.kill_bookie(lost)
        with BookKeeper(uri, conf={**certs.client_conf(OPERATOR), "operator": "true"}) as op:
            wait_until(lambda: not registered(op.metadata_store, lost), 60, f"{lost} unregistered")
            work = rr.run_audit(op, named=[lost]).work
            assert work
            rows = [rr.copy_fragment(op, w) for w in work]
            assert {r["outcome"] for r in rows} == {"replicated"}, rows
            assert {r["path"] for r in rows} == {"client"}, rows
            assert all("tls_writer_identities" in r["pull_error"] for r in rows), rows
            assert rr.verify_ledger(op, lh.ledger_id) == []
        with BookKeeper(uri, conf=certs.client_conf(WRITER)) as bk:
            rh = bk.open_ledger(lh.ledger_id, password=b"pw", recovery=False)
            assert [e.payload for e in rh.read(0, 299)] == _payloads("x", 300)


def test_an_operator_daemon_offloads_logs_of_two_passwords_without_them(tls_cluster, tmp_path):
    """The autorecovery daemon's offload, given no password: as a writer
    identity it cannot open the ledgers (each log is counted as failed);
    as an operator it learns each ledger's key from its bookies and
    offloads logs written under different passwords and digests."""
    from pybk_spark.admin.operations.auto_offload import OffloadMetrics, apply_offload
    from pybk_spark.cluster.certs import OPERATOR, WRITER
    from pybk_spark.ledger.client import BookKeeper
    from pybk_spark.logs.log import read_log
    from pybk_spark.logs.log_writer import LogWriter, RollPolicy
    from pybk_spark.logs.offload_conf import load_offload_conf
    cluster, certs, _root = tls_cluster
    uri = cluster.metadata_uri
    logs = {"tls-offload-e": b"echo", "tls-offload-f": b"foxtrot"}
    settings = load_offload_conf(location=str(tmp_path / "off"), grace_s=3600)
    with BookKeeper(uri, conf=certs.client_conf(WRITER)) as bk:
        for name, pw in logs.items():
            with LogWriter(bk, name, password=pw,
                           roll_policy=RollPolicy(max_entries=10)).open() as w:
                for k in range(3):
                    w.append_batch(_payloads(f"{name}-{k}", 10))
        row = apply_offload(bk, settings, OffloadMetrics())
        assert row["offload_failed"] >= len(logs) and row["offload_segments"] == 0, row
    with BookKeeper(uri, conf={**certs.client_conf(OPERATOR), "operator": True}) as op:
        row = apply_offload(op, settings, OffloadMetrics())
        assert row["offload_failed"] == 0 and row["offload_segments"] == len(logs), row
        for name in logs:
            md = read_log(op.metadata_store, name)[0]
            offloaded = [s for s in md.segments if s.offload is not None]
            assert [s.ledger_id for s in offloaded] == list(md.ledger_ids[:1]), name
            assert offloaded[0].offload.rows == 10
