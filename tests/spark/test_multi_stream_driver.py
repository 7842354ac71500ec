"""The multi-log stream reader's contract against a real cluster, driven as
Spark drives it (initialOffset, latestOffset, partitions, read, commit) in
this process: PySpark's own data source tests call the reader the same way."""
import json
import uuid

import pytest
from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadMaxRows

from pybk_spark import errors
from pybk_spark.logs.positions import list_positions
from pybk_spark.spark.multi_stream import BookKeeperMultiLogStreamReader
from pybk_spark.spark.options import parse_stream_options


def reader(uri, **options):
    opts = parse_stream_options({"metadataServiceUri": uri, **options})
    return BookKeeperMultiLogStreamReader(opts, None)      # raw logs: raw schema


def raw_log(bk, name, payloads):
    writer = bk.open_log_writer(name)
    try:
        writer.append_batch(payloads)
    finally:
        writer.close()


def run(r, start, end):
    """One micro-batch: (log, payload) rows of [start, end), then Spark's commit."""
    start, end = json.loads(json.dumps(start)), json.loads(json.dumps(end))   # as Spark keeps them
    rows = []
    for part in r.partitions(start, end):
        for batch in r.read(part):
            d = batch.to_pydict()
            rows.extend(zip(d["_log"], d["payload"]))
    r.commit(end)
    return rows


def test_offsets_new_logs_fairness_and_positions(metadata_uri, bk):
    p = f"drv-{uuid.uuid4().hex[:8]}"
    a, b, c = f"{p}-a", f"{p}-b", f"{p}-c"
    raw_log(bk, a, [b"a%d" % i for i in range(6)])
    raw_log(bk, b, [b"b%d" % i for i in range(2)])
    r = reader(metadata_uri, logPattern=rf"{p}-.*", maxEntriesPerTrigger="4")
    try:
        start = r.initialOffset()
        assert set(start["logs"]) == {a, b} and start["stream"].startswith("stream-")
        end = r.latestOffset(start, r.getDefaultReadLimit())
        rows = run(r, start, end)
        assert sorted(log for log, _ in rows) == [a, a, b, b]        # 2 + 2 of 4
        report = r.reportLatestOffset()
        assert report["entriesBehindLatest"] == 4 and set(report["logs"]) == {a, b}
        raw_log(bk, c, [b"c0"])                                      # a new log
        start, end = end, r.latestOffset(end, ReadMaxRows(100))
        assert set(end["logs"]) == {a, b, c}
        rows = run(r, start, end)
        assert sorted(rows) == sorted([(a, b"a%d" % i) for i in range(2, 6)] + [(c, b"c0")])
        assert r.latestOffset(end, ReadAllAvailable()) == end           # nothing new
        names = {n: [q.name for q in list_positions(bk.metadata_store, n)] for n in (a, b, c)}
        assert names == {n: [end["stream"]] for n in (a, b, c)}
    finally:
        r.stop()


def test_single_log_offsets_are_refused_by_a_multi_log_reader(metadata_uri, bk):
    p = f"drv-{uuid.uuid4().hex[:8]}"
    raw_log(bk, f"{p}-a", [b"x"])
    r = reader(metadata_uri, logs=f"{p}-a")
    try:
        with pytest.raises(errors.IncorrectParameter, match="checkpointLocation"):
            r.latestOffset({"index": 0, "entry": 0, "stream": "stream-x"}, ReadAllAvailable())
    finally:
        r.stop()
