"""Append times and time-based reads (startingTimestamp, endingTimestamp, the
per-ledger JSON forms, a stream starting at a time) against the standalone
cluster and a real SparkSession (docs/spark.md, "Time")."""
import time

import pytest

from pybk_spark.log import LogWriter, RollPolicy, read_log
from pybk_spark.protocol import log_metadata as logmd

from .test_kafka_options import log_name
from .test_stream import run_available_now, stream
from .test_write import read, write

pytestmark = pytest.mark.spark


def next_ms() -> int:
    """A millisecond boundary after every time stamped so far (spins < 1 ms)."""
    cut = int(time.time() * 1000) + 1
    while time.time() * 1000 < cut:
        pass
    return cut


def ids(df):
    return sorted(r[0] for r in df.collect())


def test_dataframe_log_reads_from_and_until_a_time(spark, metadata_uri, bk):
    log = log_name("time-df")
    write(spark.range(0, 10).coalesce(1), metadata_uri, log, maxRowsPerEntry="3")
    c1 = next_ms()
    write(spark.range(10, 20).coalesce(1), metadata_uri, log, maxRowsPerEntry="3")
    c2 = next_ms()
    write(spark.range(20, 30).coalesce(1), metadata_uri, log, maxRowsPerEntry="3")
    md = read_log(bk.metadata_store, log)[0]
    first, second, third = md.segments
    assert first.last_time_us < c1 * 1000 <= second.first_time_us <= second.last_time_us \
        < c2 * 1000 <= third.first_time_us                     # segment times recorded
    assert ids(read(spark, metadata_uri, log, startingTimestamp=str(c1))) == list(range(10, 30))
    assert ids(read(spark, metadata_uri, log, endingTimestamp=str(c2))) == list(range(20))
    assert ids(read(spark, metadata_uri, log, startingTimestamp=str(c1),
                    endingTimestamp=str(c2))) == list(range(10, 20))
    # per ledger: the first segment from c1 on (nothing), the others from the start
    by_ledger = read(spark, metadata_uri, log,
                     startingOffsetsByTimestamp=f'{{"{first.ledger_id}": {c1}}}')
    assert ids(by_ledger) == list(range(10, 30))
    meta = read(spark, metadata_uri, log, includeMetadata="true")
    assert meta.columns == ["id", "_ledger_id", "_entry_id", "_timestamp"]
    stamps = {r["id"]: r["_timestamp"].timestamp() * 1000 for r in meta.collect()}
    assert all((stamps[i] < c1) == (i < 10) for i in range(30))
    assert all((stamps[i] < c2) == (i < 20) for i in range(30))


def test_time_inside_a_ledger_is_found_by_a_bounded_search(spark, metadata_uri, bk, tmp_path):
    """A raw log (LogWriter, injected clock): one entry per second, 4 per
    ledger; a time inside a ledger is searched, times around ledgers skip them."""
    log = log_name("time-raw")
    clock = iter(range(1000, 1010))
    with LogWriter(bk, log, roll_policy=RollPolicy(max_entries=4),
                   wall_clock=lambda: float(next(clock))).open() as w:
        for i in range(10):
            w.append(b"e%d" % i)
    md = read_log(bk.metadata_store, log)[0]
    closed = [s for s in md.segments if s.state == logmd.SEGMENT_CLOSED]
    assert (closed[0].first_time_us, closed[0].last_time_us) == (1000_000_000, 1003_000_000)
    df = read(spark, metadata_uri, log, startingTimestamp="1005000")      # 1005 s
    assert sorted(r.payload for r in df.collect()) == [b"e%d" % i for i in range(5, 10)]
    assert df.columns == ["ledger_id", "entry_id", "payload", "timestamp"]
    rows = read(spark, metadata_uri, log, endingTimestamp="1002500").collect()
    assert sorted((r.payload, r.timestamp.timestamp()) for r in rows) == [
        (b"e0", 1000.0), (b"e1", 1001.0), (b"e2", 1002.0)]
    # the LogReader strips the header and reports the time too
    with bk.open_log_reader(log) as reader:
        got = reader.read_available()
    assert [(r.payload, r.append_time_us) for r in got][:2] == [(b"e0", 1000_000_000),
                                                                (b"e1", 1001_000_000)]
    # a stream starting at a time
    batches = run_available_now(stream(spark, metadata_uri, log,
                                       startingTimestamp="1007000"), str(tmp_path / "ckpt"))
    assert sorted(r[2] for _, rows in batches for r in rows) == [b"e7", b"e8", b"e9"]


def test_old_entries_without_time_read_with_null_timestamp(spark, metadata_uri, bk):
    """Ledgers written with the ledger API (as every ledger before append times
    were recorded): null timestamp; a start time skips them, an end time keeps them."""
    lh = bk.create_ledger(ensemble=3, write_quorum=2, ack_quorum=2)
    lh.add_entries([b"old-0", b"old-1"])
    lh.close()
    rows = raw(spark, metadata_uri, lh.ledger_id).collect()
    assert [(r.payload, r.timestamp) for r in rows] == [(b"old-0", None), (b"old-1", None)]
    assert raw(spark, metadata_uri, lh.ledger_id, startingTimestamp="0").count() == 0
    assert raw(spark, metadata_uri, lh.ledger_id, endingTimestamp=str(next_ms())).count() == 2


def raw(spark, uri, ledger_id, **options):
    r = spark.read.format("bookkeeper").option("metadataServiceUri", uri) \
        .option("ledgers", str(ledger_id))
    for key, value in options.items():
        r = r.option(key, value)
    return r.load()


def test_time_options_are_checked(spark, metadata_uri):
    with pytest.raises(Exception, match="startingOffsets.*startingTimestamp.*give one"):
        raw(spark, metadata_uri, 1, startingOffsets="earliest", startingTimestamp="5")
    with pytest.raises(Exception, match="milliseconds since the Unix epoch"):
        raw(spark, metadata_uri, 1, endingTimestamp="yesterday")
    with pytest.raises(Exception, match="not listed in 'ledgers'"):
        raw(spark, metadata_uri, 1, startingOffsetsByTimestamp='{"2": 5}')
    with pytest.raises(Exception, match="for batch reads"):
        (spark.readStream.format("bookkeeper").option("metadataServiceUri", metadata_uri)
         .option("log", "x").option("endingTimestamp", "5")
         .option("maxEntriesPerTrigger", "1").load())
