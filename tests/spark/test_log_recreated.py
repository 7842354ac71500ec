"""A log deleted (``pybk deletelog``) and created again under its name, met by
a streaming query's checkpoint, a pattern stream, a batch read's offsets and
a stream planned just before: real etcd, bookie-server processes, SparkSession."""
import json
import subprocess
import sys
from pathlib import Path

import pytest
from pyspark.sql.streaming.datasource import ReadAllAvailable

from pybk_spark import errors
from pybk_spark.logs.log import read_log
from pybk_spark.logs.positions import list_positions
from pybk_spark.spark.options import parse_stream_options
from pybk_spark.spark.stream_reader import BookKeeperStreamReader

from .test_multi_stream import multi_stream, prefix, rows_of
from .test_stream import log_name, run_available_now, stream
from .test_write import read, write

pytestmark = pytest.mark.spark


def deletelog(uri, name):
    """``pybk --json deletelog`` in its own process, as an operator runs it."""
    done = subprocess.run([str(Path(sys.executable).parent / "pybk"), "--json", "deletelog",
                           "--metadata-uri", uri, name],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def ids(batches):
    return sorted(r[0] for _, rows in batches for r in rows)


def test_stream_checkpoint_of_a_recreated_log_fails_or_reads_the_new_log(
        spark, metadata_uri, bk, tmp_path):
    log = log_name("again")
    write(spark.range(0, 3).repartition(1), metadata_uri, log)
    write(spark.range(3, 6).repartition(1), metadata_uri, log)
    old, _ = read_log(bk.metadata_store, log)
    assert len(old.segments) == 2 and old.uid
    checkpoint = str(tmp_path / "ckpt")
    assert ids(run_available_now(stream(spark, metadata_uri, log), checkpoint)) == list(range(6))
    [before] = list_positions(bk.metadata_store, log)
    assert (before.index, before.entry, before.uid) == (2, 0, old.uid)

    gone = deletelog(metadata_uri, log)
    assert gone["uid"] == old.uid and gone["dropped_positions"] == [before.name]
    write(spark.range(100, 104).repartition(1), metadata_uri, log)
    new, _ = read_log(bk.metadata_store, log)
    assert len(new.segments) == 1 and new.uid not in (None, old.uid)

    with pytest.raises(Exception, match="LogRecreated") as failed:          # failOnDataLoss=true
        run_available_now(stream(spark, metadata_uri, log), checkpoint)
    assert old.uid in str(failed.value) and new.uid in str(failed.value)
    assert list_positions(bk.metadata_store, log) == []

    got = run_available_now(stream(spark, metadata_uri, log, failOnDataLoss="false"), checkpoint)
    assert ids(got) == [100, 101, 102, 103]                                 # from its first entry
    # Spark commits a batch's end to the source when it plans the next one (or
    # when a restarted query resumes): the old log's end is never recorded again
    assert all(p.uid == new.uid for p in list_positions(bk.metadata_store, log))


def test_pattern_stream_meets_a_log_recreated_between_batches(spark, metadata_uri, bk, tmp_path):
    p = prefix("again")
    a, b = f"{p}-a", f"{p}-b"
    write(spark.range(0, 2), metadata_uri, a)
    write(spark.range(10, 12), metadata_uri, b)
    write(spark.range(12, 14), metadata_uri, b)
    strict, lenient = str(tmp_path / "strict"), str(tmp_path / "lenient")
    for checkpoint in (strict, lenient):
        assert len(rows_of(run_available_now(
            multi_stream(spark, metadata_uri, logPattern=rf"{p}-.*"), checkpoint))) == 6
    old = read_log(bk.metadata_store, b)[0].uid
    deletelog(metadata_uri, b)
    write(spark.range(20, 23), metadata_uri, b)
    write(spark.range(2, 3), metadata_uri, a)
    new = read_log(bk.metadata_store, b)[0].uid
    with pytest.raises(Exception, match="LogRecreated") as failed:
        run_available_now(multi_stream(spark, metadata_uri, logPattern=rf"{p}-.*"), strict)
    assert b in str(failed.value) and old in str(failed.value) and new in str(failed.value)
    got = run_available_now(multi_stream(spark, metadata_uri, logPattern=rf"{p}-.*",
                                         failOnDataLoss="false"), lenient)
    assert rows_of(got) == [(2, a), (20, b), (21, b), (22, b)]
    assert {q.uid for q in list_positions(bk.metadata_store, b)} <= {new}


def test_batch_offsets_naming_a_recreated_log_are_refused(spark, metadata_uri, bk):
    log = log_name("batch-again")
    write(spark.range(0, 3).repartition(1), metadata_uri, log, maxRowsPerEntry="1")
    old, _ = read_log(bk.metadata_store, log)
    offsets = json.dumps({"uid": old.uid, str(old.ledger_ids[0]): 1})
    assert sorted(r["id"] for r in read(spark, metadata_uri, log,
                                        startingOffsets=offsets).collect()) == [1, 2]
    deletelog(metadata_uri, log)
    write(spark.range(5, 8).repartition(1), metadata_uri, log, maxRowsPerEntry="1")
    new, _ = read_log(bk.metadata_store, log)
    with pytest.raises(Exception, match="LogRecreated") as refused:
        read(spark, metadata_uri, log, startingOffsets=offsets).collect()
    assert old.uid in str(refused.value) and new.uid in str(refused.value)
    mine = json.dumps({"uid": new.uid, str(new.ledger_ids[0]): 1})
    assert sorted(r["id"] for r in read(spark, metadata_uri, log,
                                        startingOffsets=mine).collect()) == [6, 7]


def test_a_batch_planned_in_the_deleted_log_reads_nothing_of_the_new_one(metadata_uri, bk):
    """The driver as Spark drives it: a batch whose end was planned before the
    log was deleted and created again (a restart replays it)."""
    log = log_name("planned")
    writer = bk.open_log_writer(log)
    writer.append_batch([b"old%d" % i for i in range(3)])
    writer.close()

    def reader(**options):
        opts = parse_stream_options({"metadataServiceUri": metadata_uri, "log": log, **options})
        return BookKeeperStreamReader(opts, None)
    strict, lenient = reader(), reader(failOnDataLoss="false")
    try:
        start = strict.initialOffset()
        end = strict.latestOffset(start, ReadAllAvailable())
        assert end["uid"] == start["uid"] == read_log(bk.metadata_store, log)[0].uid
        deletelog(metadata_uri, log)
        writer = bk.open_log_writer(log)
        writer.append_batch([b"new%d" % i for i in range(2)])
        writer.close()
        with pytest.raises(errors.LogRecreated, match="deleted and created again"):
            strict.partitions(start, end)
        assert lenient.partitions(start, end) == []
        again = lenient.latestOffset(end, ReadAllAvailable())
        assert again["uid"] == read_log(bk.metadata_store, log)[0].uid != end["uid"]
        assert (again["index"], again["entry"]) == (1, 0)
        rows = [p for part in lenient.partitions(end, again) for batch in lenient.read(part)
                for p in batch.to_pydict()["payload"]]
        assert rows == [b"new0", b"new1"]
        lenient.commit(end)                     # the old log's end: recorded no more
        assert list_positions(bk.metadata_store, log) == []
        lenient.commit(again)
        assert [(p.index, p.entry, p.uid) for p in list_positions(bk.metadata_store, log)] \
            == [(1, 0, again["uid"])]
    finally:
        strict.stop()
        lenient.stop()
