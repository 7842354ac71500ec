"""The add lane: AddRequest / AddResponse (and ReadRequest / ReadResponse)
over plain TCP connections.

Theory of operation
-------------------
A bookie serves adds two ways: the gRPC ``AddStream`` and this lane, a
second listening port it registers as ``add_lane_address``.  Both carry the
same protobuf messages and the same codes; the lane only drops gRPC's
per-message machinery.  gRPC Python hands every message between several
threads on each side (about 74 context switches per one-entry add on the
client, 22 on each bookie: docs/performance.md, (4)); here the caller's
thread writes the request and one reader thread per connection reads the
answers.

Connection
  The client opens it and sends :data:`MAGIC` (protocol name and version),
  then one frame holding the id of the bookie it means to reach (UTF-8):
  :func:`hello`.  A bookie that sees another magic closes the connection; a
  bookie with another id answers with a connection error (below) and closes
  it.  The id check matters because an address can outlive its bookie: with
  ``add_lane_port = 0`` a restarted bookie listens on a new port and another
  process may take the old one, and an add acknowledged by the wrong bookie
  would count towards a quorum it is not part of.
Frames
  Both directions are a sequence of frames: a 4-byte little-endian length n,
  then n bytes of one serialized message.  Client to bookie: ``AddRequest``
  (pre-framed, wire/framing.py), or an *entry frame*: one entry as the
  bytes its writer framed (:func:`entry_frame`): a zero kind byte
  (an ``AddRequest`` never starts with one: field number 0 does not
  exist), flags (1: a recovery add), the request id (u64), the master
  key's length (u16) and the key, then the entry record
  (wire/entries.py, ``ENTRY_RECORD``).  The bookie journals and caches that
  record as received; a lone add pays no protobuf or Arrow object on either
  side.  Bookie to client: ``AddResponse``, or, for an entry frame that
  succeeded, an *entry answer* (:func:`entry_answer`): a zero kind byte
  (which no ``AddResponse`` starts with, as above), the request id (u64),
  the ledger id and the entry id (i64 each); its code is OK and it
  acknowledges that one entry (:class:`EntryAnswer`).  A failed entry frame
  is answered with an ``AddResponse`` carrying the error code.
Ordering obligations
  * The bookie journals the requests of one connection in the order they
    arrive, which is the order the client sent them.  A writer therefore
    never has a later add of a ledger journaled before an earlier one it sent
    on the same connection, as on ``AddStream``.
  * Answers leave in completion order, each echoing its ``request_id``; the
    client matches them by id.
  * An answer with ``request_id`` 0 and a non-OK code is about the
    connection itself (a malformed request): the bookie closes the
    connection after it, and every unanswered add on it fails with that
    typed error.
  * A connection that ends with adds unanswered fails them with an
    unknown-outcome error; the client opens a new connection for the next
    add.
Read connections
  A connection that starts with :data:`READ_MAGIC` instead carries reads:
  ``ReadRequest`` frames one way, ``ReadResponse`` frames the other, each
  with the request's ``request_id`` (the same hello, the same connection
  error with request_id 0).  A read answer is up to a read window (MiBs):
  over gRPC, receiving it cost the reader about five times the CPU of a
  plain socket (docs/performance.md, (6)).  The bookie serves one read
  connection's requests one at a time, in order, and sends each answer's
  entries straight from the buffer they were encoded into
  (:func:`frame_parts`); the client receives each answer into one buffer
  the entries are then parsed from in place.  Reads on a connection are
  independent of each other: nothing orders them against adds.
Limits
  A frame longer than the receiver's limit (the bookie's gRPC message limit)
  is a protocol error: the receiver closes the connection.

Pure: no I/O.  The sockets live in wire/frame_socket.py (both sides),
transport/lane_client.py (client) and bookie_server/serving/lane_server.py (bookie).
"""
from __future__ import annotations

import struct
from typing import Any

from pybk_spark.wire import bookie_wire_pb2 as pb

MAGIC = b"PBKLANE1"
READ_MAGIC = b"PBKREAD1"
MAGICS = (MAGIC, READ_MAGIC)
_LENGTH = struct.Struct("<I")
HEADER_BYTES = _LENGTH.size
CONNECTION_REQUEST_ID = 0      # an answer about the connection, not one add


def frame(*parts: Any) -> bytes:
    """One frame holding the concatenation of ``parts`` (bytes-like)."""
    size = sum(len(p) for p in parts)
    return b"".join((_LENGTH.pack(size), *parts))


def frame_parts(*parts: Any) -> list[Any]:
    """One frame as a list of buffers (header first), for a gathering send
    that does not copy large parts."""
    return [_LENGTH.pack(sum(len(p) for p in parts)), *parts]


ENTRY_KIND = 0
RECOVERY_FLAG = 1
_ENTRY_FRAME = struct.Struct("<BBQH")
_FRAMED_ENTRY = struct.Struct("<I" + _ENTRY_FRAME.format[1:])    # the frame header first


def entry_frame(request_id: int, recovery: bool, master_key: bytes,
                record_head: bytes, payload: Any) -> bytes:
    """An entry frame, header included, as one buffer (framed once per
    lone add, sent to each bookie of its write set)."""
    size = _ENTRY_FRAME.size + len(master_key) + len(record_head) + len(payload)
    return b"".join((_FRAMED_ENTRY.pack(size, ENTRY_KIND, RECOVERY_FLAG if recovery else 0,
                                        request_id, len(master_key)),
                     master_key, record_head, payload))


def is_entry_frame(body: bytes | memoryview) -> bool:
    return bool(body) and body[0] == ENTRY_KIND


def parse_entry_frame(body: bytes | memoryview) -> tuple[int, bool, bytes, memoryview]:
    """(request id, recovery, master key, the entry record as a view of
    ``body``); ``ValueError`` when the frame is shorter than its header says."""
    if len(body) < _ENTRY_FRAME.size:
        raise ValueError(f"entry frame of {len(body)} bytes is shorter than its header")
    _kind, flags, request_id, key_len = _ENTRY_FRAME.unpack_from(body)
    start = _ENTRY_FRAME.size + key_len
    if start > len(body):
        raise ValueError("entry frame shorter than its master key")
    view = body if type(body) is memoryview else memoryview(body)
    return request_id, bool(flags & RECOVERY_FLAG), bytes(view[_ENTRY_FRAME.size:start]), view[start:]


_ENTRY_ANSWER_BODY = struct.Struct("<BQqq")
_ENTRY_ANSWER = struct.Struct("<I" + _ENTRY_ANSWER_BODY.format[1:])   # framed: header first
ENTRY_ANSWER_BYTES = _ENTRY_ANSWER_BODY.size


def entry_answer(request_id: int, ledger_id: int, entry_id: int) -> bytes:
    """The framed OK answer to an entry frame: ``entry_id`` of ``ledger_id``
    is durable on the bookie."""
    return _ENTRY_ANSWER.pack(ENTRY_ANSWER_BYTES, ENTRY_KIND, request_id, ledger_id, entry_id)


class EntryAnswer:
    """An entry answer, with the fields of the ``AddResponse`` it stands
    for (``code`` OK, no message, the one entry as the acknowledged range)."""
    __slots__ = ("request_id", "ledger_id", "first_entry_id", "last_entry_id")
    code = pb.OK
    message = ""

    def __init__(self, request_id: int, ledger_id: int, entry_id: int) -> None:
        self.request_id = request_id
        self.ledger_id = ledger_id
        self.first_entry_id = self.last_entry_id = entry_id


def parse_entry_answer(body: bytes) -> EntryAnswer:
    """An entry answer's body (``is_entry_frame`` is true of it);
    ``ValueError`` when it is not one's size."""
    if len(body) != ENTRY_ANSWER_BYTES:
        raise ValueError(f"entry answer of {len(body)} bytes, not {ENTRY_ANSWER_BYTES}")
    _kind, request_id, ledger_id, entry_id = _ENTRY_ANSWER_BODY.unpack(body)
    return EntryAnswer(request_id, ledger_id, entry_id)


def entry_answer_ids(body: bytes) -> tuple[int, int]:
    """(request id, entry id) of an entry answer's body, with no object
    made (a client's reader thread, once per bookie per lone add);
    ``ValueError`` when it is not one's size."""
    if len(body) != ENTRY_ANSWER_BYTES:
        raise ValueError(f"entry answer of {len(body)} bytes, not {ENTRY_ANSWER_BYTES}")
    _kind, request_id, _ledger_id, entry_id = _ENTRY_ANSWER_BODY.unpack(body)
    return request_id, entry_id


def parse_add_answer(body: bytes) -> Any:
    """An add connection's answer: an :class:`EntryAnswer` or an
    ``AddResponse`` (both with the fields a client reads); ``ValueError`` or
    protobuf's ``DecodeError`` when it is neither."""
    if body and body[0] == ENTRY_KIND:          # ``is_entry_frame``, inline (hot path)
        return parse_entry_answer(body)
    return pb.AddResponse.FromString(body)


def hello(bookie_id: str, magic: bytes = MAGIC) -> bytes:
    """What a client sends first on a new connection (``READ_MAGIC`` for a
    read connection)."""
    if magic not in MAGICS:
        raise ValueError(f"unknown lane magic {magic!r}")
    return magic + frame(bookie_id.encode())


def frame_length(header: bytes, limit: int) -> int:
    """The body length a frame header announces; ``ValueError`` when it is
    over ``limit`` or the header is short."""
    if len(header) != HEADER_BYTES:
        raise ValueError(f"truncated frame header ({len(header)} bytes)")
    (size,) = _LENGTH.unpack(header)
    if size > limit:
        raise ValueError(f"frame of {size} bytes is over the limit of {limit}")
    return int(size)


def frame_size(data: Any, pos: int, limit: int) -> int:
    """The body length of the frame whose header starts at ``data[pos]``
    (``HEADER_BYTES`` of it are there); ``ValueError`` when it is over
    ``limit``."""
    size: int
    (size,) = _LENGTH.unpack_from(data, pos)
    if size > limit:
        raise ValueError(f"frame of {size} bytes is over the limit of {limit}")
    return size


def split_address(address: str) -> tuple[str, int]:
    """``host:port`` (IPv6 hosts in brackets) as a (host, port) pair."""
    host, sep, port = address.rpartition(":")
    if not sep or not host or not port.isdigit():
        raise ValueError(f"bad add lane address {address!r}")
    return host.strip("[]"), int(port)
