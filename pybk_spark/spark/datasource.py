"""The Spark Python Data Source ``bookkeeper``.

``spark.read.format("bookkeeper")`` works without ``spark.dataSource.register``:
the top-level module ``pyspark_bookkeeper`` exposes this class as
``DefaultSource`` and Spark 4 discovers it on ``sys.path``.

Theory of operation
-------------------
This class only validates options and hands out readers; it holds no client,
no channel and no lock, because Spark pickles it into other Python processes.
Options are parsed in ``pybk_spark.spark.options`` (errors name the option;
unknown names are refused, option_names.py) on the driver: at ``load()``
(``schema()``, which cannot tell ``read`` from ``readStream``), at
``save()`` (``writer()``), and at planning / ``start()`` (``reader()``,
``streamReader()``, ``streamWriter()``); the ledger password is checked
against the ledger metadata while planning, before any task runs.
planning and reading live in ``pybk_spark.spark.reader``.  See docs/spark.md.
"""
from __future__ import annotations

from typing import Any, Mapping, NoReturn, Optional

from pyspark.sql.datasource import (DataSource, DataSourceReader, DataSourceStreamReader,
                                    DataSourceStreamWriter, DataSourceWriter)
from pyspark.sql.types import StructType

from pybk_spark import errors
from pybk_spark.logs.log import read_log
from pybk_spark.spark import arrow_codec
from pybk_spark.spark import option_names as names
from pybk_spark.spark.client_cache import worker_store
from pybk_spark.spark.multi_log import (BookKeeperMultiLogReader, common_schema, is_multi,
                                        log_names, with_log_column)
from pybk_spark.spark.multi_stream import BookKeeperMultiLogStreamReader
from pybk_spark.spark.options import (ReadOptions, parse_load_options, parse_read_options,
                                      parse_stream_options)
from pybk_spark.spark.reader import (BookKeeperBatchReader, PlanningClient, check_schema,
                                     note_filters_not_pushed, output_arrow_schema,
                                     output_spark_schema)
from pybk_spark.spark.spark_errors import our_line_first
from pybk_spark.spark.stream_reader import BookKeeperStreamReader
from pybk_spark.spark.table_options import merged_options, with_table_options
from pybk_spark.spark.write_options import parse_write_options
from pybk_spark.spark.writer import (BookKeeperBatchWriter, BookKeeperStreamWriter,
                                     prepare_log_evolving)


def _table_schema(uri: str, log: Optional[str]) -> Optional[str]:
    """The DataFrame schema recorded in log metadata (None: raw ledgers/log)."""
    if log is None:
        return None
    store = worker_store(uri)
    try:
        return read_log(store, log)[0].schema
    finally:
        store.close()


def _multi_schema(opts: ReadOptions) -> tuple[Optional[str], StructType]:
    """(the logs' common recorded schema, the output schema with ``_log``)."""
    store = worker_store(opts.metadata_uri)
    try:
        table_schema = common_schema(store, log_names(store, opts))
    finally:
        store.close()
    arrow = with_log_column(output_arrow_schema(table_schema, opts.include_metadata))
    return table_schema, arrow_codec.canonical_to_spark(arrow)


class BookKeeperDataSource(DataSource):
    """Reads ledgers (``ledger_id long, entry_id long, payload binary``) and
    logs (raw, or the DataFrame columns recorded in the log); writes
    DataFrames to logs atomically; streams logs in and out."""

    @classmethod
    def name(cls) -> str:
        return "bookkeeper"

    # -- batch read ----------------------------------------------------------------------
    @our_line_first
    def schema(self) -> StructType:
        opts = parse_load_options(self.options)      # fail at load(), not at the first action
        if is_multi(opts):
            schema = _multi_schema(opts)[1]
        else:
            schema = output_spark_schema(_table_schema(opts.metadata_uri, opts.log),
                                         opts.include_metadata)
        return with_table_options(schema, self.options)   # CREATE TABLE: table_options.py

    def _options(self, schema: StructType, valid: tuple[str, ...]) -> Mapping[str, str]:
        """The options, with a SQL table's recorded ones that apply to the
        read (table_options.py); never for writes (a writer's schema may be
        another table's)."""
        return merged_options(self.options, schema, valid)

    @our_line_first
    def reader(self, schema: StructType) -> DataSourceReader:
        opts = parse_read_options(self._options(schema, names.BATCH_READ))
        note_filters_not_pushed()
        if is_multi(opts):
            table_schema, expected = _multi_schema(opts)
            check_schema(schema, expected)
            return BookKeeperMultiLogReader(opts, table_schema)
        table_schema = _table_schema(opts.metadata_uri, opts.log)
        check_schema(schema, output_spark_schema(table_schema, opts.include_metadata))
        return BookKeeperBatchReader(opts, table_schema)

    # -- batch write -----------------------------------------------------------------------
    @our_line_first
    def writer(self, schema: StructType, overwrite: bool) -> DataSourceWriter:
        opts = parse_write_options(self.options)     # schema: the DataFrame's, not a table's
        arrow_codec.refuse_unstorable(schema)
        with PlanningClient(opts.metadata_uri, opts.client_conf) as bk:      # metadata only
            # SchemaMismatch here: no data written
            schema_text, base = prepare_log_evolving(bk, opts, schema, overwrite)
        return BookKeeperBatchWriter(opts, schema_text, overwrite, base_schema=base)

    # -- streaming --------------------------------------------------------------------------
    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        # load() cannot tell a stream from a batch read (PySpark calls schema()
        # for both), so a batch-only option is refused here, at start().  PySpark
        # 4's stream runner answers an exception from streamReader() with its own
        # UnboundLocalError (its ``finally: reader.stop()``), so a refusal is a
        # reader that raises our error from its first call instead.
        try:
            return self._stream_reader(schema)
        except errors.BKError as exc:
            return RefusedStreamReader(exc)

    def _stream_reader(self, schema: StructType) -> DataSourceStreamReader:
        opts = parse_stream_options(self._options(schema, names.STREAM_READ))
        if is_multi(opts.read):
            table_schema, expected = _multi_schema(opts.read)
            check_schema(schema, expected)
            return BookKeeperMultiLogStreamReader(opts, table_schema)
        table_schema = _table_schema(opts.read.metadata_uri, opts.read.log)
        check_schema(schema, output_spark_schema(table_schema, opts.read.include_metadata))
        return BookKeeperStreamReader(opts, table_schema)

    @our_line_first
    def streamWriter(self, schema: StructType, overwrite: bool) -> DataSourceStreamWriter:
        if overwrite:
            raise errors.IncorrectParameter(
                "the bookkeeper sink supports outputMode('append') only")
        opts = parse_write_options(self.options, streaming=True)
        arrow_codec.refuse_unstorable(schema)
        with PlanningClient(opts.metadata_uri, opts.client_conf) as bk:      # metadata only
            schema_text, base = prepare_log_evolving(bk, opts, schema, False)
        return BookKeeperStreamWriter(opts, schema_text, base_schema=base)


class RefusedStreamReader(DataSourceStreamReader):
    """A stream the source refused: every call raises the refusal."""

    def __init__(self, refusal: errors.BKError) -> None:
        self.refusal = refusal

    @our_line_first
    def _refuse(self, *args: Any, **kwargs: Any) -> NoReturn:
        raise self.refusal

    initialOffset = latestOffset = partitions = read = commit = _refuse

    def stop(self) -> None:
        pass
