"""Batch reads of raw ledgers through the ``bookkeeper`` source, against a real
cluster (etcd + bookie-server processes) and a real local SparkSession."""
import os
import subprocess
import sys
import textwrap

import pyarrow as pa
import pytest

from pybk_spark import errors
from pybk_spark.spark.datasource import BookKeeperDataSource
from pybk_spark.spark.reader import RAW_ARROW_SCHEMA, LedgerSlicePartition

from .conftest import spark_env

pytestmark = pytest.mark.spark


def write_ledger(bk, payloads, *, close=True):
    lh = bk.create_ledger(ensemble=3, write_quorum=2, ack_quorum=2)
    ids = lh.add_entries(payloads) if payloads else []
    assert ids == list(range(len(payloads)))
    if close:
        lh.close()
    return lh


def payloads_for(tag, n):
    return [b"%s-%05d-" % (tag, i) + bytes([i % 251]) * (i % 37) for i in range(n)]


def load(spark, uri, ledgers, **options):
    reader = (spark.read.format("bookkeeper").option("metadataServiceUri", uri)
              .option("ledgers", ",".join(str(x) for x in ledgers)))
    for key, value in options.items():
        reader = reader.option(key, value)
    return reader.load()


def rows_of(df):
    table = df.toArrow().sort_by([("ledger_id", "ascending"), ("entry_id", "ascending")])
    return list(zip(*(table.column(c).to_pylist() for c in ("ledger_id", "entry_id", "payload"))))


@pytest.fixture(scope="module")
def two_ledgers(bk):
    """Two closed ledgers (250 and 120 entries), shared by the read tests."""
    a = write_ledger(bk, payloads_for(b"a", 250))
    b = write_ledger(bk, payloads_for(b"b", 120))
    expected = ([(a.ledger_id, i, p) for i, p in enumerate(payloads_for(b"a", 250))]
                + [(b.ledger_id, i, p) for i, p in enumerate(payloads_for(b"b", 120))])
    return a.ledger_id, b.ledger_id, sorted(expected)


def test_reader_without_spark_yields_exact_arrow_schema(metadata_uri, two_ledgers):
    """The reader API itself (as Spark calls it, in one process): partitions map
    onto fragments and read() yields batches with exactly the declared schema."""
    a, b, expected = two_ledgers
    source = BookKeeperDataSource({"metadataServiceUri": metadata_uri, "ledgers": f"{a},{b}",
                                   "readBatchEntries": "64"})
    reader = source.reader(source.schema())
    parts = reader.partitions()
    assert all(isinstance(p, LedgerSlicePartition) for p in parts)
    assert [(p.ledger_id, p.first, p.last) for p in parts] == [(a, 0, 249), (b, 0, 119)]
    batches = [batch for p in parts for batch in reader.read(p)]
    assert all(batch.schema.equals(RAW_ARROW_SCHEMA) for batch in batches)
    table = pa.Table.from_batches(batches)
    got = list(zip(*(table.column(c).to_pylist() for c in ("ledger_id", "entry_id", "payload"))))
    assert got == expected


def test_empty_ledgers_plan_no_partition(metadata_uri, bk):
    closed_empty = write_ledger(bk, []).ledger_id
    open_empty = write_ledger(bk, [], close=False).ledger_id
    source = BookKeeperDataSource({"metadataServiceUri": metadata_uri,
                                   "ledgers": f"{closed_empty},{open_empty}"})
    assert source.reader(source.schema()).partitions() == []


def test_round_trip_with_partitions_per_fragment_and_slices(spark, metadata_uri, bk, two_ledgers):
    a, b, expected = two_ledgers
    df = load(spark, metadata_uri, [a, b])
    assert df.schema.simpleString() == \
        "struct<ledger_id:bigint,entry_id:bigint,payload:binary,timestamp:timestamp>"
    fragments = sum(len(bk.get_ledger_metadata(x).fragments()) for x in (a, b))
    assert df.rdd.getNumPartitions() == fragments == 2
    assert rows_of(df) == expected

    sliced = load(spark, metadata_uri, [a, b], maxEntriesPerPartition="100")
    assert sliced.rdd.getNumPartitions() == 3 + 2
    assert rows_of(sliced) == expected


def test_partitions_follow_fragments_across_an_ensemble_change(spark, metadata_uri, bk, cluster):
    """A bookie dies mid-ledger: the writer changes ensemble (a second fragment);
    Spark plans one partition per fragment and reads both with that bookie still
    down (the fixture restarts it after the test)."""
    payloads = payloads_for(b"frag", 80)
    lh = bk.create_ledger(ensemble=2, write_quorum=2, ack_quorum=2)
    assert lh.add_entries(payloads[:40]) == list(range(40))
    victim = bk.get_ledger_metadata(lh.ledger_id).current_ensemble[0]
    cluster.kill_bookie(victim)
    assert lh.add_entries(payloads[40:]) == list(range(40, 80))
    lh.close()
    fragments = bk.get_ledger_metadata(lh.ledger_id).fragments()
    assert len(fragments) == 2 and victim not in fragments[1][2]

    df = load(spark, metadata_uri, [lh.ledger_id])
    assert df.rdd.getNumPartitions() == len(fragments) == 2
    assert rows_of(df) == [(lh.ledger_id, i, p) for i, p in enumerate(payloads)]


def test_starting_and_ending_offsets(spark, metadata_uri, two_ledgers):
    a, b, expected = two_ledgers
    df = load(spark, metadata_uri, [a, b], startingOffsets=f'{{"{a}": 10}}',
              endingOffsets=f'{{"{a}": 20, "{b}": -1}}')
    assert rows_of(df) == [r for r in expected if (r[0] == a and 10 <= r[1] < 20) or r[0] == b]
    assert load(spark, metadata_uri, [a], startingOffsets="latest").count() == 0


def test_open_ledger_reads_prefix_up_to_lac_then_recovery_closes_it(spark, metadata_uri, bk):
    payloads = payloads_for(b"open", 60)
    lh = write_ledger(bk, payloads[:50], close=False)
    assert [lh.add_entry(p) for p in payloads[50:]] == list(range(50, 60))
    lid = lh.ledger_id
    lac = bk.open_ledger(lid, recovery=False).last_add_confirmed
    assert 49 <= lac <= 59           # entries 50.. carry LAC >= 49; nothing past 59 exists

    got = rows_of(load(spark, metadata_uri, [lid]))
    # exactly a prefix up to the LAC seen at planning time (the LAC may only have grown)
    assert lac + 1 <= len(got) <= 60
    assert got == [(lid, i, p) for i, p in enumerate(payloads[:len(got)])]
    assert lh.add_entry(b"still writable") == 60           # a non-fencing read left the writer alone

    recovered = rows_of(load(spark, metadata_uri, [lid], recovery="true"))
    md = bk.get_ledger_metadata(lid)
    assert md.state == "CLOSED" and md.last_entry_id == 60
    assert recovered == [(lid, i, p) for i, p in enumerate(payloads + [b"still writable"])]
    with pytest.raises(errors.BKError):
        lh.add_entry(b"after recovery")                     # fenced: the writer is shut out


def test_log_option_reads_a_raw_log_across_its_ledgers(spark, metadata_uri, bk):
    from pybk_spark.logs.log import read_log
    from pybk_spark.logs.log_writer import LogWriter, RollPolicy
    name = f"spark-raw-{os.getpid()}"
    payloads = payloads_for(b"log", 70)
    with LogWriter(bk, name, roll_policy=RollPolicy(max_entries=30)).open() as w:
        w.append_batch(payloads[:40])
        for p in payloads[40:]:
            w.append(p)
    ledgers = read_log(bk.metadata_store, name)[0].ledger_ids
    assert len(ledgers) >= 2
    df = (spark.read.format("bookkeeper").option("metadataServiceUri", metadata_uri)
          .option("log", name).load())
    rows = df.toArrow()
    got = list(zip(rows.column("ledger_id").to_pylist(), rows.column("entry_id").to_pylist()))
    assert got == sorted(got, key=lambda r: (ledgers.index(r[0]), r[1]))    # log order
    assert rows.column("payload").to_pylist() == payloads
    with pytest.raises(Exception, match="LogNotFound|no log named"):
        (spark.read.format("bookkeeper").option("metadataServiceUri", metadata_uri)
         .option("log", "no-such-log").load().count())


def test_missing_uri_and_unknown_ledger_give_clear_errors(spark, metadata_uri):
    with pytest.raises(Exception, match="metadataServiceUri' is required"):
        spark.read.format("bookkeeper").option("ledgers", "1").load()
    with pytest.raises(Exception, match="NoSuchLedger|No such ledger"):
        load(spark, metadata_uri, [987654321]).count()


@pytest.mark.slow
def test_discovered_without_register_from_outside_the_project(metadata_uri, two_ledgers, tmp_path):
    """A fresh Python process whose working directory is not the project root:
    the format name resolves through pyspark_bookkeeper on sys.path alone."""
    a, _, expected = two_ledgers
    script = tmp_path / "discover.py"
    script.write_text(textwrap.dedent(f"""
        from pyspark.sql import SparkSession
        spark = (SparkSession.builder.master("local[1]").config("spark.ui.enabled", "false")
                 .getOrCreate())
        df = (spark.read.format("bookkeeper").option("metadataServiceUri", {metadata_uri!r})
              .option("ledgers", "{a}").load())
        print("ROWS", df.count())
        spark.stop()
    """))
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env.update(spark_env())
    out = subprocess.run([sys.executable, str(script)], cwd=str(tmp_path), env=env,
                         capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    assert f"ROWS {sum(1 for r in expected if r[0] == a)}" in out.stdout
