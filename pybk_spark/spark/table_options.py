"""SQL catalog tables: the OPTIONS of ``CREATE TABLE t USING bookkeeper`` kept
where Spark hands them back when ``t`` is read.

Theory of operation
-------------------
PySpark 4.3 gives a Python data source no options when it reads a catalog
table: ``V2SessionCatalog.loadTable`` passes the table's properties (its
OPTIONS) to ``PythonDataSourceV2.getTable``, which drops them
(``new PythonTable(this, shortName, schema)``), and ``PythonTable.newScanBuilder``
creates the Python source from the query's own read options only (empty for
``SELECT * FROM t``).  What Spark does hand over is the table's *schema*, as
stored in the catalog, field metadata included (``reader(schema)``).

So when Spark creates the table it asks the source for the schema
(``inferSchema`` -> ``DataSource.schema()``, with the OPTIONS, each as ``k``
and ``option.k``); :func:`with_table_options` then records those options, as
JSON, in the metadata of the schema's first field (key
:data:`METADATA_KEY`).  When the table is read, :func:`merged_options`
takes them back from the schema and lays the query's own options over them
(``SELECT ... FROM t WITH ('k' = 'v')``, ``spark.read.options(...).table(t)``).

A table's reads take only the recorded options that apply to them
(:func:`merged_options` with ``valid``): a table created with a stream
read's options (``maxEntriesPerTrigger``) can still be read in batch.

Writes never take recorded options.  ``INSERT INTO t`` reaches the writer
with no options, and with a schema that is the table's only when Spark had to
cast or rename the inserted columns; otherwise it is the query's, and in
``INSERT INTO t2 SELECT * FROM t1`` that is t1's, record included.  The
writer cannot tell the two apart, and taking t1's options would append to
t1's log.  So an ``INSERT`` names its target:
``INSERT INTO t WITH ('metadataServiceUri' = '...', 'log' = '...') ...``.
No record reaches the log's own schema: it is recorded canonical, without
field metadata (arrow_codec.py).

``password`` and ``extraPasswords`` are never recorded: field metadata is visible to anyone who reads
the table's schema (``df.schema``), where Spark would not redact it.  A
table over password-protected ledgers takes it per query, in ``WITH``.

Pure: no I/O.
"""
from __future__ import annotations

import json
from typing import Iterable, Mapping, Optional

from pyspark.sql.types import StructField, StructType

from pybk_spark.spark import option_names as names

METADATA_KEY = "pybk.tableOptions"
NOT_RECORDED = ("password", "extraPasswords")


def is_table_creation(options: Mapping[str, str]) -> bool:
    """Spark passes a table's OPTIONS also as ``option.k`` (and only then)."""
    return any(str(k).lower().startswith(names.TABLE_PREFIX) for k in options)


def with_table_options(schema: StructType, options: Mapping[str, str]) -> StructType:
    """``schema`` (a StructType) with the table's options in its first field's
    metadata; unchanged when ``options`` are not a table's."""
    if not is_table_creation(options) or not schema.fields:
        return schema
    kept = {str(k): str(v) for k, v in names.fold_table_options(options).items()
            if str(k).lower() not in NOT_RECORDED}
    first = schema.fields[0]
    metadata = dict(first.metadata or {}, **{METADATA_KEY: json.dumps(kept, sort_keys=True)})
    return StructType([StructField(first.name, first.dataType, first.nullable, metadata)]
                      + list(schema.fields[1:]))


def recorded_options(schema: Optional[StructType]) -> Optional[dict[str, str]]:
    """The options a table recorded in ``schema`` (None: not a table's schema)."""
    if schema is None or not getattr(schema, "fields", None):
        return None
    text = (schema.fields[0].metadata or {}).get(METADATA_KEY)
    return json.loads(text) if text else None


def merged_options(options: Mapping[str, str], schema: Optional[StructType],
                   valid: Iterable[str] = ()) -> Mapping[str, str]:
    """The options to use: a table's recorded ones that apply (names in
    ``valid``; all if empty) under the query's own (``WITH (...)``), or
    ``options`` as given when ``schema`` records none."""
    recorded = recorded_options(schema)
    if recorded is None:
        return options
    if valid:
        allowed = {n.lower() for n in valid}
        recorded = {k: v for k, v in recorded.items() if names.applies(k, allowed)}
    given = {str(k).lower(): v for k, v in options.items()}
    out = {k: v for k, v in recorded.items() if k.lower() not in given}
    out.update(options)
    return out
