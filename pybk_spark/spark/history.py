"""A log as one DataFrame: its offloaded history through Spark's own
Parquet reader, its segments still on bookies through the ``bookkeeper``
source, with an exact boundary.

Both halves are planned from one read of the log's metadata: the history
is the files its offload records name (never a directory listing, so an
orphan file is never read), and the source reads the other segments only
(``endingOffsets`` 0 for each offloaded ledger).  No entry is read twice or
missed; a segment offloaded after that read is read by the source, from
its files (spark/offloaded.py).
"""
from __future__ import annotations

import json
import os
import posixpath
from typing import Any

from pyspark.sql import DataFrame, SparkSession

from pybk_spark.logs import log as logs
from pybk_spark.metadata import open_store
from pybk_spark.protocol.log_metadata import LogMetadata

_META = ("_ledger_id", "_entry_id", "_timestamp")


def file_uris(md: LogMetadata) -> list[str]:
    """The Spark paths of the files of the log's offloaded segments, in log order."""
    out = []
    for s in md.segments:
        if s.offload is None:
            continue
        location = s.offload.location
        base = location if "://" in location else os.path.abspath(location)
        out += [posixpath.join(base, s.offload.directory, f.path) for f in s.offload.files]
    return out


def read_log(spark: SparkSession, name: str, metadata_uri: str, *,
             include_metadata: bool = False, **options: Any) -> DataFrame:
    """The log ``name`` as one DataFrame (see the module docstring).  A raw
    log has the columns ``ledger_id, entry_id, payload, timestamp``; a
    DataFrame log its own, plus ``_ledger_id, _entry_id, _timestamp`` with
    ``include_metadata``.  ``options``: more options of the ``bookkeeper``
    source (``password``, ``bk.*``) for the segments on bookies."""
    store = open_store(metadata_uri)
    try:
        md, _ = logs.read_log(store, name)
    finally:
        store.close()
    reader = (spark.read.format("bookkeeper").option("metadataServiceUri", metadata_uri)
              .option("log", name))
    offloaded = {str(s.ledger_id): 0 for s in md.segments if s.offload is not None}
    if offloaded:
        reader = reader.option("endingOffsets", json.dumps(offloaded))
    if md.schema is not None:
        reader = reader.option("includeMetadata", "true")
    for key, value in options.items():
        reader = reader.option(key, value)
    tail = reader.load()
    paths = file_uris(md)
    frame = tail
    if paths:
        history = spark.read.option("mergeSchema", "true").parquet(*paths)
        frame = history.select(*tail.columns).unionByName(tail) \
            if set(tail.columns) <= set(history.columns) \
            else history.unionByName(tail, allowMissingColumns=True)
    if md.schema is not None and not include_metadata:
        frame = frame.drop(*_META)
    return frame
