"""What a new user meets first, through a real SparkSession against the shared
real cluster: our error is the first line of the message Spark shows (right
after Spark's error class), a scope without bookies is named as such, a
failed or aborted write leaves no log, ledger or pending record behind,
batch-only options on a stream are refused with our message, and a column
type the sink cannot store faithfully is refused at write."""
import uuid

import pytest
from pyspark.sql.types import BinaryType, LongType, StructField, StructType

from pybk_spark.logs.log import find_log
from pybk_spark.metadata import open_store, parse_uri

pytestmark = pytest.mark.spark

SCHEMA = StructType([StructField("id", LongType(), False), StructField("bin", BinaryType())])


@pytest.fixture
def wrong_uri(cluster):
    _, where, scope = parse_uri(cluster.metadata_uri)
    return f"etcd://{where}/{scope}x{uuid.uuid4().hex[:4]}"


def first_line(exc: BaseException) -> str:
    return str(exc).splitlines()[0]


def leftovers(bk) -> tuple:
    """Everything a write could leave behind: logs, ledgers, pending attempts."""
    return (sorted(bk.list_logs()), bk.list_ledgers(),
            [k for k, _ in bk.metadata_store.list_prefix("spark/pending/")])


def test_a_read_of_an_empty_scope_leads_with_empty_scope(spark, cluster, wrong_uri):
    with pytest.raises(Exception) as info:
        (spark.read.format("bookkeeper").option("metadataServiceUri", wrong_uri)
         .option("log", "events").load())
    line = first_line(info.value)
    assert line.startswith("[PYTHON_DATA_SOURCE_ERROR] Failed to create Python data source "
                           "instance: pybk_spark.errors.EmptyScope: metadata scope "), line
    assert f"scopes with bookies: {parse_uri(cluster.metadata_uri)[2]!r}" in line, line
    assert "Traceback" not in str(info.value)                  # one line, no Python stack


def test_a_write_to_an_empty_scope_is_refused_and_creates_nothing(spark, wrong_uri):
    df = spark.createDataFrame([(1, b"x")], SCHEMA)
    with pytest.raises(Exception) as info:
        (df.write.format("bookkeeper").option("metadataServiceUri", wrong_uri)
         .option("log", "events").mode("append").save())
    assert first_line(info.value).startswith(
        "[PYTHON_DATA_SOURCE_ERROR] Failed to initialize Python data source writer: "
        "pybk_spark.errors.EmptyScope: metadata scope "), str(info.value)[:2000]
    assert "Traceback" not in str(info.value)
    store = open_store(wrong_uri)
    try:
        assert find_log(store, "events") is None
        assert store.list_prefix("") == []                  # the scope is as empty as before
    finally:
        store.close()


def test_a_failed_write_to_a_new_log_leaves_nothing(spark, metadata_uri, bk):
    """One row over the entry limit (a small configured limit keeps it fast):
    the job fails naming the limit; no log, ledger or pending key remains."""
    log = f"fails-{uuid.uuid4().hex[:8]}"
    before = leftovers(bk)
    rows = [(k, b"s" * 10) for k in range(20)] + [(99, b"B" * (200 << 10))]
    df = spark.createDataFrame(rows, SCHEMA).repartition(2)
    with pytest.raises(Exception) as info:
        (df.write.format("bookkeeper").option("metadataServiceUri", metadata_uri)
         .option("log", log).option("bk.max_entry_size_bytes", str(64 << 10))
         .mode("append").save())
    assert "over the largest entry" in str(info.value)
    assert find_log(bk.metadata_store, log) is None
    assert leftovers(bk) == before


def test_an_aborted_sink_batch_leaves_nothing(spark, metadata_uri, bk, tmp_path):
    src, dst = (f"{tag}-{uuid.uuid4().hex[:8]}" for tag in ("src", "dst"))
    rows = [(k, b"s") for k in range(5)] + [(9, b"B" * (200 << 10))]
    (spark.createDataFrame(rows, SCHEMA).coalesce(1).write.format("bookkeeper")
     .option("metadataServiceUri", metadata_uri).option("log", src).mode("append").save())
    before = leftovers(bk)
    query = (spark.readStream.format("bookkeeper").option("metadataServiceUri", metadata_uri)
             .option("log", src).load().writeStream.format("bookkeeper")
             .option("metadataServiceUri", metadata_uri).option("log", dst)
             .option("bk.max_entry_size_bytes", str(64 << 10))
             .option("checkpointLocation", str(tmp_path / "ckpt"))
             .trigger(availableNow=True).start())
    with pytest.raises(Exception) as info:
        query.awaitTermination()
    assert "over the largest entry" in str(info.value)
    assert find_log(bk.metadata_store, dst) is None
    assert leftovers(bk) == before


def test_batch_only_ledgers_on_a_stream_is_refused_with_our_message(spark, metadata_uri,
                                                                     tmp_path):
    df = (spark.readStream.format("bookkeeper").option("metadataServiceUri", metadata_uri)
          .option("ledgers", "1").load())
    with pytest.raises(Exception) as info:
        query = (df.writeStream.format("memory").queryName(f"q{uuid.uuid4().hex[:6]}")
                 .option("checkpointLocation", str(tmp_path / "ckpt")).start())
        try:
            query.awaitTermination(120)
        finally:
            query.stop()
    text = str(info.value)
    assert ("[PYTHON_STREAMING_DATA_SOURCE_RUNTIME_ERROR] Failed when Python streaming data "
            "source perform initialOffset: pybk_spark.errors.IncorrectParameter: option "
            "'ledgers' applies to batch reads only, not to stream reads") in text, text[:2000]
    assert "UnboundLocalError" not in text and "Traceback" not in text, text[:2000]


def test_a_variant_column_is_refused_at_write(spark, metadata_uri, bk):
    log = f"variant-{uuid.uuid4().hex[:8]}"
    df = spark.sql("""SELECT 1L AS id, parse_json('{"a": 1}') AS v""")
    with pytest.raises(Exception) as info:
        (df.write.format("bookkeeper").option("metadataServiceUri", metadata_uri)
         .option("log", log).mode("append").save())
    line = first_line(info.value)
    assert ("pybk_spark.errors.IncorrectParameter: column 'v' has type variant, which the "
            "bookkeeper sink cannot store faithfully (it would read back as "
            "struct<value:binary,metadata:binary>)") in line, line
    assert find_log(bk.metadata_store, log) is None
