"""Spark on a real (standalone) cluster across test hosts.

One cluster for the module: etcd-1..3, bookie-1..4, spark-master, two
workers (spark-worker-1..2) and a driver host (spark-driver), all separate
network namespaces.  Jobs go through pyspark's own ``bin/spark-submit
--master spark://...`` on the driver host with cwd outside the repository;
executors run on the workers and reach bookies and etcd only through the
registered addresses and the multi-endpoint URI.  Then the same through a
Spark Connect server and a thin client session.  The rereplication test
kills a bookie, so it runs last.
"""
from __future__ import annotations

import json
import shutil
import os
import time
import uuid
from pathlib import Path

import pytest

from pybk_spark.ledger.client import BookKeeper

from tests.hosts.conftest import need_hosts

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1800)]   # JVMs on shared cores

ROOT = Path(__file__).resolve().parents[2]
JOBS = ROOT / "jobs"
APP = Path(__file__).with_name("spark_app.py")
SUBMIT_TIMEOUT = 900.0          # JVMs on 2 shared cores: bounds, not expectations


@pytest.fixture(scope="module")
def spark_hosts(tmp_path_factory):
    """(HostCluster, SparkCluster) sharing one HostNetwork."""
    need_hosts(etcd=True, bookies=True, java=True)
    from pybk_spark.cluster.host_cluster import HostCluster
    from pybk_spark.cluster.hosts import HostNetwork
    from pybk_spark.cluster.spark_cluster import SparkCluster
    base = tmp_path_factory.mktemp("spark-hosts")
    net = HostNetwork()
    cluster = spark = None
    try:
        net.start()
        cluster = HostCluster(base / "bk", network=net, num_bookies=4,
                              bookie_conf={"journal_prealloc_bytes": 4 << 20}).start()
        t0 = time.monotonic()
        spark = SparkCluster(net, base / "spark").start()
        print(f"spark master + {len(spark.worker_hosts)} workers ready in "
              f"{time.monotonic() - t0:.1f}s")
        yield cluster, spark
    finally:
        if spark is not None:
            spark.close()
        if cluster is not None:
            cluster.close()
        net.close()


def _submit(spark, script, *args, name=None):
    t0 = time.monotonic()
    res = spark.submit(script, *args, timeout=SUBMIT_TIMEOUT, name=name)
    print(f"spark-submit {name or Path(script).stem}: rc={res.returncode} "
          f"in {time.monotonic() - t0:.1f}s")
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-5000:]
    return res


def _last_json(res) -> dict:
    return json.loads(res.stdout.strip().splitlines()[-1])


def _until(pred, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while not pred():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(0.1)


def test_master_sees_both_workers(spark_hosts):
    _, spark = spark_hosts
    state = spark.master_state()
    assert state["status"] == "ALIVE" and state["url"] == spark.master_url
    assert sorted(spark.alive_workers()) == sorted(h.address for h in spark.worker_hosts)
    assert spark.driver_host.address not in spark.alive_workers()


def test_demo_job(spark_hosts):
    cluster, spark = spark_hosts
    res = _submit(spark, JOBS / "demo.py", "--metadata-uri", cluster.metadata_uri,
                  "--ledgers", 2, "--entries", 300, "--max-entries-per-partition", 100)
    assert "RESULT: OK" in res.stdout, res.stdout[-3000:]


def test_batch_and_streaming_with_shared_checkpoint(spark_hosts):
    cluster, spark = spark_hosts
    prefix = f"hosts-{uuid.uuid4().hex[:8]}"
    checkpoint = spark.data_dir / "checkpoints" / prefix      # every host sees data_dir
    res = _submit(spark, APP, "--metadata-uri", cluster.metadata_uri, "--prefix", prefix,
                  "--checkpoint", checkpoint, name="spark_app")
    out = _last_json(res)
    if out["stream_restarts"]:
        print("streaming query restarted from its checkpoint:", out["stream_restarts"])
    workers = {h.address for h in spark.worker_hosts}
    # tasks ran on the workers, importing pybk_spark from the installed path, not a cwd
    assert {addr for addr, _, _ in out["executors"]} == workers
    for _, pkg, cwd in out["executors"]:
        assert not pkg.startswith(cwd) and Path(pkg, "__init__.py").exists()
    assert not str(Path(out["driver_cwd"]).resolve()).startswith(str(ROOT))
    assert out["batch"] == [[i, f"row-{i}"] for i in range(300)]
    assert out["batch_partitions"] >= 2
    assert out["stream_first"] == list(range(300))
    assert out["stream_second"] == list(range(350))          # resumed: each row once
    assert (checkpoint / "commits").is_dir()


@pytest.mark.long
def test_recover_ledgers_job(spark_hosts):
    cluster, spark = spark_hosts
    bk = BookKeeper(cluster.metadata_uri)
    try:
        lh = bk.create_ledger(3, 2, 2)
        lh.add_entries([b"r%d" % i for i in range(200)])
        lh._lease.revoke()                                    # the writer "dies"
        lh._lease = None
        _until(lambda: not bk.is_writer_alive(lh.ledger_id), 60, "writer lease gone")
        assert not bk.get_ledger_metadata(lh.ledger_id).is_closed
        res = _submit(spark, JOBS / "recover_ledgers.py", "--metadata-uri",
                      cluster.metadata_uri, "--ledger", lh.ledger_id, "--json")
        row = [r for r in _last_json(res)["ledgers"] if r["ledger"] == lh.ledger_id][0]
        assert row["outcome"] == "recovered" and row["last_entry"] == 199
        md = bk.get_ledger_metadata(lh.ledger_id)
        assert md.is_closed and md.last_entry_id == 199
        rh = bk.open_ledger(lh.ledger_id, recovery=False)
        assert [e.payload for e in rh.read(0, 199)] == [b"r%d" % i for i in range(200)]
    finally:
        bk.close()


CONNECT_ENV = ("SPARK_CONNECT_MODE_ENABLED", "SPARK_REMOTE", "SPARK_LOCAL_REMOTE")


def test_spark_connect_reads_and_writes_bookkeeper(spark_hosts):
    cluster, spark = spark_hosts
    try:
        from pyspark.sql.connect.utils import check_dependencies
        check_dependencies()
    except ImportError as exc:
        pytest.skip(f"Spark Connect client dependencies missing ({exc}): "
                    "pip install -e '.[connect]'")
    t0 = time.monotonic()
    url = spark.start_connect()
    print(f"Spark Connect server ready at {url} in {time.monotonic() - t0:.1f}s")
    from pyspark.sql import SparkSession
    from pyspark.sql import functions as F
    # a Connect session marks the whole process as Connect-only through the
    # environment (SPARK_CONNECT_MODE_ENABLED): every later classic session
    # in this pytest process, and every spark-submit it starts, would then fail
    # with CONNECT_URL_NOT_SET.  Put the environment back afterwards.
    saved = {k: os.environ.get(k) for k in CONNECT_ENV}
    session = SparkSession.builder.remote(url).getOrCreate()
    try:
        uri, log = cluster.metadata_uri, f"connect-{uuid.uuid4().hex[:8]}"
        df = session.range(0, 200).withColumn("s", F.concat(F.lit("c-"), F.col("id").cast("string")))
        # no spark.dataSource.register: the server finds pyspark_bookkeeper itself
        (df.repartition(2).write.format("bookkeeper").option("metadataServiceUri", uri)
         .option("log", log).option("maxRowsPerEntry", "50").mode("append").save())
        back = (session.read.format("bookkeeper").option("metadataServiceUri", uri)
                .option("log", log).load())
        assert sorted((r["id"], r["s"]) for r in back.collect()) == [
            (i, f"c-{i}") for i in range(200)]
        assert back.filter("id >= 150").count() == 50
    finally:
        session.stop()
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        spark.stop_connect()            # it holds every worker core while it runs


@pytest.mark.long
def test_rereplicate_job_after_a_bookie_is_lost(spark_hosts):
    cluster, spark = spark_hosts
    bk = BookKeeper(cluster.metadata_uri)
    try:
        payloads = [b"x%d-" % i + b"p" * 100 for i in range(300)]
        handles = []
        for _ in range(2):
            lh = bk.create_ledger(3, 2, 2)
            lh.add_entries(payloads)
            lh.close()
            handles.append(lh)
        common = handles[0].metadata.all_bookies() & handles[1].metadata.all_bookies()
        victim = sorted(common)[0]
        cluster.kill_bookie(victim)
        shutil.rmtree(cluster.bookies[victim].data_dir)
        store = bk.metadata_store
        _until(lambda: all(store.get(f"bookies/{m}/{victim}") is None
                           for m in ("writable", "readonly")), 60, f"{victim} unregistered")
        res = _submit(spark, JOBS / "rereplicate.py", "--metadata-uri", cluster.metadata_uri,
                      "--verify", "--json")
        report = _last_json(res)
        assert report["under_replicated"] == []
        assert report["copies"] and {c["outcome"] for c in report["copies"]} == {"replicated"}
        print("rereplicate summary:", report["summary"])
        for lh in handles:
            md = bk.get_ledger_metadata(lh.ledger_id)
            assert victim not in md.all_bookies()
            rh = bk.open_ledger(lh.ledger_id, recovery=False)
            assert [e.payload for e in rh.read(0, 299)] == payloads
    finally:
        bk.close()
