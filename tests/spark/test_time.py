"""Append times and time-based reads (startingTimestamp, endingTimestamp, the
per-ledger JSON forms, a stream starting at a time) against the standalone
cluster and a real SparkSession (docs/spark.md, "Time").  Writers take an
injected clock, so every time is known; planning is checked in-process (the
reader API as Spark calls it) and each feature once through Spark."""
import pyarrow as pa
import pytest
from pyspark.sql.types import LongType, StructField, StructType

from pybk_spark import errors
from pybk_spark.logs.log import read_log
from pybk_spark.logs.log_writer import LogWriter, RollPolicy
from pybk_spark.protocol import log_metadata as logmd
from pybk_spark.spark.datasource import BookKeeperDataSource
from pybk_spark.spark.options import parse_load_options
from pybk_spark.spark.write_options import parse_write_options
from pybk_spark.spark.writer import commit_job, prepare_log, write_task

from .test_kafka_options import log_name
from .test_stream import run_available_now, stream
from .test_write import read

pytestmark = pytest.mark.spark

ID_SCHEMA = StructType([StructField("id", LongType())])


def append_dataframe(bk, uri, log, batches):
    """One DataFrame write (as a Spark task and commit do it), batch i stamped
    at ``batches[i][1]`` seconds."""
    opts = parse_write_options({"metadataServiceUri": uri, "log": log, "maxRowsPerEntry": "3"})
    schema_text = prepare_log(bk, opts, ID_SCHEMA, False)
    arrow = [pa.RecordBatch.from_pydict({"id": pa.array(ids, pa.int64())}) for ids, _ in batches]
    clock = iter([float(t) for _, t in batches])
    msg = write_task(opts, "time-test", schema_text, iter(arrow), wall_clock=lambda: next(clock))
    commit_job(bk, opts, "time-test", schema_text, [msg])
    return msg.ledger_id


def planned(uri, **options):
    """{ledger: (first, last)} the reader plans, without Spark."""
    source = BookKeeperDataSource(dict({"metadataServiceUri": uri}, **options))
    out = {}
    for p in source.reader(source.schema()).partitions():
        first, last = out.get(p.ledger_id, (p.first, p.last))
        out[p.ledger_id] = (min(first, p.first), max(last, p.last))
    return out


def test_dataframe_log_reads_from_and_until_a_time(spark, metadata_uri, bk):
    log = log_name("time-df")
    a = append_dataframe(bk, metadata_uri, log, [(range(0, 10), 1000)])
    b = append_dataframe(bk, metadata_uri, log, [(range(10, 13), 2000), (range(13, 16), 2001),
                                                 (range(16, 20), 2002)])
    c = append_dataframe(bk, metadata_uri, log, [(range(20, 30), 3000)])
    md = read_log(bk.metadata_store, log)[0]
    assert [(s.first_time_us, s.last_time_us) for s in md.segments] == [
        (1000_000_000, 1000_000_000), (2000_000_000, 2002_000_000),
        (3000_000_000, 3000_000_000)]                          # segment times recorded
    # ledger b straddles 2001 s: searched; a and c are decided by their recorded times
    assert planned(metadata_uri, log=log, startingTimestamp="2001000") == {b: (1, 3), c: (0, 3)}
    assert planned(metadata_uri, log=log, endingTimestamp="2002000") == {a: (0, 3), b: (0, 1)}
    assert planned(metadata_uri, log=log, startingOffsetsByTimestamp=f'{{"{b}": 2002000}}',
                   endingOffsetsByTimestamp=f'{{"{c}": 0}}') == {a: (0, 3), b: (2, 3)}
    # through Spark: rows and the _timestamp column
    df = read(spark, metadata_uri, log, startingTimestamp="1500000", endingTimestamp="2500000",
              includeMetadata="true")
    assert df.columns == ["id", "_ledger_id", "_entry_id", "_timestamp"]
    rows = sorted((r["id"], r["_timestamp"].timestamp()) for r in df.collect())
    assert rows == [(i, 2000.0 + (i - 10) // 3 if i < 16 else 2002.0) for i in range(10, 20)]


def test_raw_log_time_column_search_and_stream_start(spark, metadata_uri, bk, tmp_path):
    """A raw log (LogWriter, injected clock): one entry per second, 4 per ledger."""
    log = log_name("time-raw")
    clock = iter(range(1000, 1010))
    with LogWriter(bk, log, roll_policy=RollPolicy(max_entries=4),
                   wall_clock=lambda: float(next(clock))).open() as w:
        for i in range(10):
            w.append(b"e%d" % i)
    md = read_log(bk.metadata_store, log)[0]
    closed = [s for s in md.segments if s.state == logmd.SEGMENT_CLOSED]
    assert (closed[0].first_time_us, closed[0].last_time_us) == (1000_000_000, 1003_000_000)
    l0, l1, l2 = md.ledger_ids
    assert planned(metadata_uri, log=log, startingTimestamp="1005000") == {l1: (1, 3),
                                                                           l2: (0, 1)}
    assert planned(metadata_uri, log=log, endingTimestamp="1002500") == {l0: (0, 2)}
    rows = read(spark, metadata_uri, log, startingTimestamp="1002500").collect()
    assert rows[0].asDict().keys() == {"ledger_id", "entry_id", "payload", "timestamp"}
    assert sorted((r.payload, r.timestamp.timestamp()) for r in rows) == [
        (b"e%d" % i, 1000.0 + i) for i in range(3, 10)]       # header stripped, time read
    with bk.open_log_reader(log) as reader:                   # the LogReader strips it too
        got = reader.read_available()
    assert [(r.payload, r.append_time_us) for r in got][:2] == [(b"e0", 1000_000_000),
                                                                (b"e1", 1001_000_000)]
    batches = run_available_now(stream(spark, metadata_uri, log, startingTimestamp="1007000"),
                                str(tmp_path / "ckpt"))
    assert sorted(r[2] for _, rows in batches for r in rows) == [b"e7", b"e8", b"e9"]


def test_times_inside_offloaded_segments_are_found_in_their_files(spark, metadata_uri, bk,
                                                                   tmp_path):
    """The two older segments offloaded and their ledgers deleted: a start or
    end time that falls inside one is found in its Parquet files."""
    from pybk_spark.logs.offload import offload_log
    from pybk_spark.protocol.offload import OffloadPolicy
    log = log_name("time-offloaded")
    clock = iter(range(1000, 1014))
    with LogWriter(bk, log, roll_policy=RollPolicy(max_entries=4),
                   wall_clock=lambda: float(next(clock))).open() as w:
        for i in range(14):
            w.append(b"e%d" % i)
    report = offload_log(bk, log, str(tmp_path / "off"), OffloadPolicy(grace_s=0, orphan_age_s=0))
    l0, l1, l2, l3 = read_log(bk.metadata_store, log)[0].ledger_ids
    assert report.ledgers_deleted == [l0, l1]
    assert planned(metadata_uri, log=log, startingTimestamp="1005500") == {
        l1: (2, 3), l2: (0, 3), l3: (0, 1)}
    assert planned(metadata_uri, log=log, endingTimestamp="1002500") == {l0: (0, 2)}
    rows = read(spark, metadata_uri, log, startingTimestamp="1005500").collect()
    assert sorted(r.payload for r in rows) == sorted(b"e%d" % i for i in range(6, 14))


def test_old_entries_without_time_read_with_null_timestamp(spark, metadata_uri, bk):
    """Ledgers written with the ledger API (as every ledger before append times
    were recorded): null timestamp; a start time skips them, an end time keeps them."""
    lh = bk.create_ledger(ensemble=3, write_quorum=2, ack_quorum=2)
    lh.add_entries([b"old-0", b"old-1"])
    lh.close()
    lid = str(lh.ledger_id)
    rows = (spark.read.format("bookkeeper").option("metadataServiceUri", metadata_uri)
            .option("ledgers", lid).load().collect())
    assert [(r.payload, r.timestamp) for r in rows] == [(b"old-0", None), (b"old-1", None)]
    assert planned(metadata_uri, ledgers=lid, startingTimestamp="0") == {}
    assert planned(metadata_uri, ledgers=lid, endingTimestamp="0") == {lh.ledger_id: (0, 1)}


def test_time_options_are_checked(spark, metadata_uri):
    def load(**options):
        return parse_load_options(dict({"metadataServiceUri": metadata_uri, "ledgers": "1"},
                                       **options))
    with pytest.raises(errors.IncorrectParameter, match="startingOffsets.*startingTimestamp"):
        load(startingOffsets="earliest", startingTimestamp="5")
    with pytest.raises(errors.IncorrectParameter, match="milliseconds since the Unix epoch"):
        load(endingTimestamp="yesterday")
    with pytest.raises(errors.IncorrectParameter, match="not listed in 'ledgers'"):
        load(startingOffsetsByTimestamp='{"2": 5}')
    with pytest.raises(errors.IncorrectParameter, match="for batch reads"):
        load(endingTimestamp="5", maxEntriesPerTrigger="1")
    with pytest.raises(Exception, match="milliseconds since the Unix epoch"):     # via Spark
        (spark.read.format("bookkeeper").option("metadataServiceUri", metadata_uri)
         .option("ledgers", "1").option("startingTimestamp", "-3").load())
