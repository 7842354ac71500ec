"""The wire contract: generated stubs are fresh, entry batches validate, and
every wire code maps to exactly one typed error and back."""
import pyarrow as pa
import pytest

from pybk_spark import errors
from pybk_spark.wire import bookie_wire_pb2 as pb
from pybk_spark.wire import build, codes, entries


def test_generated_stubs_are_not_stale():
    assert build.stale_outputs() == [], "run `make proto` and commit the stubs"


def test_proto_is_not_registered_under_an_etcd_clashing_name():
    assert pb.DESCRIPTOR.name == "pybk_spark/wire/bookie_wire.proto"


def test_entry_batch_round_trip():
    payloads = [b"a", b"", b"c" * 1000]
    lengths = entries.cumulative_lengths(10, payloads)
    assert lengths == [11, 11, 1011]
    batch = entries.make_batch(7, [0, 1, 2], [-1, 0, 1], lengths, payloads, [b"d"] * 3)
    back = entries.batch_from_bytes(entries.batch_to_bytes(batch))
    assert back.equals(batch)
    assert [e.entry_id for e in entries.to_entries(back)] == [0, 1, 2]
    assert entries.to_entries(back)[2].payload == b"c" * 1000
    assert [e.length for e in entries.to_entries(back)] == [11, 11, 1011]


@pytest.mark.parametrize("payload,digest", [(b"x" * 1024, b"\x01\x02\x03\x04"), (b"", b""),
                                            (bytes(range(256)), b"d" * 32)])
def test_a_one_entry_batch_is_the_same_batch_and_bytes_as_the_general_path(payload, digest):
    """make_batch builds a sync add's one row from its buffers: it must be
    the batch (and the IPC bytes) the six-array path gives."""
    one = entries.make_batch(7, range(5, 6), [4], [2**40], [payload], [digest])
    general = pa.RecordBatch.from_arrays(
        [pa.array([7], pa.int64()), pa.array([5], pa.int64()), pa.array([4], pa.int64()),
         pa.array([payload], pa.binary()), pa.array([digest], pa.binary()),
         pa.array([2**40], pa.int64())], schema=entries.ENTRY_SCHEMA)
    one.validate(full=True)
    assert one.equals(general)
    assert entries.batch_to_bytes(one) == entries.batch_to_bytes(general)
    assert entries.batch_from_bytes(entries.batch_to_bytes(one)).equals(general)
    assert entries.cumulative_lengths(100, [payload]) == [100 + len(payload)]


def test_a_batch_in_the_format_before_length_is_refused_by_name():
    old = pa.RecordBatch.from_pydict({"ledger_id": pa.array([1], pa.int64()),
                                      "entry_id": pa.array([0], pa.int64()),
                                      "lac": pa.array([-1], pa.int64()),
                                      "payload": pa.array([b"x"], pa.binary()),
                                      "digest": pa.array([b""], pa.binary())})
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, old.schema) as w:
        w.write_batch(old)
    with pytest.raises(errors.BadRequest, match="cumulative length"):
        entries.batch_from_bytes(sink.getvalue().to_pybytes())


def test_empty_bytes_give_an_empty_batch():
    assert entries.batch_from_bytes(b"").num_rows == 0


@pytest.mark.parametrize("garbage", [b"\x00", b"not arrow at all", b"\xff" * 100])
def test_malformed_bytes_are_a_bad_request(garbage):
    with pytest.raises(errors.BadRequest):
        entries.batch_from_bytes(garbage)


def test_wrong_column_types_are_a_bad_request():
    wrong = pa.RecordBatch.from_pydict({"ledger_id": pa.array([1], pa.int32()),
                                        "entry_id": [0], "lac": [0],
                                        "payload": [b"x"], "digest": [b""], "length": [1]})
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, wrong.schema) as w:
        w.write_batch(wrong)
    with pytest.raises(errors.BadRequest):
        entries.batch_from_bytes(sink.getvalue().to_pybytes())


def test_every_status_code_round_trips_through_its_error():
    for name, value in pb.StatusCode.items():
        if value == pb.OK:
            codes.raise_for_code(value)
            continue
        err = codes.error_for_code(value, "boom")
        assert isinstance(err, errors.BKError)
        assert codes.error_to_code(err)[0] == value, name


def test_unknown_exceptions_never_escape_as_ok():
    assert codes.error_to_code(ValueError("x"))[0] == pb.BAD_REQUEST
    assert codes.error_to_code(OSError(28, "No space left"))[0] == pb.IO_ERROR


def test_timeouts_and_fencing_are_unknown_outcomes():
    assert errors.Timeout().outcome_known is False
    assert errors.LedgerFenced().outcome_known is False
    assert errors.NoSuchEntry().outcome_known is True


def test_one_batch_into_joins_chunks_into_the_given_buffer_like_one_batch():
    payloads = [bytes([i % 251]) * (i % 37) for i in range(300)]   # empty ones too
    batch = entries.make_batch(7, list(range(300)), [-1] * 300,
                               entries.cumulative_lengths(0, payloads), payloads,
                               [b"dg%d" % i for i in range(300)])
    table = pa.Table.from_batches([batch.slice(0, 40), batch.slice(40, 0), batch.slice(40, 1),
                                   batch.take(pa.array(range(41, 300, 2))), batch.slice(299, 1)])
    taken = []

    def take(n):
        buf = pa.allocate_buffer(n)
        taken.append(buf)
        return memoryview(buf).cast("B"), buf

    joined = entries.one_batch_into(table, take)
    assert joined.equals(entries.one_batch(table))
    assert len(taken) == 1 and all(
        b is None or taken[0].address <= b.address < taken[0].address + taken[0].size
        for col in joined.columns for b in col.buffers())
    assert entries.batch_from_bytes(entries.batch_to_bytes(joined)).equals(joined)
    one = table.slice(0, 40)        # a single chunk needs no copy
    assert entries.one_batch_into(one, take).equals(entries.one_batch(one)) and len(taken) == 1
