"""Several queries over ONE DataFrame of the ``bookkeeper`` source, with
``spark.sql.python.filterPushdown.enabled`` on and off: every query counts
the rows its own filters select, whatever ran before it on the same
DataFrame, its temp view, or its cache (real cluster, real SparkSession)."""
import logging

import pytest

from pybk_spark.spark.datasource import BookKeeperDataSource
from pybk_spark.spark.reader import note_filters_not_pushed

from .test_read import load, payloads_for, rows_of, write_ledger

pytestmark = pytest.mark.spark

PUSHDOWN = "spark.sql.python.filterPushdown.enabled"
ENTRIES = 20


@pytest.fixture(scope="module")
def ledger20(bk):
    return write_ledger(bk, payloads_for(b"push", ENTRIES)).ledger_id


@pytest.fixture(scope="module")
def ledger30(bk):
    return write_ledger(bk, payloads_for(b"other", 30)).ledger_id


def entry_ids(df):
    return sorted(r.entry_id for r in df.select("entry_id").collect())


def scalar(spark, sql):
    return spark.sql(sql).first()[0]


@pytest.mark.parametrize("pushdown", ["true", "false"])
def test_queries_over_one_dataframe_count_their_own_rows(spark, metadata_uri, ledger20, pushdown):
    view = f"bk_pushdown_{pushdown}"
    spark.conf.set(PUSHDOWN, pushdown)
    try:
        df = load(spark, metadata_uri, [ledger20])
        assert df.filter("entry_id > 15").count() == 4
        assert df.count() == ENTRIES

        df.createOrReplaceTempView(view)
        assert scalar(spark, f"select count(*) from {view}") == ENTRIES
        assert scalar(spark, f"select count(*) from {view} where entry_id < 5") == 5
        assert df.count() == ENTRIES
        assert scalar(spark, f"select count(*) from {view} a join {view} b "
                             "on a.ledger_id = b.ledger_id "
                             "where a.entry_id < 5 and b.entry_id > 15") == 5 * 4

        low, high = df.filter("entry_id < 5"), df.filter("entry_id > 15")
        assert entry_ids(low.union(high)) == [0, 1, 2, 3, 4, 16, 17, 18, 19]
        assert low.join(high, "ledger_id").count() == 5 * 4
        assert df.count() == ENTRIES

        df.cache()
        try:
            assert df.filter("entry_id > 15").count() == 4
            assert df.count() == ENTRIES
            assert entry_ids(df.filter("entry_id < 5")) == [0, 1, 2, 3, 4]
            assert df.count() == ENTRIES
        finally:
            df.unpersist()
        assert df.filter("entry_id >= 10 AND entry_id <= 11").count() == 2
        assert df.count() == ENTRIES
    finally:
        spark.catalog.dropTempView(view)
        spark.conf.unset(PUSHDOWN)


@pytest.mark.parametrize("pushdown", ["true", "false"])
def test_filters_on_positions_are_applied_by_spark_over_a_full_plan(
        spark, metadata_uri, ledger20, ledger30, pushdown):
    """Nothing is pruned: a filter on ledger_id / entry_id reads the same
    partitions as no filter, and Spark applies it to every row."""
    query = f"ledger_id = {ledger30} AND entry_id BETWEEN 7 AND 24"
    want = [(ledger30, i, p) for i, p in enumerate(payloads_for(b"other", 30)) if 7 <= i <= 24]
    spark.conf.set(PUSHDOWN, pushdown)
    try:
        df = load(spark, metadata_uri, [ledger20, ledger30], maxEntriesPerPartition="10")
        filtered = df.where(query)
        assert filtered.rdd.getNumPartitions() == 2 + 3          # 20 and 30 entries, 10 a slice
        assert rows_of(filtered) == want
        assert df.where("payload IS NOT NULL").count() == ENTRIES + 30
        assert df.where(f"ledger_id IN ({ledger20}) AND entry_id >= 18").count() == 2
        assert df.count() == ENTRIES + 30
    finally:
        spark.conf.unset(PUSHDOWN)


def test_readers_leave_every_filter_to_spark(metadata_uri, ledger20, ledger30, caplog):
    """DataSourceReader's own pushFilters (every filter returned, nothing kept),
    so Spark accepts the reader with pushdown off and re-applies every filter
    with it on; the log says so once per process."""
    from pyspark.sql.datasource import DataSourceReader, EqualTo, GreaterThan
    source = BookKeeperDataSource({"metadataServiceUri": metadata_uri,
                                   "ledgers": f"{ledger20},{ledger30}"})
    note_filters_not_pushed.cache_clear()
    with caplog.at_level(logging.INFO, logger="pybk_spark.spark"):
        reader = source.reader(source.schema())
        source.reader(source.schema())
    notes = [r for r in caplog.records if "filters are not pushed down" in r.getMessage()]
    assert len(notes) == 1 and notes[0].levelno == logging.INFO
    assert type(reader).pushFilters is DataSourceReader.pushFilters
    before = [(p.ledger_id, p.first, p.last) for p in reader.partitions()]
    filters = [EqualTo(("ledger_id",), ledger30), GreaterThan(("entry_id",), 15)]
    assert list(reader.pushFilters(filters)) == filters
    assert [(p.ledger_id, p.first, p.last) for p in reader.partitions()] == before \
        == [(ledger20, 0, ENTRIES - 1), (ledger30, 0, 29)]
