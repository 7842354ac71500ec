"""Options as Spark hands them over: unknown names fail at load()/save()/
start() on the driver, and a wrong ledger password fails planning, not tasks
(real SparkSession, real cluster)."""
import pytest

pytestmark = pytest.mark.spark


def _error_text(call) -> str:
    with pytest.raises(Exception) as info:
        call()
    return str(info.value)


def test_unknown_read_option_fails_at_load(spark, metadata_uri):
    reader = (spark.read.format("bookkeeper").option("metadataServiceUri", metadata_uri)
              .option("ledgers", "1").option("bogusOption", "1"))
    text = _error_text(reader.load)
    assert "IncorrectParameter" in text and "unknown option 'bogusoption'" in text, text
    reader = (spark.read.format("bookkeeper").option("metadataServiceUri", metadata_uri)
              .option("ledgers", "1").option("readBatchEntris", "10"))
    assert "did you mean 'readBatchEntries'" in _error_text(reader.load)


def test_misspelt_write_option_fails_at_save(spark, metadata_uri):
    df = spark.range(3)
    writer = (df.write.format("bookkeeper").option("metadataServiceUri", metadata_uri)
              .option("log", "options-misspelt").option("ensembleSise", "3").mode("append"))
    text = _error_text(writer.save)
    assert "did you mean 'ensembleSize'" in text, text


def test_stream_options_checked_at_load_and_start(spark, metadata_uri, tmp_path):
    stream = (spark.readStream.format("bookkeeper").option("metadataServiceUri", metadata_uri)
              .option("log", "options-stream").option("maxEntriesPerTriger", "5"))
    assert "did you mean 'maxEntriesPerTrigger'" in _error_text(stream.load)
    # load() cannot tell a stream from a batch read; start() refuses batch-only options
    stream = (spark.readStream.format("bookkeeper").option("metadataServiceUri", metadata_uri)
              .option("ledgers", "1").load())
    start = (stream.writeStream.format("console")
             .option("checkpointLocation", str(tmp_path / "c1")).trigger(availableNow=True).start)
    text = _error_text(lambda: start().awaitTermination())
    assert "'ledgers' applies to batch reads only, not to stream reads" in text, text
    (spark.range(3).write.format("bookkeeper").option("metadataServiceUri", metadata_uri)
     .option("log", "options-stream").mode("append").save())
    source = (spark.readStream.format("bookkeeper").option("metadataServiceUri", metadata_uri)
              .option("log", "options-stream").load())
    sink = (source.writeStream.format("bookkeeper").option("metadataServiceUri", metadata_uri)
            .option("log", "options-stream-copy").option("ackQuorom", "1")
            .option("checkpointLocation", str(tmp_path / "c2")).trigger(availableNow=True))
    text = _error_text(lambda: sink.start().awaitTermination())
    assert "did you mean 'ackQuorum'" in text, text


def test_wrong_password_fails_planning_on_the_driver(spark, bk, metadata_uri):
    lh = bk.create_ledger(ensemble=3, write_quorum=2, ack_quorum=2, password=b"secret")
    lh.add_entries([b"a", b"b"])
    lh.close()
    df = (spark.read.format("bookkeeper").option("metadataServiceUri", metadata_uri)
          .option("ledgers", str(lh.ledger_id)).option("password", "wrong").load())
    text = _error_text(df.collect)
    assert "Unauthorized" in text and "wrong password" in text, text
    assert "Lost task" not in text and "Task 0" not in text, text     # no task ran
    bare = (spark.read.format("bookkeeper").option("metadataServiceUri", metadata_uri)
            .option("ledgers", str(lh.ledger_id)).load())
    text = _error_text(bare.collect)
    assert "no password given for a ledger that has one: set the 'password' option" in text, text
    right = (spark.read.format("bookkeeper").option("metadataServiceUri", metadata_uri)
             .option("ledgers", str(lh.ledger_id)).option("password", "secret").load())
    assert sorted(r.payload for r in right.collect()) == [b"a", b"b"]
