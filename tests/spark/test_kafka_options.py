"""Kafka-connector features of the bookkeeper source against a real cluster and
a real SparkSession: failOnDataLoss, minPartitions (docs/spark.md)."""
import uuid

import pytest

from pybk_spark.logs.log import read_log
from pybk_spark.logs.truncation import truncate_log

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
    # the checkpoint points at segment 1 entry 0; drop segments 0 and 1 (forced: the
    # query's registered position would hold truncation back otherwise)
    truncate_log(bk, log, segments(bk, log)[2], force=True)
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


# -- admission control and progress ------------------------------------------------------------
def collecting_query(df, checkpoint, **trigger):
    batches = []

    def collect(batch_df, batch_id):
        rows = [tuple(r) for r in batch_df.collect()]
        if rows:
            batches.append(rows)
    w = df.writeStream.foreachBatch(collect).option("checkpointLocation", checkpoint)
    return (w.trigger(**trigger) if trigger else w).start(), batches


def source_progress(query):
    import json
    out = []
    for p in query.recentProgress:
        latest = p["sources"][0].get("latestOffset")
        out.append(json.loads(latest) if isinstance(latest, str) else latest)
    return [p for p in out if p]


def test_max_bytes_per_trigger_bounds_each_batch(spark, metadata_uri, bk, tmp_path):
    log = log_name("maxbytes")
    write(spark.range(0, 100).coalesce(1), metadata_uri, log, maxRowsPerEntry="10")   # 10 entries
    seg = read_log(bk.metadata_store, log)[0].segments[0]
    per_entry = seg.byte_count / seg.entry_count
    limit = int(per_entry * 3) + 1                                   # three entries' worth
    batches = run_available_now(stream(spark, metadata_uri, log, maxBytesPerTrigger=str(limit)),
                                str(tmp_path / "c"))
    sizes = [len(rows) for _, rows in batches if rows]
    assert sum(sizes) == 100 and max(sizes) <= 30 and len(sizes) >= 4


def test_min_entries_per_trigger_waits_for_enough_entries(spark, metadata_uri, bk, tmp_path):
    log = log_name("minentries")
    for base in (0, 5):
        write(spark.range(base, base + 5).coalesce(1), metadata_uri, log)       # one entry each
    query, batches = collecting_query(
        stream(spark, metadata_uri, log, minEntriesPerTrigger="3", maxTriggerDelay="1h"),
        str(tmp_path / "c"), processingTime="200 milliseconds")
    try:
        query.processAllAvailable()          # the source reports no batch while 2 < 3 entries
        assert batches == []
        write(spark.range(10, 15).coalesce(1), metadata_uri, log)
        query.processAllAvailable()
        assert sorted(r[0] for rows in batches for r in rows) == list(range(15))
        assert len(batches) == 1
    finally:
        query.stop()
    # maxTriggerDelay passed (0): fewer entries than asked are read anyway
    query, batches = collecting_query(
        stream(spark, metadata_uri, log, minEntriesPerTrigger="100", maxTriggerDelay="0s"),
        str(tmp_path / "d"), processingTime="200 milliseconds")
    try:
        query.processAllAvailable()
        assert sorted(r[0] for rows in batches for r in rows) == list(range(15))
    finally:
        query.stop()


def test_available_now_stops_at_the_log_end_seen_at_start(spark, metadata_uri, bk, tmp_path):
    log = log_name("availnow")
    writer = bk.open_log_writer(log)
    try:
        writer.append_batch([b"p%d" % i for i in range(6)])
        appended = []

        def collect(batch_df, batch_id):
            rows = [tuple(r) for r in batch_df.collect()]
            if batch_id == 0:                           # more entries while the query runs
                writer.append_batch([b"late%d" % i for i in range(4)])
            appended.append(rows)
        query = (stream(spark, metadata_uri, log, maxEntriesPerTrigger="2",
                        minEntriesPerTrigger="50")      # AvailableNow never waits for more
                 .writeStream.foreachBatch(collect)
                 .option("checkpointLocation", str(tmp_path / "c"))
                 .trigger(availableNow=True).start())
        query.awaitTermination()
        payloads = [r[2] for rows in appended for r in rows]
        assert sorted(payloads) == sorted(b"p%d" % i for i in range(6))
        assert max(len(rows) for rows in appended) <= 2
        progress = source_progress(query)
        assert progress and "entriesBehindLatest" in progress[0]
        assert progress[0]["entriesBehindLatest"] >= 4 - 0     # 6 present, 2 taken
        assert progress[-1]["entriesBehindLatest"] >= 0
    finally:
        writer.close()


def test_progress_reports_latest_offset_and_lag(spark, metadata_uri, bk, tmp_path):
    log = log_name("lag")
    write(spark.range(0, 60).coalesce(1), metadata_uri, log, maxRowsPerEntry="10")   # 6 entries
    df = stream(spark, metadata_uri, log, maxEntriesPerTrigger="2")
    query = (df.writeStream.format("noop").option("checkpointLocation", str(tmp_path / "c"))
             .trigger(availableNow=True).start())
    query.awaitTermination()
    progress = source_progress(query)
    assert [p["entriesBehindLatest"] for p in progress][:3] == [4, 2, 0]
    seg = read_log(bk.metadata_store, log)[0].segments[0]
    assert progress[0]["bytesBehindLatest"] == round(seg.byte_count * 4 / 6)
    assert all((p["index"], p["entry"]) == (1, 0) for p in progress)     # the log's end


# -- retention: registered positions ------------------------------------------------------------
def pybk_json(*argv):
    import contextlib
    import io
    import json
    from pybk_spark.commands.cli import main
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = main(["--json", *argv])
    return code, json.loads(out.getvalue())


def test_committed_stream_position_holds_back_truncation(spark, metadata_uri, bk, tmp_path):
    from pybk_spark import errors
    from pybk_spark.logs.positions import list_positions
    log = log_name("retain")
    three_writes(spark, metadata_uri, log)
    checkpoint = str(tmp_path / "ckpt")
    got = run_available_now(stream(spark, metadata_uri, log, maxEntriesPerTrigger="2"), checkpoint)
    assert sorted(r[0] for _, rows in got for r in rows) == list(range(30))
    # Spark tells the source about a batch's end when it starts the next one, so the
    # position is the end of the second-to-last batch: (2, 0) of ends (1,0) (2,0) (3,0)
    [position] = list_positions(bk.metadata_store, log)
    assert (position.index, position.entry) == (2, 0)
    ids = segments(bk, log)
    truncate_log(bk, log, ids[2])                             # behind the position: allowed
    write(spark.range(30, 40).coalesce(1), metadata_uri, log, maxRowsPerEntry="5")
    write(spark.range(40, 50).coalesce(1), metadata_uri, log, maxRowsPerEntry="5")
    with pytest.raises(errors.IllegalOp, match=position.name):
        truncate_log(bk, log, segments(bk, log)[1])           # would drop segment 2
    # a restart keeps its name (it rides in the checkpointed offsets) and moves it on
    more = run_available_now(stream(spark, metadata_uri, log, maxEntriesPerTrigger="2"),
                             checkpoint)
    assert sorted(r[0] for _, rows in more for r in rows) == list(range(30, 50))
    [moved] = list_positions(bk.metadata_store, log)
    assert moved.name == position.name and (moved.index, moved.entry) == (4, 0)
    # the shell lists it and drops it
    code, rows = pybk_json("positions", "--metadata-uri", metadata_uri, log)
    assert code == 0 and [(r["name"], r["index"]) for r in rows] == [(moved.name, 4)]
    write(spark.range(50, 60).coalesce(1), metadata_uri, log)
    last = segments(bk, log)[-1]
    with pytest.raises(errors.IllegalOp):
        truncate_log(bk, log, last)
    code, out = pybk_json("dropposition", "--metadata-uri", metadata_uri, log, moved.name)
    assert code == 0 and out["dropped"]["name"] == moved.name
    assert list_positions(bk.metadata_store, log) == []
    truncate_log(bk, log, last)
    code, out = pybk_json("dropposition", "--metadata-uri", metadata_uri, log, moved.name)
    assert code == 1 and out["error"] == "IncorrectParameter"


# -- bk.* client settings ------------------------------------------------------------------------
def test_client_settings_reach_the_clients_of_tasks(spark, metadata_uri, bk):
    log = log_name("bkconf")
    write(spark.range(0, 50).coalesce(1), metadata_uri, log, maxRowsPerEntry="10")
    df = read(spark, metadata_uri, log, **{"bk.read_transport": "grpc", "bk.read_timeout_s": "20"})
    assert sorted(r.id for r in df.collect()) == list(range(50))
    # a task's client honours bk.max_entry_size_bytes: a 4 KiB row is over 1 KiB
    big = spark.createDataFrame([(1, "x" * 4096)], "id long, s string")
    with pytest.raises(Exception, match="TooLarge"):
        write(big, metadata_uri, log_name("bkconf-big"), **{"bk.max_entry_size_bytes": "1024"})
    with pytest.raises(Exception, match="did you mean 'bk.read_timeout_s'"):
        read(spark, metadata_uri, log, **{"bk.read_timout_s": "1"})


# -- schema evolution ------------------------------------------------------------------------------
def test_merge_schema_adds_nullable_columns_and_refuses_other_changes(spark, metadata_uri, bk):
    log = log_name("evolve")
    write(spark.createDataFrame([("alice", 3)], "user string, n int"), metadata_uri, log)
    wider = spark.createDataFrame([("bob", 5, 1.5)], "user string, n int, score double")
    with pytest.raises(Exception, match=r"columns added: \['score'\]"):
        write(wider, metadata_uri, log)                              # no mergeSchema
    write(wider, metadata_uri, log, mergeSchema="true")
    rows = sorted(tuple(r) for r in read(spark, metadata_uri, log).collect())
    assert rows == [("alice", 3, None), ("bob", 5, 1.5)]            # older entry: null
    retyped = spark.createDataFrame([("carol", 7, "x")], "user string, n int, score string")
    with pytest.raises(Exception, match=r"types changed: \['score double -> string'\]"):
        write(retyped, metadata_uri, log, mergeSchema="true")
    dropped = spark.createDataFrame([("dave",)], "user string")
    with pytest.raises(Exception, match=r"columns missing from the DataFrame: \['n', 'score'\]"):
        write(dropped, metadata_uri, log, mergeSchema="true")
    assert len(read_log(bk.metadata_store, log)[0].segments) == 2    # refused writes: nothing


# -- SQL ----------------------------------------------------------------------------------------
def test_sql_temporary_view_and_create_table_using_bookkeeper(spark, metadata_uri, bk):
    log = log_name("sql")
    write(spark.createDataFrame([("alice", 3), ("bob", 5)], "user string, n int"), metadata_uri,
          log)
    view = "bk_" + log.replace("-", "_")
    spark.sql(f"CREATE TEMPORARY VIEW {view} USING bookkeeper "
              f"OPTIONS (metadataServiceUri '{metadata_uri}', log '{log}')")
    try:
        rows = spark.sql(f"SELECT user, n FROM {view} WHERE n > 3").collect()
        assert [tuple(r) for r in rows] == [("bob", 5)]
        assert spark.sql(f"SELECT count(*) FROM {view}").collect()[0][0] == 2
    finally:
        spark.sql(f"DROP VIEW IF EXISTS {view}")
    # a catalog table: its OPTIONS ride in the schema it records (table_options.py)
    table = view + "_t"
    spark.sql(f"CREATE TABLE {table} USING bookkeeper "
              f"OPTIONS (metadataServiceUri '{metadata_uri}', log '{log}', password 'pw')")
    try:
        rows = spark.sql(f"SELECT user, n FROM {table} WHERE n > 3").collect()
        assert [tuple(r) for r in rows] == [("bob", 5)]
        assert spark.sql(f"SELECT count(*) FROM {table}").collect()[0][0] == 2
        # the query's own options lie over the table's (WITH), as for spark.read
        split = spark.sql(f"SELECT * FROM {table} WITH ('minPartitions' = '2')")
        assert split.count() == 2
        with pytest.raises(Exception, match="minPartitions"):
            spark.sql(f"SELECT * FROM {table} WITH ('minPartitions' = 'x')").collect()
        metadata = spark.table(table).schema.fields[0].metadata
        assert log in metadata["pybk.tableOptions"] and "pw" not in str(metadata)
    finally:
        spark.sql(f"DROP TABLE IF EXISTS {table}")


def test_sql_insert_names_its_target_and_tables_keep_the_options_of_each_read(
        spark, metadata_uri, bk):
    """PySpark hands a Python source's writer no table options, and the
    table's schema only when it had to cast or rename the inserted columns
    (otherwise the query's: in ``INSERT INTO t2 SELECT * FROM t1``, t1's, with
    t1's recorded options), so an INSERT names its target with WITH; a plain
    one fails typed, saying so, and writes nothing.  A table records the
    options of any read; each read takes those that apply to it."""
    log = log_name("sqlins")
    write(spark.createDataFrame([("alice", 3)], "user string, n int"), metadata_uri, log)
    table = "bk_" + log.replace("-", "_")
    spark.sql(f"CREATE TABLE {table} USING bookkeeper OPTIONS (metadataServiceUri "
              f"'{metadata_uri}', log '{log}', maxEntriesPerTrigger '10')")   # a stream read's
    listed = table + "_cols"
    spark.sql(f"CREATE TABLE {listed} (user STRING, n INT) USING bookkeeper "
              f"OPTIONS (metadataServiceUri '{metadata_uri}', log '{log}')")
    try:
        assert spark.sql(f"SELECT count(*) FROM {table}").collect()[0][0] == 1   # batch read
        spark.createDataFrame([("bob", 5)], "user string, n int").createOrReplaceTempView("ins_v")
        with pytest.raises(Exception, match=r"INSERT INTO t WITH \('metadataServiceUri'"):
            spark.sql(f"INSERT INTO {table} SELECT * FROM ins_v")
        spark.sql(f"INSERT INTO {table} WITH ('metadataServiceUri' = '{metadata_uri}', "
                  f"'log' = '{log}') SELECT * FROM ins_v")
        rows = sorted(tuple(r) for r in spark.sql(f"SELECT user, n FROM {table}").collect())
        assert rows == [("alice", 3), ("bob", 5)]
        assert len(read_log(bk.metadata_store, log)[0].segments) == 2
        spark.sql(f"INSERT OVERWRITE {table} WITH ('metadataServiceUri' = '{metadata_uri}', "
                  f"'log' = '{log}', 'maxRowsPerEntry' = '1') VALUES ('carol', 7), ('dave', 9)")
        rows = sorted(tuple(r) for r in spark.sql(f"SELECT user, n FROM {table}").collect())
        assert rows == [("carol", 7), ("dave", 9)]
        # VALUES hands the writer the table's schema, record included; the log keeps none
        assert "pybk.tableOptions" not in read(spark, metadata_uri, log).schema.json()
        spark.sql(f"INSERT INTO {table} WITH ('metadataServiceUri' = '{metadata_uri}', "
                  f"'log' = '{log}') SELECT * FROM ins_v")
        # a column list keeps Spark from asking the source: nothing recorded, said so
        with pytest.raises(Exception, match="created with a column list"):
            spark.sql(f"SELECT * FROM {listed}").collect()
        assert spark.sql(f"SELECT count(*) FROM {listed} WITH ('metadataServiceUri' = "
                         f"'{metadata_uri}', 'log' = '{log}')").collect()[0][0] == 3
    finally:
        spark.sql(f"DROP TABLE IF EXISTS {table}")
        spark.sql(f"DROP TABLE IF EXISTS {listed}")
        spark.catalog.dropTempView("ins_v")


# -- several logs in one read ---------------------------------------------------------------------
def test_logs_and_log_pattern_read_several_logs_with_a_log_column(spark, metadata_uri, bk):
    prefix = log_name("multi")
    a, b, odd = f"{prefix}-a", f"{prefix}-b", f"{prefix}-odd"
    write(spark.range(0, 10).coalesce(1), metadata_uri, a, maxRowsPerEntry="2")   # 5 entries
    write(spark.range(10, 15).coalesce(1), metadata_uri, b, maxRowsPerEntry="2")  # 3 entries
    df = spark.read.format("bookkeeper").option("metadataServiceUri", metadata_uri) \
        .option("logs", f"{a},{b}").load()
    assert df.columns == ["id", "_log"]
    assert sorted(tuple(r) for r in df.collect()) == sorted(
        [(i, a) for i in range(10)] + [(i, b) for i in range(10, 15)])
    by_pattern = spark.read.format("bookkeeper").option("metadataServiceUri", metadata_uri) \
        .option("logPattern", rf"{prefix}-[ab]").option("minPartitions", "4").load()
    assert by_pattern.rdd.getNumPartitions() >= 4
    assert sorted(tuple(r) for r in by_pattern.collect()) == sorted(tuple(r) for r in df.collect())
    write(spark.createDataFrame([("x",)], "s string"), metadata_uri, odd)
    with pytest.raises(Exception, match="SchemaMismatch"):
        spark.read.format("bookkeeper").option("metadataServiceUri", metadata_uri) \
            .option("logPattern", rf"{prefix}-.*").load()
    # streams over several logs: tests/spark/test_multi_stream.py
