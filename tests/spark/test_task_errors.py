"""An expected error of ours in a Spark task or a planning step reaches the
user as our one line, with no Python traceback before it (real SparkSession,
real cluster): a read task meeting an entry that is not a DataFrame row
batch, a write task given a row over the largest entry, the read planning
of a ledger list naming a missing ledger or given a wrong password, and a
sink's commit into a log that another writer created meanwhile with its own
password (Spark reports the commit's failure as "Writing job failed.", ours
as its cause).
A task's failure is PySpark's ``PythonException``, whose text is ``An
exception was thrown from the Python worker:`` and then our line."""
import time

import pytest
from pyspark.sql import functions as F

from pybk_spark.logs.log_writer import LogWriter

from .test_stream import log_name, stream
from .test_write import read, write

pytestmark = pytest.mark.spark

TASK_FAILED = "An exception was thrown from the Python worker:"
PLANNING_FAILED = ("[PYTHON_DATA_SOURCE_ERROR] Failed to generate Python data source read "
                   "partitions: ")


def lines(call) -> list[str]:
    with pytest.raises(Exception) as info:
        call()
    text = str(info.value)
    assert "Traceback" not in text, text[:3000]
    return text.splitlines()


def raw_ledgers(spark, metadata_uri, **options):
    r = spark.read.format("bookkeeper").option("metadataServiceUri", metadata_uri)
    for key, value in options.items():
        r = r.option(key, value)
    return r.load()


def test_a_read_task_meeting_a_foreign_entry_leads_with_our_line(spark, metadata_uri, bk):
    log = log_name("foreign")
    write(spark.range(0, 5).coalesce(1), metadata_uri, log)
    writer = LogWriter(bk, log).open()          # a client appends a payload of its own
    writer.append_batch([b"not an arrow batch"])
    writer.close()
    got = lines(lambda: read(spark, metadata_uri, log).collect())
    assert got[0] == TASK_FAILED, got[:3]
    assert got[1].startswith("pybk_spark.errors.ReadError: entry is not an Arrow IPC stream"), \
        got[:3]


def test_a_write_task_given_a_row_over_the_entry_limit_leads_with_our_line(spark, metadata_uri):
    df = spark.createDataFrame([(1, b"B" * (200 << 10))], "id long, bin binary").coalesce(1)
    got = lines(lambda: write(df, metadata_uri, log_name("big"),
                              **{"bk.max_entry_size_bytes": str(64 << 10)}))
    assert got[0] == TASK_FAILED, got[:3]
    assert got[1].startswith("pybk_spark.errors.TooLarge: a single row of partition 0 "
                             "encode(s) to an entry of "), got[:3]


def test_planning_a_missing_ledger_leads_with_our_line(spark, metadata_uri, bk):
    lh = bk.create_ledger(3, 2, 2)
    lh.add_entries([b"a"])
    lh.close()
    missing = max(bk.list_ledgers()) + 1000
    got = lines(lambda: raw_ledgers(spark, metadata_uri,
                                    ledgers=f"{lh.ledger_id},{missing}").collect())
    assert got[0].startswith(PLANNING_FAILED + f"pybk_spark.errors.NoSuchLedger: no ledger "
                             f"{missing} in this metadata scope: "), got[:3]
    assert "pybk listledgers" in got[0], got[:3]


def test_planning_with_a_wrong_password_leads_with_our_line(spark, metadata_uri, bk):
    lh = bk.create_ledger(3, 2, 2, password=b"secret")
    lh.add_entries([b"a"])
    lh.close()
    got = lines(lambda: raw_ledgers(spark, metadata_uri, ledgers=str(lh.ledger_id),
                                    password="guess").collect())
    assert got[0].startswith(PLANNING_FAILED + "pybk_spark.errors.Unauthorized: wrong password "
                             "for ledger: not the one it was created with"), got[:3]


def test_a_sink_commit_refused_by_the_log_leads_with_our_line(spark, metadata_uri, bk,
                                                              tmp_path):
    """The write task waits until the test has created the sink's log with
    another password: the batch's commit (the sink's commit runner) is refused."""
    src, dst = log_name("src"), log_name("dst")
    write(spark.range(0, 3).coalesce(1), metadata_uri, src)
    reached, release = tmp_path / "reached", tmp_path / "release"

    def gate(value):
        reached.touch()
        deadline = time.monotonic() + 300
        while not release.exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        return value

    rows = stream(spark, metadata_uri, src).select(F.udf(gate, "long")("id").alias("id"))
    query = (rows.writeStream.format("bookkeeper").option("metadataServiceUri", metadata_uri)
             .option("log", dst).option("password", "pw2")
             .option("checkpointLocation", str(tmp_path / "ckpt"))
             .trigger(availableNow=True).start())
    try:
        deadline = time.monotonic() + 300
        while not reached.exists() and time.monotonic() < deadline:
            time.sleep(0.2)
        LogWriter(bk, dst, password=b"pw1").open().close()
    finally:
        release.touch()
    with pytest.raises(Exception) as info:
        query.awaitTermination()
    # Spark's own text is "[STREAM_FAILED] ... terminated with exception: Writing job
    # failed."; the commit's error is in its causes (PySpark keeps them in ``_cause``)
    texts, exc = [], info.value
    while exc is not None:
        texts.append(str(exc))
        exc = getattr(exc, "_cause", None)
    assert "Writing job failed." in texts[0].splitlines()[0], texts[0][:2000]
    ours = ("[PYTHON_STREAMING_DATA_SOURCE_RUNTIME_ERROR] Failed when Python streaming data "
            "source perform commit: pybk_spark.errors.Unauthorized: wrong password for log "
            f"'{dst}'")
    assert any(ours in text.splitlines()[0] for text in texts), [t[:500] for t in texts]
    assert not any("Traceback" in text for text in texts), [t[:2000] for t in texts]
