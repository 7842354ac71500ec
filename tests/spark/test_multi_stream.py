"""Streams over several logs (options logs / logPattern) with a real SparkSession and cluster."""
import json
import uuid

import pytest

from pybk_spark.logs.positions import list_positions

from .test_stream import run_available_now
from .test_write import write

pytestmark = pytest.mark.spark


def prefix(tag):
    return f"{tag}-{uuid.uuid4().hex[:8]}"


def multi_stream(spark, uri, **options):
    r = spark.readStream.format("bookkeeper").option("metadataServiceUri", uri)
    for key, value in options.items():
        r = r.option(key, value)
    return r.load()


def rows_of(batches):
    return sorted(tuple(r) for _, rows in batches for r in rows)


def test_pattern_stream_reads_logs_fairly_picks_up_new_logs_and_resumes(
        spark, metadata_uri, bk, tmp_path):
    p = prefix("ms")
    a, b, c = f"{p}-a", f"{p}-b", f"{p}-c"
    write(spark.range(0, 8).coalesce(1), metadata_uri, a, maxRowsPerEntry="1")    # 8 entries
    write(spark.range(100, 104).coalesce(1), metadata_uri, b, maxRowsPerEntry="1")  # 4 entries
    checkpoint = str(tmp_path / "ckpt")
    df = multi_stream(spark, metadata_uri, logPattern=rf"{p}-.*", maxEntriesPerTrigger="4")
    assert df.columns == ["id", "_log"]
    batches = run_available_now(df, checkpoint)
    assert rows_of(batches) == sorted([(i, a) for i in range(8)] + [(i, b) for i in range(100, 104)])
    # fair shares: 4 entries per trigger, 2 from each log while both have some waiting
    first = [rows for _, rows in batches if rows][0]
    assert sorted(log for _, log in first) == [a, a, b, b]
    # the query's position is registered in each log, under one name
    [pos_a], [pos_b] = list_positions(bk.metadata_store, a), list_positions(bk.metadata_store, b)
    assert pos_a.name == pos_b.name and pos_a.name.startswith("stream-")
    # a new log matching the pattern and more rows in a: resume reads only what is new,
    # the new log from its first entry
    write(spark.range(200, 203).coalesce(1), metadata_uri, c)
    write(spark.range(8, 10).coalesce(1), metadata_uri, a)
    again = run_available_now(
        multi_stream(spark, metadata_uri, logPattern=rf"{p}-.*", maxEntriesPerTrigger="4"),
        checkpoint)
    assert rows_of(again) == sorted([(i, a) for i in (8, 9)] + [(i, c) for i in range(200, 203)])
    # (c's position comes with the next commit: Spark commits a batch when it starts the
    # next one, so an AvailableNow run leaves its last batch uncommitted to the source;
    # test_multi_stream_driver.py checks a new log's position)
    # a single-log checkpoint is not a multi-log one: refused, naming the reason
    single = str(tmp_path / "single")
    run_available_now(multi_stream(spark, metadata_uri, log=a), single)
    with pytest.raises(Exception, match="single-log offset"):
        run_available_now(multi_stream(spark, metadata_uri, logs=f"{a},{b}"), single)


def test_running_stream_picks_up_a_log_created_while_it_runs(spark, metadata_uri, bk, tmp_path):
    p = prefix("live")
    a, later = f"{p}-a", f"{p}-later"
    write(spark.range(0, 3), metadata_uri, a)
    got = []

    def collect(batch_df, batch_id):
        got.extend(tuple(r) for r in batch_df.collect())
    query = (multi_stream(spark, metadata_uri, logPattern=rf"{p}-.*").writeStream
             .foreachBatch(collect).option("checkpointLocation", str(tmp_path / "c")).start())
    try:
        query.processAllAvailable()
        assert sorted(got) == [(i, a) for i in range(3)]
        write(spark.range(50, 53), metadata_uri, later)          # created while it runs
        query.processAllAvailable()
        assert sorted(got) == sorted([(i, a) for i in range(3)] + [(i, later) for i in range(50, 53)])
        progress = [pr for pr in query.recentProgress if pr["sources"][0].get("latestOffset")]
        latest = progress[-1]["sources"][0]["latestOffset"]
        latest = json.loads(latest) if isinstance(latest, str) else latest
        assert set(latest["logs"]) == {a, later} and latest["entriesBehindLatest"] == 0
    finally:
        query.stop()


def test_deleted_log_fails_the_stream_or_is_skipped(spark, metadata_uri, bk, tmp_path):
    from pybk_spark.logs.log import read_log
    from pybk_spark.metadata.store import log_key
    p = prefix("gone")
    a, b = f"{p}-a", f"{p}-b"
    write(spark.range(0, 2), metadata_uri, a)
    write(spark.range(10, 12), metadata_uri, b)
    strict, lenient = str(tmp_path / "strict"), str(tmp_path / "lenient")
    assert len(rows_of(run_available_now(
        multi_stream(spark, metadata_uri, logPattern=rf"{p}-.*"), strict))) == 4
    assert len(rows_of(run_available_now(
        multi_stream(spark, metadata_uri, logs=f"{a},{b}"), lenient))) == 4
    _, version = read_log(bk.metadata_store, b)
    bk.metadata_store.delete(log_key(b), expected_version=version)
    write(spark.range(2, 4), metadata_uri, a)
    with pytest.raises(Exception, match="LogTruncated"):       # failOnDataLoss=true
        run_available_now(multi_stream(spark, metadata_uri, logPattern=rf"{p}-.*"), strict)
    with pytest.raises(Exception, match="LogNotFound"):        # a named log must exist
        multi_stream(spark, metadata_uri, logs=f"{a},{b}")
    got = run_available_now(multi_stream(spark, metadata_uri, logs=f"{a},{b}",
                                         failOnDataLoss="false"), lenient)
    assert rows_of(got) == [(2, a), (3, a)]
