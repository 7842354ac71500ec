"""Fuzzing a real bookie-server with random and mutated requests, on both
transports: add lane / read lane frames (wire/lane_frames.py) and gRPC
messages (bookie_wire.proto, AddRequest framed by hand: wire/framing.py).

Every example starts from a VALID encoding and damages it (flipped bytes,
truncation, extension, random bytes, a wrong frame length, a huge length,
damaged Arrow IPC inside an intact protobuf, a wrong ledger id in the
batch), or sends well-formed messages with hostile field values.  The
bookie must answer each with a typed code or close the connection, never
hang.  After each example a valid add + read round trip over the same
transport must succeed, and at the end the bookie is stopped and restarted
on the same data directory: every valid acknowledged entry reads back and
the log holds no traceback.

Fuzz traffic uses ledger ids below ``VALID_LEDGER_BASE`` and never the
valid ledgers' master key, so it cannot overwrite what is checked.
Hypothesis is derandomized (a fixed seed per test): CI sees the same
examples every run.  docs/testing.md, "Fuzzing the wire".
"""
from __future__ import annotations

import os
import socket
import struct

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pybk_spark.testing.bookie_process import BookieProcess, entries_bytes, free_port, read_all
from pybk_spark.wire import framing
from pybk_spark.wire import lane_frames
from pybk_spark.wire import bookie_wire_pb2 as pb
from pybk_spark.wire.entries import batch_from_bytes
from pybk_spark.wire.frame_socket import read_frame, read_frame_into

pytestmark = pytest.mark.slow

VALID_KEY = os.urandom(32)          # fuzz requests never carry it
VALID_LEDGER_BASE = 1 << 40         # fuzz ledgers are below, valid ones at and above
LIMIT = 64 << 20                    # what a test reads back; above any answer here
CODES = set(pb.StatusCode.values())
CONF = {"max_entry_bytes": 64 << 10, "max_batch_bytes": 1 << 20,
        "long_poll_max_timeout_ms": 200, "max_inflight_per_stream": 8}
FUZZ = settings(max_examples=int(os.environ.get("PYBK_FUZZ_EXAMPLES", "120")), deadline=None,
                derandomize=True, suppress_health_check=list(HealthCheck), database=None)
IO_TIMEOUT_S = 60.0                 # an answer later than this is a hang


# -- strategies ---------------------------------------------------------------------------
fuzz_ledgers = st.one_of(st.integers(0, 50), st.integers(0, VALID_LEDGER_BASE - 1))
entry_ids = st.lists(st.integers(0, 40), min_size=1, max_size=4, unique=True).map(sorted)


@st.composite
def entries_ipc(draw) -> tuple[int, bytes]:
    """(the ledger the batch claims, valid Arrow IPC entries)."""
    ledger = draw(fuzz_ledgers)
    ids = draw(entry_ids)
    payloads = [draw(st.binary(max_size=64)) for _ in ids]
    return ledger, entries_bytes(ledger, ids, lac=draw(st.integers(-1, 40)), payloads=payloads)


def mutate(draw, data: bytes) -> bytes:
    """``data`` damaged one of several ways (or left whole)."""
    kind = draw(st.sampled_from(["flip", "truncate", "extend", "splice", "random", "keep"]))
    if kind == "flip" and data:
        out = bytearray(data)
        for _ in range(draw(st.integers(1, 8))):
            pos = draw(st.integers(0, len(out) - 1))
            out[pos] = draw(st.integers(0, 255))
        return bytes(out)
    if kind == "truncate":
        return data[:draw(st.integers(0, max(0, len(data) - 1)))]
    if kind == "extend":
        return data + draw(st.binary(min_size=1, max_size=64))
    if kind == "splice" and data:
        pos = draw(st.integers(0, len(data)))
        return data[:pos] + draw(st.binary(max_size=16)) + data[pos + draw(st.integers(0, 16)):]
    if kind == "random":
        return draw(st.binary(max_size=256))
    return data


@st.composite
def add_request_bytes(draw) -> bytes:
    """A serialized AddRequest, damaged at the protobuf level, inside its
    Arrow IPC, in its ledger id, or not at all."""
    claimed, ipc = draw(entries_ipc())
    ledger = draw(st.one_of(st.just(claimed), fuzz_ledgers))       # wrong ledger id
    where = draw(st.sampled_from(["proto", "arrow", "none"]))
    if where == "arrow":
        ipc = mutate(draw, ipc)
    head = pb.AddRequest(ledger_id=ledger, master_key=draw(st.binary(max_size=8)),
                         recovery=draw(st.booleans()),
                         request_id=draw(st.integers(0, (1 << 64) - 1)))
    data = framing.with_payload(head, ipc)
    return mutate(draw, data) if where == "proto" else data


@st.composite
def read_request_bytes(draw) -> bytes:
    i64 = st.integers(-(1 << 63), (1 << 63) - 1)
    req = pb.ReadRequest(
        ledger_id=draw(fuzz_ledgers), first_entry_id=draw(st.one_of(st.integers(-2, 45), i64)),
        last_entry_id=draw(st.one_of(st.integers(-2, 45), i64)),
        max_entries=draw(st.integers(0, (1 << 32) - 1)), max_bytes=draw(st.integers(0, 1 << 40)),
        fence=draw(st.booleans()), master_key=draw(st.binary(max_size=8)),
        sparse=draw(st.booleans()), stripe_ensemble=draw(st.integers(0, 5)),
        stripe_slot=draw(st.integers(0, 6)), request_id=draw(st.integers(1, 1 << 40)))
    return mutate(draw, req.SerializeToString())


@st.composite
def lane_stream(draw, request_bytes) -> bytes:
    """The bytes a client sends on a lane connection: magic, hello, frames;
    any part may be damaged (a wrong frame length: short, zero, huge)."""
    magic = lane_frames.READ_MAGIC if request_bytes is read_request_bytes else lane_frames.MAGIC
    parts = [draw(st.one_of(st.just(magic), st.binary(min_size=0, max_size=8)))]
    parts.append(None)                           # the hello: filled in by the test
    for _ in range(draw(st.integers(1, 4))):
        body = draw(request_bytes())
        header = draw(st.sampled_from(["right", "short", "long", "huge", "zero"]))
        size = {"right": len(body), "short": max(0, len(body) - 3), "long": len(body) + 7,
                "huge": draw(st.integers(LIMIT, (1 << 32) - 1)), "zero": 0}[header]
        parts.append(struct.pack("<I", size) + body)
    return parts


# -- the bookie ---------------------------------------------------------------------------
@pytest.fixture(scope="module")
def fuzz_bookie(tmp_path_factory):
    bp = BookieProcess(str(tmp_path_factory.mktemp("fuzz") / "bookie"),
                       conf={**CONF, "add_lane_port": free_port()})
    bp.start()
    try:
        yield bp
    finally:
        bp.kill()


class Valid:
    """The valid traffic between fuzz examples: each round trip adds the next
    entry of a ledger of its own and reads it back; ``acked`` is what the
    restarted bookie must still hold."""

    def __init__(self, bp: BookieProcess, ledger: int):
        self.bp, self.ledger, self.next = bp, ledger, 0
        self.acked: dict[int, bytes] = {}

    def request(self) -> tuple[int, bytes, bytes]:
        e = self.next
        payload = f"valid {self.ledger}:{e}".encode() * 3
        ipc = entries_bytes(self.ledger, [e], lac=e - 1, payloads=[payload])
        head = pb.AddRequest(ledger_id=self.ledger, master_key=VALID_KEY, request_id=e + 1)
        return e, payload, framing.with_payload(head, ipc)

    def ack(self, e: int, payload: bytes) -> None:
        self.acked[e] = payload
        self.next = e + 1

    def check_restart(self) -> None:
        """Stop the bookie, start it on the same data dir, read everything
        acknowledged back; no traceback logged before or after."""
        assert self.bp.terminate() == 0, self.bp.log_tail()
        self.bp.start()
        got = read_all(self.bp.stub(), self.ledger, 0, self.next - 1)
        assert got == self.acked
        log = open(self.bp.log_path, errors="replace").read()
        assert "Traceback" not in log and "unexpected_error" not in log, log[-6000:]


# -- lane ---------------------------------------------------------------------------------
def _lane(bp: BookieProcess, magic=lane_frames.MAGIC) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", int(bp.conf["add_lane_port"])),
                                    timeout=IO_TIMEOUT_S)
    if magic is not None:
        sock.sendall(lane_frames.hello(bp.bookie_id, magic))
    return sock


def _send_and_drain(bp: BookieProcess, parts: list, answer_cls) -> list:
    """Send a fuzzed connection's bytes, end the sending side, read every
    answer until the bookie closes.  A timeout fails the test (a hang)."""
    hello = lane_frames.frame(bp.bookie_id.encode())
    with _lane(bp, magic=None) as sock:
        try:
            sock.sendall(b"".join(hello if p is None else p for p in parts))
            sock.shutdown(socket.SHUT_WR)
        except (BrokenPipeError, ConnectionResetError):
            pass                              # the bookie already closed: fine
        answers = []
        with sock.makefile("rb") as stream:
            while True:
                try:
                    body = read_frame(stream, LIMIT)
                except (ConnectionResetError, ValueError):
                    break                     # closed mid-answer after a reset
                if body is None:
                    break
                if answer_cls is pb.AddResponse:      # an entry answer or an AddResponse
                    answers.append(lane_frames.parse_add_answer(body))
                else:
                    answers.append(answer_cls.FromString(framing.split_payload(body)[0]))
    return answers


def _lane_round_trip(valid: Valid) -> None:
    e, payload, req = valid.request()
    with _lane(valid.bp) as sock, sock.makefile("rb") as stream:
        sock.sendall(lane_frames.frame(req))
        ans = lane_frames.parse_add_answer(read_frame(stream, LIMIT))
    assert (ans.code, ans.first_entry_id, ans.last_entry_id) == (pb.OK, e, e), ans
    valid.ack(e, payload)
    with _lane(valid.bp, lane_frames.READ_MAGIC) as sock, sock.makefile("rb") as stream:
        sock.sendall(lane_frames.frame(pb.ReadRequest(ledger_id=valid.ledger, first_entry_id=e,
                                                   last_entry_id=e, request_id=7)
                                    .SerializeToString()))
        got = framing.parse_read_response(read_frame_into(stream, LIMIT))
    assert got.code == pb.OK and got.request_id == 7, got.head
    assert batch_from_bytes(got.entries).column("payload").to_pylist() == [payload]


@pytest.mark.parametrize("kind", ["adds", "reads"])
def test_fuzzed_lane_connections_get_typed_answers(fuzz_bookie, kind):
    valid = Valid(fuzz_bookie, VALID_LEDGER_BASE + (1 if kind == "adds" else 2))
    requests = add_request_bytes if kind == "adds" else read_request_bytes
    answer_cls = pb.AddResponse if kind == "adds" else pb.ReadResponse

    @FUZZ
    @given(parts=lane_stream(requests))
    def one(parts):
        for ans in _send_and_drain(fuzz_bookie, parts, answer_cls):
            assert ans.code in CODES, ans
        _lane_round_trip(valid)

    one()
    valid.check_restart()


# -- gRPC ---------------------------------------------------------------------------------
@st.composite
def small_message(draw) -> tuple[str, bytes]:
    """(method, request bytes) for the unary methods other than the adds:
    valid messages with hostile values, then damaged."""
    ledger, key = draw(fuzz_ledgers), draw(st.binary(max_size=8))
    i64 = st.integers(-(1 << 63), (1 << 63) - 1)
    method, msg = draw(st.sampled_from([
        ("ReadLac", lambda: pb.ReadLacRequest(
            ledger_id=ledger, fence=draw(st.booleans()), master_key=key,
            wait_for_lac_above=draw(st.one_of(st.just(-2), i64)),
            timeout_ms=draw(st.integers(0, (1 << 32) - 1)))),
        ("Fence", lambda: pb.FenceRequest(ledger_id=ledger, master_key=key)),
        ("WriteLac", lambda: pb.WriteLacRequest(ledger_id=ledger, master_key=key,
                                                lac=draw(i64))),
        ("GetBookieInfo", pb.BookieInfoRequest),
        ("ListLedgers", pb.ListLedgersRequest),
    ]))
    return method, mutate(draw, msg().SerializeToString())


RESPONSES = {"AddEntries": pb.AddResponse, "ReadEntries": pb.ReadResponse,
             "ReadLac": pb.ReadLacResponse, "Fence": pb.FenceResponse,
             "WriteLac": pb.WriteLacResponse, "GetBookieInfo": pb.BookieInfoResponse,
             "ListLedgers": pb.ListLedgersResponse}


def _unary(channel, method: str, data: bytes):
    """The typed answer; a bare gRPC status (the bookie's deserializer
    raised, or the handler died) fails the test."""
    call = channel.unary_unary(f"/{framing.SERVICE.full_name}/{method}",
                               request_serializer=None,
                               response_deserializer=RESPONSES[method].FromString)
    return call(data, timeout=IO_TIMEOUT_S)


def _grpc_round_trip(valid: Valid) -> None:
    e, payload, req = valid.request()
    ans = _unary(valid.bp.channel(), "AddEntries", req)
    assert (ans.code, ans.first_entry_id) == (pb.OK, e), ans
    valid.ack(e, payload)
    got = read_all(valid.bp.stub(), valid.ledger, e, e)
    assert got == {e: payload}


def test_fuzzed_grpc_requests_get_typed_answers(fuzz_bookie):
    valid = Valid(fuzz_bookie, VALID_LEDGER_BASE + 3)
    stream = fuzz_bookie.channel().stream_stream(
        framing.ADD_STREAM_METHOD, request_serializer=None,
        response_deserializer=pb.AddResponse.FromString)

    @FUZZ
    @given(adds=st.lists(add_request_bytes(), min_size=1, max_size=3),
           reads=st.lists(read_request_bytes(), max_size=2),
           others=st.lists(small_message(), max_size=2), via_stream=st.booleans())
    def one(adds, reads, others, via_stream):
        channel = fuzz_bookie.channel()
        if via_stream:
            answers = list(stream(iter(adds), timeout=IO_TIMEOUT_S))
            assert len(answers) == len(adds) and all(a.code in CODES for a in answers)
        else:
            for data in adds:
                ans = _unary(channel, "AddEntries", data)
                assert ans.code in CODES, ans
        for data in reads:
            ans = _unary(channel, "ReadEntries", data)
            assert ans.code in CODES, ans
        for method, data in others:
            ans = _unary(channel, method, data)
            assert ans.code in CODES, ans
        _grpc_round_trip(valid)

    one()
    valid.check_restart()
