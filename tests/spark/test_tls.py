"""The data source over TLS: a DataFrame written into a log and read back
on a cluster whose bookies require client certificates, with the TLS files
given as Spark options (spark/client_options.py); without them the bookies
refuse the tasks with a typed error naming the option to set."""
import uuid

import pytest

from pybk_spark import errors
from pybk_spark.spark.client_options import client_conf, parse_client_options

pytestmark = pytest.mark.spark


def test_options_parse_into_client_settings():
    got = parse_client_options({"TLS.CAFILE": "/ca.pem", "tls.certFile": "/c.pem",
                                "tls.keyFile": "/k.pem", "operator": "TRUE"})
    assert client_conf(got) == {"tls_ca_file": "/ca.pem", "tls_cert_file": "/c.pem",
                                "tls_key_file": "/k.pem", "operator": "true"}
    assert parse_client_options({}) == () and client_conf(()) is None
    with pytest.raises(errors.IncorrectParameter, match="tls.caFile"):
        parse_client_options({"tls.certFile": "/c.pem", "tls.keyFile": "/k.pem"})
    with pytest.raises(errors.IncorrectParameter, match="tls.keyFile"):
        parse_client_options({"tls.caFile": "/ca.pem", "tls.certFile": "/c.pem"})
    with pytest.raises(errors.IncorrectParameter, match="operator"):
        parse_client_options({"operator": "yes"})


@pytest.fixture(scope="module")
def tls_cluster(tmp_path_factory):
    pytest.importorskip("trustme")
    from pybk_spark.cluster.certs import make_cert_files
    from pybk_spark.cluster.local import LocalCluster
    root = tmp_path_factory.mktemp("spark-tls")
    certs = make_cert_files(root / "certs")
    local = LocalCluster(root / "cluster", num_bookies=3, bookie_conf=certs.bookie_conf())
    try:
        local.start()
        yield local, certs
    finally:
        local.stop()


def test_write_and_read_a_log_over_tls(spark, tls_cluster):
    from pybk_spark.spark.datasource import BookKeeperDataSource
    from pybk_spark.cluster.certs import WRITER
    spark.dataSource.register(BookKeeperDataSource)
    cluster, certs = tls_cluster
    conf = certs.client_conf(WRITER)
    tls = {"tls.caFile": conf["tls_ca_file"], "tls.certFile": conf["tls_cert_file"],
           "tls.keyFile": conf["tls_key_file"]}
    log = f"tls-{uuid.uuid4().hex[:8]}"
    df = spark.createDataFrame([(i, f"v{i}") for i in range(500)], "id long, v string")
    w = df.repartition(2).write.format("bookkeeper").option(
        "metadataServiceUri", cluster.metadata_uri).option("log", log)
    for k, v in tls.items():
        w = w.option(k, v)
    w.mode("append").save()
    r = spark.read.format("bookkeeper").option("metadataServiceUri", cluster.metadata_uri) \
        .option("log", log)
    for k, v in tls.items():
        r = r.option(k, v)
    rows = sorted((row["id"], row["v"]) for row in r.load().collect())
    assert rows == [(i, f"v{i}") for i in range(500)]
    # no TLS options: the tasks fail, naming the option
    plain = spark.read.format("bookkeeper").option(
        "metadataServiceUri", cluster.metadata_uri).option("log", log).load()
    with pytest.raises(Exception, match="tls.caFile"):
        plain.collect()
