"""One password per log through Spark (real SparkSession, real cluster): an
append or a sink with another password is refused on the driver with
``Unauthorized`` naming the log, before any ledger is created or any
metadata changes; the log stays readable with its password, through Spark
and ``pybk readlog``.  A log that older writers left with segments under
different passwords reads with ``extraPasswords``."""
import json

import pytest

from pybk_spark.logs.log import read_log, read_or_create_log, update_log
from pybk_spark.metadata.store import log_key
from pybk_spark.protocol import log_metadata as logmd
from pybk_spark.protocol.ledger_metadata import key_check

from .test_kafka_options import pybk_json
from .test_options_spark import _error_text
from .test_stream import log_name, stream
from .test_write import read, write

pytestmark = pytest.mark.spark


def snapshot(bk, log):
    """What a refused write must leave as it was: the ledgers and the log's value."""
    got = bk.metadata_store.get(log_key(log))
    return set(bk.list_ledgers()), (got.value, got.version)


def test_append_with_another_password_is_refused_and_writes_nothing(spark, metadata_uri, bk):
    log = log_name("pw-append")
    write(spark.range(0, 20).repartition(2), metadata_uri, log, password="pw1")
    md, _ = read_log(bk.metadata_store, log)
    assert md.password_check == key_check(b"pw1") and b"pw1" not in bk.metadata_store.get(
        log_key(log)).value
    before = snapshot(bk, log)
    text = _error_text(lambda: write(spark.range(20, 30), metadata_uri, log, password="pw2"))
    assert "Unauthorized" in text and f"wrong password for log '{log}'" in text, text
    assert "Lost task" not in text, text                     # refused on the driver
    text = _error_text(lambda: write(spark.range(5), metadata_uri, log, mode="overwrite",
                                     password="pw2"))
    assert f"wrong password for log '{log}'" in text, text
    assert snapshot(bk, log) == before                       # no ledger, no metadata change
    assert sorted(r["id"] for r in read(spark, metadata_uri, log, password="pw1").collect()) \
        == list(range(20))
    code, out = pybk_json("readlog", "--metadata-uri", metadata_uri, log, "--password", "pw1")
    assert code == 0 and sorted(row["id"] for r in out["records"] for row in r["rows"]) \
        == list(range(20))
    write(spark.range(20, 25), metadata_uri, log, password="pw1")    # its own password: accepted
    assert len(read(spark, metadata_uri, log, password="pw1").collect()) == 25


def test_sink_with_another_password_is_refused(spark, metadata_uri, bk, tmp_path):
    src, dst = log_name("pw-src"), log_name("pw-dst")
    write(spark.range(0, 10), metadata_uri, src)
    write(spark.range(0, 5), metadata_uri, dst, password="pw1")
    before = snapshot(bk, dst)
    sink = (stream(spark, metadata_uri, src).writeStream.format("bookkeeper")
            .option("metadataServiceUri", metadata_uri).option("log", dst)
            .option("password", "pw2").option("checkpointLocation", str(tmp_path / "ckpt"))
            .trigger(availableNow=True))
    text = _error_text(lambda: sink.start().awaitTermination())
    assert "Unauthorized" in text and f"wrong password for log '{dst}'" in text, text
    assert snapshot(bk, dst) == before
    assert bk.metadata_store.list_prefix(f"spark/pending/{dst}/") == []


def test_mixed_password_log_reads_with_extra_passwords(spark, metadata_uri, bk):
    """Segments under pw1 and pw2, as older writers left them (built with the
    ledger API: nothing records a password in the log)."""
    log = log_name("pw-mixed")
    read_or_create_log(bk.metadata_store, log, bk.rng)
    segments, payloads = [], []
    for i, password in enumerate([b"pw1", b"pw2"]):
        lh = bk.create_ledger(ensemble=3, write_quorum=2, ack_quorum=2, password=password,
                              custom_metadata={"log": log})
        mine = [f"{i}-{k}".encode() for k in range(4)]
        lh.add_entries(mine)
        lh.close()
        segments.append((lh.ledger_id, len(mine), sum(map(len, mine)), -1))
        payloads += mine
    update_log(bk.metadata_store, log, lambda m: logmd.append_closed(m, segments)[0])
    text = _error_text(lambda: read(spark, metadata_uri, log, password="pw1").collect())
    assert "Unauthorized" in text and "wrong password for ledger" in text, text
    got = read(spark, metadata_uri, log, password="pw1", extraPasswords=json.dumps(["pw2"]))
    assert sorted(r.payload for r in got.collect()) == sorted(payloads)
    code, out = pybk_json("readlog", "--metadata-uri", metadata_uri, log, "--password", "pw1",
                          "--extra-password", "pw2")
    assert code == 0 and [r["payload"] for r in out["records"]] == [p.decode() for p in payloads]
    text = _error_text(lambda: read(spark, metadata_uri, log, password="pw1",
                                    extraPasswords="pw2").collect())
    assert "'extraPasswords' must be a JSON array of strings" in text, text
