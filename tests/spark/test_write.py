"""DataFrame writes into logs (atomic commit, orphan cleanup, schema checks)
and reading DataFrame logs back, against a real cluster and local Spark."""
import datetime
import decimal
import os
import uuid

import pytest
from pyspark.sql import Row
from pyspark.sql.types import (BinaryType, DecimalType, DoubleType, IntegerType, LongType,
                               StringType, StructField, StructType, TimestampType)

from pybk_spark import errors
from pybk_spark.logs.log import read_log
from pybk_spark.spark.datasource import BookKeeperDataSource

pytestmark = pytest.mark.spark

INNER = StructType([StructField("a", IntegerType()), StructField("b", StringType())])
VARIED = StructType([
    StructField("id", LongType(), False),
    StructField("i", IntegerType()),
    StructField("s", StringType()),
    StructField("bin", BinaryType()),
    StructField("ts", TimestampType()),
    StructField("dec", DecimalType(18, 4)),
    StructField("dbl", DoubleType()),
    StructField("nested", INNER),
])


def varied_rows(n, base=0):
    t0 = datetime.datetime(2026, 11, 1, 12, 0, 0)
    out = []
    for k in range(base, base + n):
        out.append((k, None if k % 7 == 0 else k * 3, None if k % 5 == 0 else f"s{k}-" + "x" * (k % 13),
                    bytes([k % 256]) * (k % 9), t0 + datetime.timedelta(seconds=k, microseconds=k),
                    None if k % 11 == 0 else decimal.Decimal(k).scaleb(-4),
                    k / 3.0, None if k % 4 == 0 else Row(a=k, b=f"n{k}")))
    return out


def log_name(tag):
    return f"{tag}-{uuid.uuid4().hex[:8]}"


def write(df, uri, log, mode="append", **options):
    w = df.write.format("bookkeeper").option("metadataServiceUri", uri).option("log", log)
    for key, value in options.items():
        w = w.option(key, value)
    w.mode(mode).save()


def read(spark, uri, log, **options):
    r = spark.read.format("bookkeeper").option("metadataServiceUri", uri).option("log", log)
    for key, value in options.items():
        r = r.option(key, value)
    return r.load()


def sorted_rows(df):
    return sorted(df.collect(), key=lambda r: r["id"])


def test_varied_types_round_trip(spark, metadata_uri, bk):
    log = log_name("varied")
    rows = varied_rows(500)
    df = spark.createDataFrame(rows, VARIED).repartition(3)
    write(df, metadata_uri, log, maxRowsPerEntry="40")
    md, _ = read_log(bk.metadata_store, log)
    assert len(md.segments) == 3 and sum(s.rows for s in md.segments) == 500
    assert all(s.entry_count >= 4 for s in md.segments)        # 40-row entries
    back = read(spark, metadata_uri, log, includeMetadata="true")
    assert [f.name for f in back.schema.fields] == [f.name for f in VARIED.fields] + [
        "_ledger_id", "_entry_id", "_timestamp"]
    assert all(f.nullable for f in back.schema.fields)           # not-null relabelled nullable
    got = sorted_rows(back)
    assert [tuple(r)[:8] for r in got] == [tuple(Row(*r)) for r in sorted(rows)]
    assert {r["_ledger_id"] for r in got} == set(md.ledger_ids)
    # without metadata columns: exactly the DataFrame's own columns
    plain = read(spark, metadata_uri, log)
    assert plain.columns == [f.name for f in VARIED.fields]
    assert plain.where("id < 10").count() == 10


def test_schema_mismatch_fails_before_writing(spark, metadata_uri, bk):
    log = log_name("mismatch")
    write(spark.createDataFrame([(1, "a")], "id long, s string"), metadata_uri, log)
    before = set(bk.list_ledgers())
    md_before, _ = read_log(bk.metadata_store, log)
    with pytest.raises(Exception, match="SchemaMismatch|incompatible"):
        write(spark.createDataFrame([(1, 2)], "id long, s int"), metadata_uri, log)
    assert set(bk.list_ledgers()) == before
    assert read_log(bk.metadata_store, log)[0] == md_before
    # the driver-side check, without Spark
    source = BookKeeperDataSource({"metadataServiceUri": metadata_uri, "log": log})
    with pytest.raises(errors.SchemaMismatch):
        source.writer(StructType([StructField("x", LongType())]), False)


def test_overwrite_swaps_and_deletes_old_ledgers(spark, metadata_uri, bk):
    log = log_name("overwrite")
    write(spark.range(0, 100).repartition(2), metadata_uri, log)
    old = read_log(bk.metadata_store, log)[0].ledger_ids
    write(spark.createDataFrame([(7, "x")], "id long, s string"), metadata_uri, log, mode="overwrite")
    md, _ = read_log(bk.metadata_store, log)
    assert not set(old) & set(md.ledger_ids)
    assert not set(old) & set(bk.list_ledgers())
    assert [tuple(r) for r in read(spark, metadata_uri, log).collect()] == [(7, "x")]


def fail_task_once_source(marker: str):
    """A test-only data source (the test seam; production code has no fault
    option): attempt 0 of partition 0 fails once after its ledger is written
    and closed, like a task lost before reporting.  Defined in a function so
    Spark pickles it by value to the Python workers."""
    from pyspark import TaskContext

    from pybk_spark.spark.writer import BookKeeperBatchWriter

    class FailOnceWriter(BookKeeperBatchWriter):
        def write(self, iterator):
            message = super().write(iterator)
            ctx = TaskContext.get()
            if ctx.partitionId() == 0 and ctx.attemptNumber() == 0 and not os.path.exists(marker):
                with open(marker, "w") as f:
                    f.write("failed once\n")
                raise RuntimeError("injected task failure (test data source)")
            return message

    class FailOnceSource(BookKeeperDataSource):
        @classmethod
        def name(cls):
            return "bookkeeper-fail-once"

        def writer(self, schema, overwrite):
            w = super().writer(schema, overwrite)
            return FailOnceWriter(w.opts, w.schema_text, w.overwrite, w.job, w.base_schema)

    return FailOnceSource


def test_failed_task_attempt_leaves_no_orphan_and_no_duplicate(spark, metadata_uri, bk, tmp_path):
    log = log_name("retry")
    before = set(bk.list_ledgers())
    source = fail_task_once_source(str(tmp_path / "failed-once"))
    spark.dataSource.register(source)
    (spark.range(0, 300).repartition(2).write.format(source.name())
     .option("metadataServiceUri", metadata_uri).option("log", log).mode("append").save())
    assert (tmp_path / "failed-once").exists()                  # the failure did fire
    md, _ = read_log(bk.metadata_store, log)
    assert set(bk.list_ledgers()) - before == set(md.ledger_ids)  # the failed attempt's ledger is gone
    assert sorted(r["id"] for r in read(spark, metadata_uri, log).collect()) == list(range(300))
    assert bk.metadata_store.list_prefix(f"spark/pending/{log}/") == []


def test_abort_leaves_log_unchanged(spark, metadata_uri, bk):
    log = log_name("abort")
    write(spark.range(0, 10), metadata_uri, log)
    md_before, _ = read_log(bk.metadata_store, log)
    before = set(bk.list_ledgers())
    source = BookKeeperDataSource({"metadataServiceUri": metadata_uri, "log": log})
    writer = source.writer(StructType([StructField("id", LongType(), False)]), False)
    import pyarrow as pa
    msgs = [writer.write(iter([pa.record_batch([pa.array(range(k, k + 5), pa.int64())],
                                               names=["id"])])) for k in (0, 5)]
    assert all(m.ledger_id >= 0 for m in msgs)
    writer.abort([msgs[0], None])                  # second task "failed": only etcd knows it
    assert read_log(bk.metadata_store, log)[0] == md_before
    assert set(bk.list_ledgers()) == before
    assert bk.metadata_store.list_prefix(f"spark/pending/{log}/") == []


def test_a_task_that_fails_while_its_ledger_opens_leaves_nothing_behind(spark, metadata_uri, bk):
    """A task opens its ledger on a thread of its own while it encodes; when
    its input fails meanwhile, it waits for the opening to end and deletes
    the ledger and its pending key."""
    import pyarrow as pa
    log = log_name("fails-opening")
    write(spark.range(0, 10), metadata_uri, log)
    before = set(bk.list_ledgers())
    writer = BookKeeperDataSource({"metadataServiceUri": metadata_uri, "log": log}).writer(
        StructType([StructField("id", LongType(), False)]), False)

    def failing_input():
        yield pa.record_batch([pa.array(range(5), pa.int64())], names=["id"])
        raise RuntimeError("the task's input failed")
    with pytest.raises(RuntimeError, match="input failed"):
        writer.write(failing_input())
    assert set(bk.list_ledgers()) == before
    assert bk.metadata_store.list_prefix(f"spark/pending/{log}/") == []


def test_two_concurrent_appenders_both_land(spark, metadata_uri, bk):
    """Two writers of one log interleave: both tasks' ledgers are written before
    either commits; each commit is one CAS, so both land complete."""
    import pyarrow as pa
    log = log_name("concurrent")
    schema = StructType([StructField("id", LongType())])
    a = BookKeeperDataSource({"metadataServiceUri": metadata_uri, "log": log}).writer(schema, False)
    b = BookKeeperDataSource({"metadataServiceUri": metadata_uri, "log": log}).writer(schema, False)
    batch = lambda lo: iter([pa.record_batch([pa.array(range(lo, lo + 50), pa.int64())], names=["id"])])
    ma, mb = a.write(batch(0)), b.write(batch(50))
    b.commit([mb])
    a.commit([ma])
    md, _ = read_log(bk.metadata_store, log)
    assert md.ledger_ids == [mb.ledger_id, ma.ledger_id]
    assert sorted(r["id"] for r in read(spark, metadata_uri, log).collect()) == list(range(100))


def test_oversized_row_fails_the_job_and_appends_nothing(spark, metadata_uri, bk):
    """A row whose entry is over the ledgers' entry limit (5 MiB by default:
    client max_entry_size_bytes / bookie max_entry_bytes) fails the write job
    with a message naming the limit and the settings; the log gets nothing."""
    log = log_name("oversized")
    schema = StructType([StructField("id", LongType(), False), StructField("bin", BinaryType())])
    write(spark.createDataFrame([(k, b"s") for k in range(10)], schema), metadata_uri, log)
    md_before, _ = read_log(bk.metadata_store, log)
    before = set(bk.list_ledgers())
    rows = [(k, b"s" * 10) for k in range(20, 40)] + [(99, b"B" * (6 << 20))]
    df = spark.createDataFrame(rows, schema).repartition(2)
    with pytest.raises(Exception) as info:
        write(df, metadata_uri, log)
    text = str(info.value)
    assert "TooLarge" in text or "over the largest entry" in text
    assert "max_entry_size_bytes" in text and "max_entry_bytes" in text
    assert "maxBytesPerEntry" in text
    assert read_log(bk.metadata_store, log)[0] == md_before
    assert set(bk.list_ledgers()) == before
    assert bk.metadata_store.list_prefix(f"spark/pending/{log}/") == []
    assert sorted(r["id"] for r in read(spark, metadata_uri, log).collect()) == list(range(10))


def test_retention_applies_at_each_commit(spark, metadata_uri, bk):
    """A log's retention.bytes is applied by the writer's commit: the oldest
    committed segments go (their ledgers deleted), the newest stay."""
    from pybk_spark.logs.truncation import set_log_retention
    log = log_name("retained")
    schema = StructType([StructField("id", LongType(), False)])
    write(spark.createDataFrame([(k,) for k in range(100)], schema).repartition(1),
          metadata_uri, log)
    set_log_retention(bk.metadata_store, log, nbytes=1)     # keep no more than the newest
    first = read_log(bk.metadata_store, log)[0].ledger_ids
    for base in (100, 200):
        write(spark.createDataFrame([(k,) for k in range(base, base + 100)], schema)
              .repartition(1), metadata_uri, log)
    md, _ = read_log(bk.metadata_store, log)
    assert md.truncated_ledgers == 2 and len(md.segments) == 1
    assert not set(first) & set(bk.list_ledgers())
    assert sorted(r.id for r in read(spark, metadata_uri, log).collect()) == list(range(200, 300))
