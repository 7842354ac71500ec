"""The floor of a Python data source: a no-op ``DataSource`` measured in the
same run as the ``bookkeeper`` source (figure 6), for reads and
for writes.

``spark.read.format("pybk_noop").option("rows", N).load()`` yields the same
shape as the log figure 6 reads (``id long, payload binary``, 100 B payloads)
from memory, as Arrow record batches of ``batch_rows`` rows, over
``partitions`` input partitions; the batches are built once per Python
worker (the first query, a warm-up) and then only handed over.  Whatever a
Python source costs beyond that - Spark planning, the Python worker round
trips, the Arrow hand-over to the JVM - this source pays too, and nothing
else: ours divided by it is how close we are to the floor.

``df.write.format("pybk_noop").mode("append").save()`` is the write side:
an Arrow writer (``DataSourceArrowWriter``, as ours) that receives every
batch Spark hands over, counts its rows and drops it; what a Python sink
costs before it stores anything.
"""
from __future__ import annotations

import numpy as np
import pyarrow as pa
from pyspark.sql.datasource import (DataSource, DataSourceArrowWriter, DataSourceReader,
                                    InputPartition, WriterCommitMessage)

NAME = "pybk_noop"
PAYLOAD_BYTES = 100
_CACHE: dict = {}


def _batches(first: int, rows: int, batch_rows: int) -> list[pa.RecordBatch]:
    key = (first, rows, batch_rows)
    if key not in _CACHE:
        rng = np.random.default_rng(first)
        out = []
        for a in range(first, first + rows, batch_rows):
            n = min(batch_rows, first + rows - a)
            offsets = pa.py_buffer(np.arange(0, (n + 1) * PAYLOAD_BYTES, PAYLOAD_BYTES,
                                             dtype=np.int32))
            payload = pa.BinaryArray.from_buffers(pa.binary(), n, [None, offsets,
                                                  pa.py_buffer(rng.bytes(n * PAYLOAD_BYTES))])
            out.append(pa.RecordBatch.from_arrays(
                [pa.array(np.arange(a, a + n, dtype=np.int64)), payload], ["id", "payload"]))
        _CACHE[key] = out
    return _CACHE[key]


class _Slice(InputPartition):
    def __init__(self, first: int, rows: int):
        super().__init__(first)
        self.first, self.rows = first, rows


class NoopReader(DataSourceReader):
    def __init__(self, options):
        self.rows = int(options.get("rows", 1_000_000))
        self.parts = int(options.get("partitions", 2))
        self.batch_rows = int(options.get("batch_rows", 100_000))

    def partitions(self):
        per = -(-self.rows // self.parts)
        return [_Slice(a, min(per, self.rows - a)) for a in range(0, self.rows, per)]

    def read(self, partition):
        yield from _batches(partition.first, partition.rows, self.batch_rows)


class NoopCommit(WriterCommitMessage):
    def __init__(self, rows: int):
        self.rows = rows


class NoopWriter(DataSourceArrowWriter):
    def write(self, iterator):
        rows = 0
        for batch in iterator:
            rows += batch.num_rows
        return NoopCommit(rows)


class NoopSource(DataSource):
    @classmethod
    def name(cls) -> str:
        return NAME

    def schema(self) -> str:
        return "id long, payload binary"

    def reader(self, schema):
        return NoopReader(self.options)

    def writer(self, schema, overwrite):
        return NoopWriter()


def register(spark) -> None:
    """Register the source; its module is pickled by value, so the Python
    workers need not import ``bench``."""
    import sys

    from pyspark import cloudpickle
    cloudpickle.register_pickle_by_value(sys.modules[__name__])
    spark.dataSource.register(NoopSource)
