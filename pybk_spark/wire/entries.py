"""Arrow encoding of entry batches: the payload format of Add/Read messages.

A batch is one Arrow record batch with ENTRY_SCHEMA, serialized as an Arrow
IPC stream.  Whole batches are built and parsed with vectorised Arrow calls;
nothing here loops over entries in Python except where a caller asks for
Python objects (``to_entries``).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np
import pyarrow as pa

from pybk_spark import errors

ENTRY_SCHEMA = pa.schema([
    pa.field("ledger_id", pa.int64(), nullable=False),
    pa.field("entry_id", pa.int64(), nullable=False),
    pa.field("lac", pa.int64(), nullable=False),
    pa.field("payload", pa.binary(), nullable=False),
    pa.field("digest", pa.binary(), nullable=False),
])


@dataclass(frozen=True)
class Entry:
    ledger_id: int
    entry_id: int
    payload: bytes
    lac: int = -1


def make_batch(ledger_id: int, entry_ids: Sequence[int], lacs: Sequence[int],
               payloads: Sequence[bytes], digests: Sequence[bytes]) -> pa.RecordBatch:
    n = len(entry_ids)
    return pa.RecordBatch.from_arrays([
        pa.array(np.full(n, ledger_id, dtype=np.int64)),
        pa.array(np.arange(entry_ids.start, entry_ids.stop, dtype=np.int64)
                 if isinstance(entry_ids, range) else np.asarray(entry_ids, dtype=np.int64)),
        pa.array(np.asarray(lacs, dtype=np.int64)),
        pa.array(payloads, pa.binary()),
        pa.array(digests, pa.binary()),
    ], schema=ENTRY_SCHEMA)


def batch_to_buffer(batch: pa.RecordBatch) -> pa.Buffer:
    """The batch as one Arrow IPC stream, without a copy into ``bytes``."""
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, ENTRY_SCHEMA) as writer:
        writer.write_batch(batch)
    return sink.getvalue()


def batch_to_bytes(batch: pa.RecordBatch) -> bytes:
    return batch_to_buffer(batch).to_pybytes()


def empty_batch() -> pa.RecordBatch:
    return pa.RecordBatch.from_arrays([pa.array([], f.type) for f in ENTRY_SCHEMA],
                                      schema=ENTRY_SCHEMA)


def batch_from_bytes(data) -> pa.RecordBatch:
    """Parse and validate one entry batch (bytes or a pyarrow Buffer, read in
    place).  Raises BadRequest on anything odd."""
    if not len(data):
        return empty_batch()
    try:
        reader = pa.ipc.open_stream(data if isinstance(data, pa.Buffer) else pa.py_buffer(data))
        batches = list(reader)
    except Exception as exc:  # pyarrow raises several types for garbage
        raise errors.BadRequest(f"malformed Arrow IPC entry batch: {exc}") from None
    schema = reader.schema
    if not schema.equals(ENTRY_SCHEMA, check_metadata=False):
        # accept nullable-vs-not differences only if types match exactly
        types_ok = (schema.names == ENTRY_SCHEMA.names and
                    all(a.type == b.type for a, b in zip(schema, ENTRY_SCHEMA)))
        if not types_ok:
            raise errors.BadRequest(f"entry batch schema {schema} != {ENTRY_SCHEMA}")
        batches = pa.Table.from_batches(batches, schema).cast(ENTRY_SCHEMA).to_batches()
    if len(batches) == 1:           # what every writer sends: no copy
        return batches[0] if batches[0].num_rows else empty_batch()
    table = pa.Table.from_batches(batches, ENTRY_SCHEMA)
    if table.num_rows == 0:
        return empty_batch()
    return table.combine_chunks().to_batches()[0]


def to_entries(batch: pa.RecordBatch) -> list[Entry]:
    cols = batch.to_pydict()
    return [Entry(l, e, p, c) for l, e, p, c in
            zip(cols["ledger_id"], cols["entry_id"], cols["payload"], cols["lac"])]
