"""Batch reads of logs whose older segments are offloaded to Parquet files
(logs/offload.py) and whose ledgers are deleted: the same rows, positions
and metadata columns as before the offload, and the files read by Spark's
own Parquet reader give the offloaded rows."""
import os
import uuid

import pytest

from pybk_spark.logs import offload, offload_files
from pybk_spark.logs.log import read_log
from pybk_spark.logs.log_writer import LogWriter, RollPolicy
from pybk_spark.protocol.offload import OffloadPolicy
from pybk_spark.spark.history import read_log as read_log_frame

pytestmark = [pytest.mark.slow, pytest.mark.spark]

NOW = OffloadPolicy(grace_s=0, orphan_age_s=0)


def read(spark, uri, **options):
    r = spark.read.format("bookkeeper").option("metadataServiceUri", uri)
    for key, value in options.items():
        r = r.option(key, value)
    return r.load()


def test_raw_and_dataframe_logs_read_the_same_after_offload(spark, metadata_uri, bk, tmp_path):
    raw = f"offraw-{uuid.uuid4().hex[:8]}"
    with LogWriter(bk, raw, roll_policy=RollPolicy(max_entries=25)).open() as w:
        for k in range(4):
            w.append_batch([b"p%03d" % (k * 25 + i) for i in range(25)])
    frame = f"offdf-{uuid.uuid4().hex[:8]}"
    for k in range(4):
        (spark.range(k * 50, k * 50 + 50).selectExpr("id", "cast(id * 2 as string) AS twice")
         .coalesce(1).write.format("bookkeeper").option("metadataServiceUri", metadata_uri)
         .option("log", frame).mode("append").save())

    def raw_rows():
        t = read(spark, metadata_uri, log=raw).toArrow()
        return sorted(zip(*(t.column(c).to_pylist()
                            for c in ("ledger_id", "entry_id", "payload", "timestamp"))))

    def frame_rows():
        t = read(spark, metadata_uri, log=frame, includeMetadata="true").toArrow()
        return sorted(zip(*(t.column(c).to_pylist() for c in
                            ("id", "twice", "_ledger_id", "_entry_id", "_timestamp"))))
    raw_before, frame_before = raw_rows(), frame_rows()
    for name in (raw, frame):
        report = offload.offload_log(bk, name, str(tmp_path), NOW)
        assert len(report.offloaded) == 2 and report.ledgers_deleted == report.offloaded
    assert raw_rows() == raw_before
    assert frame_rows() == frame_before
    multi = read(spark, metadata_uri, logs=frame, includeMetadata="true").toArrow()
    assert sorted(zip(*(multi.column(c).to_pylist() for c in
                        ("id", "twice", "_ledger_id", "_entry_id", "_timestamp")))) == frame_before

    one = read_log_frame(spark, frame, metadata_uri, include_metadata=True).toArrow()
    assert sorted(zip(*(one.column(c).to_pylist() for c in
                        ("id", "twice", "_ledger_id", "_entry_id", "_timestamp")))) == frame_before
    assert read_log_frame(spark, frame, metadata_uri).columns == ["id", "twice"]
    whole = read_log_frame(spark, raw, metadata_uri).toArrow()
    assert sorted(zip(*(whole.column(c).to_pylist()
                        for c in ("ledger_id", "entry_id", "payload", "timestamp")))) == raw_before

    md, _ = read_log(bk.metadata_store, frame)
    history = spark.read.parquet(os.path.join(tmp_path, offload_files.dataset_dir(md)))
    offloaded = {s.ledger_id for s in md.segments if s.offload is not None}
    got = sorted(tuple(r) for r in history.select("id", "twice", "_ledger_id", "_entry_id")
                 .collect())
    assert got == [r[:4] for r in frame_before if r[2] in offloaded]


def _available_now(spark, uri, checkpoint, **options):
    r = spark.readStream.format("bookkeeper").option("metadataServiceUri", uri)
    for key, value in options.items():
        r = r.option(key, value)
    rows: list = []
    query = (r.load().writeStream
             .foreachBatch(lambda df, _id: rows.extend(tuple(x) for x in df.collect()))
             .option("checkpointLocation", checkpoint).trigger(availableNow=True).start())
    query.awaitTermination()
    return rows


def test_stream_lagging_past_the_offload_reads_on_from_the_files(spark, metadata_uri, bk,
                                                                 tmp_path):
    name = f"offstream-{uuid.uuid4().hex[:8]}"
    checkpoint = str(tmp_path / "ckpt")
    with LogWriter(bk, name, roll_policy=RollPolicy(max_entries=25)).open() as w:
        w.append_batch([b"p%03d" % i for i in range(15)])
        first = _available_now(spark, metadata_uri, checkpoint, log=name)   # stops mid-segment
        w.append_batch([b"p%03d" % i for i in range(15, 25)])
        for k in range(1, 4):
            w.append_batch([b"p%03d" % (k * 25 + i) for i in range(25)])
    report = offload.offload_log(bk, name, str(tmp_path / "off"), NOW)
    assert len(report.offloaded) == 2 and report.ledgers_deleted == report.offloaded
    rest = _available_now(spark, metadata_uri, checkpoint, log=name, maxEntriesPerTrigger="20")
    got = [(p, le) for _lid, le, p, _t in first + rest]
    assert sorted(p for p, _ in got) == [b"p%03d" % i for i in range(100)]   # no gap, no twice
    assert sorted(e for _, e in got) == sorted(list(range(25)) * 4)          # the same offsets
    whole = _available_now(spark, metadata_uri, str(tmp_path / "multi"), logs=name)
    assert sorted(r[1:3] for r in whole) == sorted(r[1:3] for r in first + rest)


def test_a_slice_planned_on_a_ledger_deleted_before_its_read_comes_from_the_files(metadata_uri,
                                                                                    bk, tmp_path):
    """The executor's path, no Spark: a slice planned on a ledger, whose
    offload commits and deletes the ledger before the task reads it."""
    from pybk_spark.spark.options import parse_read_options
    from pybk_spark.spark.planning import Slice
    from pybk_spark.spark.reader import LedgerSlicePartition, read_partition
    name = f"offslice-{uuid.uuid4().hex[:8]}"
    with LogWriter(bk, name, roll_policy=RollPolicy(max_entries=25)).open() as w:
        for k in range(3):
            w.append_batch([b"p%03d" % (k * 25 + i) for i in range(25)])
    first = read_log(bk.metadata_store, name)[0].ledger_ids[0]
    opts = parse_read_options({"metadataServiceUri": metadata_uri, "log": name})
    planned = LedgerSlicePartition.of(Slice(first, 3, 21, ()))
    report = offload.offload_log(bk, name, str(tmp_path), NOW)
    assert report.ledgers_deleted == [first] and first not in bk.list_ledgers()
    rows = [r for batch in read_partition(planned, opts, None) for r in batch.to_pylist()]
    assert [(r["ledger_id"], r["entry_id"], r["payload"]) for r in rows] == \
        [(first, e, b"p%03d" % e) for e in range(3, 22)]


def test_a_damaged_offloaded_file_fails_a_spark_read_naming_it(spark, metadata_uri, bk, tmp_path):
    name = f"offbad-{uuid.uuid4().hex[:8]}"
    with LogWriter(bk, name, roll_policy=RollPolicy(max_entries=10)).open() as w:
        for k in range(3):
            w.append_batch([b"p%03d" % (k * 10 + i) for i in range(10)])
    report = offload.offload_log(bk, name, str(tmp_path), NOW)
    md, _ = read_log(bk.metadata_store, name)
    bad = offload_files.final_name(report.offloaded[0])
    with open(os.path.join(tmp_path, offload_files.dataset_dir(md), bad), "r+b") as f:
        f.seek(100)
        f.write(b"\xff\xfe")
    with pytest.raises(Exception, match=f"OffloadCorrupt.*{bad}") as caught:
        read(spark, metadata_uri, log=name).count()
    assert "Traceback" not in str(caught.value)
