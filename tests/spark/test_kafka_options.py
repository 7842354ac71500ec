"""Kafka-connector features of the bookkeeper source against a real cluster and
a real SparkSession: failOnDataLoss, minPartitions (docs/spark.md)."""
import uuid

import pytest

from pybk_spark.log import read_log, truncate_log

from .test_stream import run_available_now, stream
from .test_write import read, write

pytestmark = pytest.mark.spark


def log_name(tag):
    return f"{tag}-{uuid.uuid4().hex[:8]}"


def segments(bk, log):
    return read_log(bk.metadata_store, log)[0].ledger_ids


def three_writes(spark, uri, log):
    """A log of three segments (one per single-partition write): ids 0-9, 10-19, 20-29."""
    for base in (0, 10, 20):
        write(spark.range(base, base + 10).coalesce(1), uri, log, maxRowsPerEntry="5")


# -- failOnDataLoss --------------------------------------------------------------------------
def test_stream_position_truncated_away_fails_by_default(spark, metadata_uri, bk, tmp_path):
    log = log_name("dl-trunc")
    write(spark.range(0, 10).coalesce(1), metadata_uri, log)
    checkpoint = str(tmp_path / "ckpt")
    first = run_available_now(stream(spark, metadata_uri, log), checkpoint)
    assert sorted(r[0] for _, rows in first for r in rows) == list(range(10))
    write(spark.range(10, 20).coalesce(1), metadata_uri, log)
    write(spark.range(20, 30).coalesce(1), metadata_uri, log)
    # the checkpoint points at segment 1 entry 0; drop segments 0 and 1
    truncate_log(bk, log, segments(bk, log)[2])
    with pytest.raises(Exception) as info:
        run_available_now(stream(spark, metadata_uri, log), checkpoint)
    assert "LogTruncated" in str(info.value) or "truncated away" in str(info.value)
    assert "failOnDataLoss" in str(info.value)
    # failOnDataLoss=false: skip to the first entry still in the log
    again = run_available_now(stream(spark, metadata_uri, log, failOnDataLoss="false"), checkpoint)
    assert sorted(r[0] for _, rows in again for r in rows) == list(range(20, 30))


def test_deleted_ledger_of_a_log_fails_or_is_skipped(spark, metadata_uri, bk, tmp_path):
    log = log_name("dl-del")
    three_writes(spark, metadata_uri, log)
    bk.delete_ledger(segments(bk, log)[1])          # the log still lists it
    with pytest.raises(Exception, match="failOnDataLoss"):
        read(spark, metadata_uri, log).collect()
    rows = sorted(r.id for r in read(spark, metadata_uri, log, failOnDataLoss="false").collect())
    assert rows == list(range(10)) + list(range(20, 30))
    with pytest.raises(Exception, match="failOnDataLoss"):
        run_available_now(stream(spark, metadata_uri, log), str(tmp_path / "a"))
    got = run_available_now(stream(spark, metadata_uri, log, failOnDataLoss="false"),
                            str(tmp_path / "b"))
    assert sorted(r[0] for _, rows in got for r in rows) == list(range(10)) + list(range(20, 30))


# -- minPartitions ---------------------------------------------------------------------------
def test_min_partitions_splits_fragments(spark, metadata_uri, bk, tmp_path):
    log = log_name("minp")
    write(spark.range(0, 100).coalesce(1), metadata_uri, log, maxRowsPerEntry="5")   # 20 entries
    assert read(spark, metadata_uri, log).rdd.getNumPartitions() == 1
    df = read(spark, metadata_uri, log, minPartitions="6")
    assert df.rdd.getNumPartitions() >= 6
    assert sorted(r.id for r in df.collect()) == list(range(100))
    got = run_available_now(stream(spark, metadata_uri, log, minPartitions="6"),
                            str(tmp_path / "c"))
    assert sorted(r[0] for _, rows in got for r in rows) == list(range(100))
