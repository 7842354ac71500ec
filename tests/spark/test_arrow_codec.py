"""Pure Arrow entry codec (no I/O, no Spark session)."""
import re

import pyarrow as pa
import pytest

from pybk_spark import errors
from pybk_spark.spark import arrow_codec as ac


def encode(batch, max_rows, max_bytes, time_us=None):
    """``batch`` as entries, each ``(payload bytes, rows in it)``, encoded by
    an ``EntryRun`` of its own as the Spark writer encodes them."""
    run = ac.EntryRun()
    rows = [n for _, n in run.add(batch, max_rows, max_bytes, time_us)]
    return list(zip(run.take().to_pylist(), rows))


def table_batch(n):
    return pa.record_batch([pa.array(range(n), pa.int64()),
                            pa.array([b"x" * (i % 50) for i in range(n)], pa.binary())],
                           names=["id", "blob"])


def test_entries_bounded_by_rows_and_bytes_and_decode_back():
    batch = table_batch(1000)
    entries = encode(batch, max_rows=64, max_bytes=2048)
    assert all(rows <= 64 and (len(p) <= 2048 or rows == 1) for p, rows in entries)
    assert sum(rows for _, rows in entries) == 1000
    raw = pa.record_batch([pa.array([7] * len(entries), pa.int64()),
                           pa.array(range(len(entries)), pa.int64()),
                           pa.array([p for p, _ in entries], pa.binary())],
                          names=["ledger_id", "entry_id", "payload"])
    schema = ac.canonical_schema(batch.schema)
    out = ac.decode_batch(raw, schema, include_metadata=True)
    assert out.column("id").to_pylist() == list(range(1000))
    assert out.column("blob").equals(batch.column("blob"))
    counts = [rows for _, rows in entries]
    assert out.column("_entry_id").to_pylist() == [e for e, c in enumerate(counts) for _ in range(c)]
    assert set(out.column("_ledger_id").to_pylist()) == {7}


def test_an_entry_run_holds_the_entries_of_its_batches_back_to_back():
    """``EntryRun`` lays the entries of several batches in one column, each
    the same bytes a run of that batch alone makes; ``take`` starts it anew."""
    run = ac.EntryRun()
    first, second = table_batch(300), table_batch(50)
    added = run.add(first, 64, 2048, time_us=5) + run.add(second, 64, 2048, time_us=6)
    assert len(run) == len(added) and run.nbytes == sum(size for size, _ in added)
    column = run.take()
    want = encode(first, 64, 2048, time_us=5) + encode(second, 64, 2048, time_us=6)
    assert column.to_pylist() == [p for p, _ in want]
    assert [(len(p), rows) for p, rows in want] == added
    assert len(run) == 0 and run.nbytes == 0 and len(run.take()) == 0


def test_a_batch_larger_than_a_request_is_fed_to_the_run_in_row_slices():
    """The writer feeds a batch to its ``EntryRun`` in ``row_slices`` and
    sends the run before a slice would take it past one request: the run
    (32-bit offsets) stays about one request long for a batch of any size,
    and every row is encoded once, in order."""
    batch = table_batch(3000)
    limit = batch.nbytes // 7
    pieces = list(ac.row_slices(batch, limit))
    assert len(pieces) >= 7 and all(p.nbytes <= 2 * limit for p in pieces)
    assert pa.Table.from_batches(pieces).equals(pa.Table.from_batches([batch]))
    small = table_batch(10)
    assert list(ac.row_slices(small, small.nbytes)) == [small]
    run, longest = ac.EntryRun(), 0
    columns = []
    for piece in pieces:
        if len(run) and run.nbytes + piece.nbytes > limit:
            columns.append(run.take())
        run.add(piece, 64, 2048)
        longest = max(longest, run.nbytes)
    columns.append(run.take())
    assert longest <= 3 * limit
    decoded = [b for col in columns for p in col.to_pylist()
               for b in ac.decode_entry(p, batch.schema)]
    assert pa.Table.from_batches(decoded).equals(pa.Table.from_batches([batch]))


def test_one_oversized_row_is_its_own_entry():
    batch = pa.record_batch([pa.array([b"y" * 5000, b"z"], pa.binary())], names=["b"])
    assert [rows for _, rows in encode(batch, 10, 1000)] == [1, 1]


def test_canonical_schema_is_nullable_everywhere_and_round_trips():
    s = pa.schema([pa.field("a", pa.int64(), nullable=False),
                   pa.field("n", pa.struct([pa.field("x", pa.int32(), nullable=False)]),
                            nullable=False)])
    c = ac.canonical_schema(s)
    assert all(f.nullable for f in c) and c.field("n").type.field("x").nullable
    assert ac.decode_schema(ac.encode_schema(c)).equals(c)


def test_bad_entry_and_metadata_clash_are_typed_errors():
    with pytest.raises(errors.ReadError):
        list(ac.decode_entry(b"not arrow", pa.schema([("a", pa.int64())])))
    with pytest.raises(errors.IncorrectParameter):
        ac.with_metadata_columns(pa.schema([("_entry_id", pa.int64())]))


# -- schema evolution (mergeSchema) ------------------------------------------------------------
def test_merge_schemas_adds_columns_at_the_end_and_names_other_changes():
    import pyarrow as pa
    from pybk_spark import errors
    from pybk_spark.spark.arrow_codec import conform, merge_schemas
    base = pa.schema([pa.field("u", pa.string()), pa.field("n", pa.int32())])
    wider = pa.schema(list(base) + [pa.field("x", pa.float64())])
    assert merge_schemas(base, wider).equals(wider) and merge_schemas(base, base).equals(base)
    for other, words in [
            (pa.schema([pa.field("u", pa.string()), pa.field("n", pa.int64())]),
             "types changed: ['n int32 -> int64']"),
            (pa.schema([pa.field("u", pa.string())]), "columns missing from the DataFrame: ['n']"),
            (pa.schema([pa.field("x", pa.int8())] + list(base)), "must come after")]:
        with pytest.raises(errors.SchemaMismatch, match=re.escape(words)):
            merge_schemas(base, other)
    old = pa.record_batch([pa.array(["a"]), pa.array([1], pa.int32())], schema=base)
    assert conform(old, wider).to_pydict() == {"u": ["a"], "n": [1], "x": [None]}
    new = conform(old, wider)
    assert conform(new, base).to_pydict() == {"u": ["a"], "n": [1]}      # reader fixed earlier


def test_entries_record_their_append_time_read_back_as_timestamp_column():
    batch = pa.RecordBatch.from_pydict({"id": list(range(5))})
    stamped = [p for p, _ in encode(batch, 2, 1 << 20, time_us=1_700_000_000_000_001)]
    old = [p for p, _ in encode(batch.slice(0, 1), 2, 1 << 20)]   # no time
    assert ac.entry_time(stamped[0]) == 1_700_000_000_000_001 and ac.entry_time(old[0]) is None
    raw = pa.RecordBatch.from_pydict({"ledger_id": [9] * 4, "entry_id": [0, 1, 2, 3],
                                      "payload": pa.array(stamped + old, pa.binary())})
    out = ac.decode_batch(raw, pa.schema([pa.field("id", pa.int64())]), include_metadata=True)
    assert out.schema.names == ["id", "_ledger_id", "_entry_id", "_timestamp"]
    assert out.column("_timestamp").cast(pa.int64()).to_pylist() == \
        [1_700_000_000_000_001] * 5 + [None]
    assert out.column("_entry_id").to_pylist() == [0, 0, 1, 1, 2, 3]
