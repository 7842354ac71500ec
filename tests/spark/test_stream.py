"""Streaming source and exactly-once sink against a real cluster and local Spark."""
import os
import uuid

import pyarrow as pa
import pytest
from pyspark.sql.types import LongType, StructField, StructType

from pybk_spark.logs.log import read_log
from pybk_spark.spark.datasource import BookKeeperDataSource

from .test_write import read, write

pytestmark = pytest.mark.spark


def log_name(tag):
    return f"{tag}-{uuid.uuid4().hex[:8]}"


def stream(spark, uri, log, **options):
    r = spark.readStream.format("bookkeeper").option("metadataServiceUri", uri).option("log", log)
    for key, value in options.items():
        r = r.option(key, value)
    return r.load()


def run_available_now(df, checkpoint):
    """Run an availableNow query collecting each micro-batch on the driver."""
    batches = []

    def collect(batch_df, batch_id):
        batches.append((batch_id, [tuple(r) for r in batch_df.collect()]))
    query = (df.writeStream.foreachBatch(collect).option("checkpointLocation", checkpoint)
             .trigger(availableNow=True).start())
    query.awaitTermination()
    return batches


def test_available_now_reads_exactly_the_log_and_resumes(spark, metadata_uri, bk, tmp_path):
    log = log_name("src")
    write(spark.range(0, 60).repartition(2), metadata_uri, log, maxRowsPerEntry="10")
    checkpoint = str(tmp_path / "ckpt")
    df = stream(spark, metadata_uri, log, maxEntriesPerTrigger="4")
    batches = run_available_now(df, checkpoint)
    ids = [r[0] for _, rows in batches for r in rows]
    assert sorted(ids) == list(range(60)) and len(ids) == 60
    assert len(batches) >= 2                          # admission control: 6 entries, 4 per trigger
    # more data, then restart from the checkpoint: only the new rows
    write(spark.range(60, 75), metadata_uri, log)
    again = run_available_now(stream(spark, metadata_uri, log, maxEntriesPerTrigger="4"), checkpoint)
    assert sorted(r[0] for _, rows in again for r in rows) == list(range(60, 75))


def test_stream_of_raw_log_with_open_writer_reads_up_to_lac(spark, metadata_uri, bk, tmp_path):
    log = log_name("raw")
    writer = bk.open_log_writer(log)
    try:
        writer.append_batch([b"p%d" % i for i in range(25)])
        batches = run_available_now(stream(spark, metadata_uri, log), str(tmp_path / "c"))
        got = sorted((e, p) for _, rows in batches for (_, e, p, _t) in rows)
        assert got == [(i, b"p%d" % i) for i in range(25)]
    finally:
        writer.close()


def test_sink_commit_replayed_directly_is_a_no_op(metadata_uri, bk):
    log = log_name("sinkdirect")
    source = BookKeeperDataSource({"metadataServiceUri": metadata_uri, "log": log,
                                   "checkpointLocation": "/tmp/nowhere-" + log})
    sink = source.streamWriter(StructType([StructField("id", LongType())]), False)
    batch = lambda: iter([pa.record_batch([pa.array(range(10), pa.int64())], names=["id"])])
    before = set(bk.list_ledgers())
    first = sink.write(batch())
    sink.commit([first], 0)
    md1, _ = read_log(bk.metadata_store, log)
    replay = sink.write(batch())                      # the re-executed batch's tasks
    sink.commit([replay], 0)
    md2, _ = read_log(bk.metadata_store, log)
    assert md2 == md1 and md1.ledger_ids == [first.ledger_id]
    assert set(bk.list_ledgers()) - before == {first.ledger_id}   # the replay's ledger deleted
    assert list(md1.sink_commits.values()) == [0]


def test_sink_query_restart_and_replay_exactly_once(spark, metadata_uri, bk, tmp_path):
    src, dst = log_name("in"), log_name("out")
    write(spark.range(0, 40).repartition(2), metadata_uri, src, maxRowsPerEntry="10")
    checkpoint = str(tmp_path / "sink-ckpt")

    def run():
        q = (stream(spark, metadata_uri, src, maxEntriesPerTrigger="2").writeStream
             .format("bookkeeper").option("metadataServiceUri", metadata_uri)
             .option("log", dst).option("checkpointLocation", checkpoint)
             .trigger(availableNow=True).start())
        q.awaitTermination()

    run()
    assert sorted(r["id"] for r in read(spark, metadata_uri, dst).collect()) == list(range(40))
    # forget that the last batch was committed: Spark replays it on restart
    commits = os.path.join(checkpoint, "commits")
    last = max((f for f in os.listdir(commits) if f.isdigit()), key=int)
    os.remove(os.path.join(commits, last))
    crc = os.path.join(commits, f".{last}.crc")
    if os.path.exists(crc):
        os.remove(crc)
    write(spark.range(40, 50), metadata_uri, src)
    run()
    ids = sorted(r["id"] for r in read(spark, metadata_uri, dst).collect())
    assert ids == list(range(50))
    md, _ = read_log(bk.metadata_store, dst)
    last_batch = max(int(f) for f in os.listdir(commits) if f.isdigit())
    assert list(md.sink_commits.values()) == [last_batch]
    assert bk.metadata_store.list_prefix(f"spark/pending/{dst}/") == []
    # the sink's committed position: just past its last batch's ledgers, with that batch id
    # (informational: kind "sink" never holds back truncation), listed by the shell
    from pybk_spark.logs.positions import list_positions
    [sink] = list_positions(bk.metadata_store, dst)
    assert (sink.kind, sink.batch_id) == ("sink", last_batch) and checkpoint in sink.detail
    assert (sink.index, sink.entry) == (md.truncated_ledgers + len(md.segments), 0)
    from .test_kafka_options import pybk_json
    code, rows = pybk_json("positions", "--metadata-uri", metadata_uri, dst)
    assert code == 0 and [(r["kind"], r["batch_id"]) for r in rows] == [("sink", last_batch)]
