"""The Spark Python Data Source ``bookkeeper``.

``spark.read.format("bookkeeper")`` works without ``spark.dataSource.register``:
the top-level module ``pyspark_bookkeeper`` exposes this class as
``DefaultSource`` and Spark 4 discovers it on ``sys.path``.

Theory of operation
-------------------
This class only validates options and hands out readers; it holds no client,
no channel and no lock, because Spark pickles it into other Python processes.
Options are parsed in ``pybk_spark.spark.options`` (errors name the option),
planning and reading live in ``pybk_spark.spark.reader``.  See docs/spark.md.
"""
from __future__ import annotations

import sys

from pyspark.sql.datasource import DataSource, DataSourceReader
from pyspark.sql.types import StructType

from pybk_spark.spark.options import parse_read_options
from pybk_spark.spark.reader import (RAW_SCHEMA, BookKeeperBatchReader, BookKeeperPushdownReader,
                                     check_schema)


class BookKeeperDataSource(DataSource):
    """Reads BookKeeper ledgers as ``ledger_id long, entry_id long, payload binary``."""

    @classmethod
    def name(cls) -> str:
        return "bookkeeper"

    def schema(self) -> StructType:
        parse_read_options(self.options)       # fail at load(), not at the first action
        return RAW_SCHEMA

    def reader(self, schema: StructType) -> DataSourceReader:
        opts = parse_read_options(self.options)
        check_schema(schema)
        if _planning_with_filter_pushdown():
            return BookKeeperPushdownReader(opts)
        return BookKeeperBatchReader(opts)


def _planning_with_filter_pushdown() -> bool:
    """True when Spark asks for the reader from its filter-pushdown worker,
    which it runs only if ``spark.sql.python.filterPushdown.enabled`` is true.
    Spark rejects a reader implementing ``pushFilters`` when pushdown is off,
    and gives the source no other way to see that setting."""
    frame = sys._getframe(1)
    while frame is not None:
        if frame.f_code.co_filename.endswith(_PUSHDOWN_WORKER):
            return True
        frame = frame.f_back
    return False


_PUSHDOWN_WORKER = "data_source_pushdown_filters.py"
