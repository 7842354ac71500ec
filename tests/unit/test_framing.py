"""Pre-framed wire messages (pybk_spark/wire/framing.py) are the very messages
protobuf itself would build: checked by parsing them with the generated
classes, for both framed messages and a range of payload sizes (varint
lengths of 1..4 bytes), with bytes and Arrow buffers as payloads."""
from __future__ import annotations

import os

import pyarrow as pa
import pytest
from hypothesis import given, settings, strategies as st

from pybk_spark.wire import bookie_wire_pb2 as pb
from pybk_spark.wire import framing
from pybk_spark.protocol.distribution import holds
from pybk_spark.wire.entries import (EXACT_SIZE_FROM, batch_from_bytes, batch_to_buffer, joined,
                                     make_batch, one_batch)
from pybk_spark.wire.entry_parts import (GATHER_FROM, GATHER_MAX_RUNS, add_payload, batch_parts,
                                         rows_parts)


@pytest.mark.parametrize("size", [0, 1, 127, 128, 16383, 16384, 2_097_151, 2_097_152])
def test_add_request_parses_as_protobuf_builds_it(size):
    payload = os.urandom(size)
    head = pb.AddRequest(ledger_id=7, master_key=b"k" * 20, recovery=True, request_id=99)
    framed = framing.with_payload(head, payload)
    want = pb.AddRequest(ledger_id=7, master_key=b"k" * 20, recovery=True, request_id=99,
                         entries=payload)
    assert pb.AddRequest.FromString(framed) == want
    assert len(framed) == want.ByteSize()


@given(ledger=st.integers(0, 2**64 - 1), request_id=st.integers(0, 2**64 - 1),
       lac=st.integers(-2**63, 2**63 - 1), fenced=st.booleans(),
       payload=st.binary(max_size=3000))
@settings(max_examples=200, deadline=None)
def test_read_response_roundtrip(ledger, request_id, lac, fenced, payload):
    framed = framing.with_payload(pb.ReadResponse(code=pb.OK, end=pb.LIMIT, lac=lac,
                                                  fenced=fenced), payload)
    got = pb.ReadResponse.FromString(framed)
    assert (got.code, got.end, got.lac, got.fenced, got.entries) == (pb.OK, pb.LIMIT, lac,
                                                                     fenced, payload)
    framed = framing.with_payload(pb.AddRequest(ledger_id=ledger, request_id=request_id), payload)
    got = pb.AddRequest.FromString(framed)
    assert (got.ledger_id, got.request_id, got.entries) == (ledger, request_id, payload)


def test_arrow_buffer_payload_is_framed_without_conversion():
    batch = make_batch(3, range(10, 13), [9, 9, 9], [101, 103, 106], [b"a", b"bb", b"ccc"],
                       [b"", b"", b""])
    buf = batch_to_buffer(batch)
    assert isinstance(buf, pa.Buffer)
    framed = framing.with_payload(pb.ReadResponse(code=pb.OK), buf)
    back = batch_from_bytes(pb.ReadResponse.FromString(framed).entries)
    assert back.equals(batch)


@pytest.mark.parametrize("payload_bytes", [100, EXACT_SIZE_FROM + 1, 3 * EXACT_SIZE_FROM])
def test_batch_to_buffer_writes_the_same_stream_at_any_size(payload_bytes):
    """Below ``EXACT_SIZE_FROM`` the stream grows as it is written; from it
    up it is written into a buffer of its final size: the same bytes."""
    payloads = [os.urandom(payload_bytes // 4)] * 4
    batch = make_batch(5, range(4), [-1, 0, 1, 2], list(range(1, 5)), payloads, [b"d"] * 4)
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, batch.schema) as writer:
        writer.write_batch(batch)
    buf = batch_to_buffer(batch)
    assert buf.size == sink.getvalue().size
    assert batch_from_bytes(buf).equals(batch)


@pytest.mark.parametrize("ensemble,write_quorum", [(3, 2), (5, 2), (4, 3), (3, 3)])
@pytest.mark.parametrize("entries,size", [(4, 300_000), (7, 0), (3 * GATHER_MAX_RUNS + 6, 700),
                                          (40, 4_000)])
def test_a_bookies_part_as_buffers_is_the_stream_of_its_rows(ensemble, write_quorum, entries,
                                                             size):
    """``batch_parts`` of a striped bookie's rows is byte for byte the IPC
    stream of ``batch.filter(mask)``, for a batch sliced out of a larger one
    (offsets not at 0), with gathered payload views where it gathers, and
    ``add_payload`` (one buffer below ``GATHER_FROM``) agrees."""
    payloads = [os.urandom(size + i % 5) for i in range(entries + 2)]
    lengths = [sum(map(len, payloads[:i + 1])) for i in range(len(payloads))]
    big = make_batch(9, range(100, 100 + len(payloads)), [99] * len(payloads), lengths, payloads,
                     [b"d%d" % i for i in range(len(payloads))])
    batch = big.slice(1, entries)
    ids = batch.column("entry_id").to_numpy()
    for slot in range(ensemble):
        mask = holds(ids, ensemble, write_quorum, slot)
        want = batch_to_buffer(batch.filter(pa.array(mask))).to_pybytes()
        parts = batch_parts(batch, mask)
        assert b"".join(parts) == want
        assert bytes(joined(add_payload(batch, mask))) == want
        assert batch_from_bytes(joined(parts)).equals(batch.filter(pa.array(mask)))
    assert b"".join(batch_parts(batch)) == batch_to_buffer(batch).to_pybytes()
    if size * entries >= GATHER_FROM:
        assert isinstance(add_payload(batch, mask), list)


@pytest.mark.parametrize("chunks", [[(0, 1000, 1000, 3, 990), (990, 1000, 1000, 0, 1000),
                                     (1990, 500, 2000, 0, 400)],
                                    [(0, 2, 0, 0, 2), (2, 3, 50, 1, 2)],
                                    [(10 * i, 10, 10, 0, 10) for i in range(GATHER_MAX_RUNS + 1)],
                                    [(0, 700, 100, 0, 700)]])
def test_a_tables_rows_as_buffers_are_the_stream_of_them_joined(chunks):
    """``rows_parts`` of a table of stored batches (slices among them) is
    byte for byte the IPC stream of its rows joined, with the chunks'
    payloads among the buffers where it gathers (2 to GATHER_MAX_RUNS
    chunks with payload bytes)."""
    batches = []
    for first, n, size, at, keep in chunks:
        payloads = [os.urandom(size + i % 5) if size else b"" for i in range(n)]
        lengths = [sum(map(len, payloads[:i + 1])) for i in range(n)]
        batches.append(make_batch(9, range(first, first + n), [first] * n, lengths, payloads,
                                  [b"d%d" % i for i in range(n)]).slice(at, keep))
    table = pa.Table.from_batches(batches)
    parts = rows_parts(table)
    assert b"".join(parts) == batch_to_buffer(one_batch(table)).to_pybytes()
    datas = [b.column("payload").buffers()[2] for b in batches]
    from_chunks = [p for p in parts if isinstance(p, pa.Buffer) and p.size
                   and any(d.address <= p.address < d.address + d.size for d in datas)]
    if 2 <= len(batches) <= GATHER_MAX_RUNS and any(d.size for d in datas):
        assert from_chunks, "the payloads are gathered from the chunks"
    assert b"".join(rows_parts(batches[0])) == batch_to_buffer(batches[0]).to_pybytes()


def test_a_request_given_as_buffers_is_framed_as_the_same_message():
    batch = make_batch(3, range(10, 13), [9, 9, 9], [101, 103, 106], [b"a", b"bb", b"ccc"],
                       [b"", b"", b""])
    head = pb.AddRequest(ledger_id=3, master_key=b"k", request_id=5)
    parts = batch_parts(batch)
    assert b"".join(framing.payload_parts(head, parts)) == framing.with_payload(head, b"".join(parts))
    assert framing.with_payload(head, []) == framing.with_payload(head, b"")


def test_serialize_accepts_messages_and_bytes():
    msg = pb.HealthResponse(serving=True, bookie_id="b1")
    assert framing.serialize(msg) == msg.SerializeToString()
    assert framing.serialize(msg.SerializeToString()) == msg.SerializeToString()


@given(ledger=st.integers(0, 2**64 - 1), request_id=st.integers(0, 2**64 - 1),
       key=st.binary(max_size=40), recovery=st.booleans(), payload=st.binary(max_size=5000),
       framed=st.booleans())
@settings(max_examples=300, deadline=None)
def test_parse_add_request_agrees_with_protobuf(ledger, request_id, key, recovery, payload,
                                                framed):
    if framed:
        data = framing.with_payload(pb.AddRequest(ledger_id=ledger, master_key=key,
                                                  recovery=recovery, request_id=request_id),
                                    payload)
    else:
        data = pb.AddRequest(ledger_id=ledger, master_key=key, recovery=recovery,
                             request_id=request_id, entries=payload).SerializeToString()
    want = pb.AddRequest.FromString(data)
    got = framing.parse_add_request(data)
    assert (got.ledger_id, got.master_key, bytes(got.entries), got.recovery, got.request_id) == \
        (want.ledger_id, want.master_key, want.entries, want.recovery, want.request_id)


def test_parse_add_request_skips_unknown_fields_and_keeps_the_last_value():
    data = (pb.AddRequest(ledger_id=1).SerializeToString()
            + bytes([0x30 | 0, 5])                     # field 6, varint: unknown
            + bytes([0x3a, 2]) + b"xy"                 # field 7, bytes: unknown
            + pb.AddRequest(ledger_id=2, entries=b"e").SerializeToString())
    got = framing.parse_add_request(data)
    assert (got.ledger_id, bytes(got.entries)) == (2, b"e")
    assert pb.AddRequest.FromString(data).ledger_id == 2


@pytest.mark.parametrize("parse", [framing.parse_add_request, framing.parse_read_response])
@given(garbage=st.binary(max_size=200))
@settings(max_examples=400, deadline=None)
def test_parsers_reject_garbage_with_value_error_only(parse, garbage):
    try:
        parse(garbage)
    except ValueError:
        pass


@pytest.mark.parametrize("data", [b"\x08", b"\x1a\x05abc", b"\x0f", b"\x00\x01",
                                  b"\x08" + b"\xff" * 11, b"\x1a\x7f"])
def test_parse_add_request_malformed(data):
    with pytest.raises(ValueError):
        framing.parse_add_request(data)


@given(code=st.sampled_from([pb.OK, pb.NO_SUCH_ENTRY]), message=st.text(max_size=30),
       end=st.sampled_from([pb.COMPLETE, pb.LIMIT, pb.MISSING]),
       lac=st.integers(-2**63, 2**63 - 1), fenced=st.booleans(),
       payload=st.binary(max_size=5000), framed=st.booleans())
@settings(max_examples=300, deadline=None)
def test_parse_read_response_agrees_with_protobuf(code, message, end, lac, fenced, payload,
                                                  framed):
    head = pb.ReadResponse(code=code, message=message, end=end, lac=lac, fenced=fenced)
    if framed:
        data = framing.with_payload(head, payload)
    else:
        head.entries = payload
        data = head.SerializeToString()
    want = pb.ReadResponse.FromString(data)
    got = framing.parse_read_response(data)
    assert isinstance(got.entries, pa.Buffer)
    assert (got.code, got.message, got.end, got.lac, got.fenced, bytes(got.entries)) == \
        (want.code, want.message, want.end, want.lac, want.fenced, want.entries)


def test_split_payload_keeps_other_fields_and_views_the_payload_in_place():
    data = (pb.ReadResponse(lac=1).SerializeToString()
            + bytes([0x3a, 2]) + b"xy"                 # field 7, bytes: unknown, kept
            + framing.with_payload(pb.ReadResponse(lac=2), b"entries"))
    head, payload = framing.split_payload(data)
    assert bytes(payload) == b"entries" and payload.address != 0
    assert pb.ReadResponse.FromString(head).lac == 2
    assert b"xy" in head and b"entries" not in head


@given(code=st.sampled_from([pb.OK, pb.NO_SUCH_ENTRY]), message=st.text(max_size=30),
       end=st.sampled_from([pb.COMPLETE, pb.LIMIT, pb.MISSING]),
       lac=st.integers(-2**63, 2**63 - 1), fenced=st.booleans(),
       payload=st.binary(max_size=3000), lead=st.integers(0, 120))
@settings(max_examples=300, deadline=None)
def test_trailing_payload_finds_a_framed_answers_entries_or_says_none(code, message, end, lac,
                                                                       fenced, payload, lead):
    data = framing.with_payload(pb.ReadResponse(code=code, message=message, end=end, lac=lac,
                                                fenced=fenced), payload)
    at = framing.trailing_payload(data[:lead], len(data))
    if at is None:                       # then the whole message is received and split
        return
    key_at, value_at = at
    assert value_at <= lead and bytes(data[value_at:]) == payload
    got = framing.parse_head(pb.ReadResponse, data[:key_at], pa.py_buffer(payload))
    want = framing.parse_read_response(data)
    assert (got.code, got.message, got.end, got.lac, got.fenced, bytes(got.entries)) == \
        (want.code, want.message, want.end, want.lac, want.fenced, bytes(want.entries))


def test_trailing_payload_is_none_unless_the_payload_is_the_last_field():
    framed = framing.with_payload(pb.ReadResponse(lac=2), b"entries")
    assert framing.trailing_payload(framed, len(framed)) is not None
    after = framed + pb.ReadResponse(lac=3).SerializeToString()     # a field after the payload
    assert framing.trailing_payload(after, len(after)) is None
    assert framing.trailing_payload(framed[:2], len(framed)) is None   # the key cut off
    with pytest.raises(ValueError):
        framing.parse_head(pb.ReadResponse, b"\x08", pa.py_buffer(b""))
