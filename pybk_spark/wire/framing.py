"""Wire messages whose one large ``bytes`` field is framed by hand.

Theory of operation
-------------------
A protobuf message on the wire is a sequence of fields in any order, so
``SerializeToString(message without its payload) + field(payload)`` is the
same message to every parser.  We build the two large messages this way:
``AddRequest`` (client -> bookie, field 3 ``entries``) and ``ReadResponse``
(bookie -> client, field 3 ``entries``).

Why: protobuf's upb backend (protobuf 7.x here) sizes and serializes a large
``bytes`` field that was just set on a fresh message at about 1.8 ms per MB
(measured: 0.98 ms for a 0.54 MB AddRequest, 7.7 ms for a 4 MiB
ReadResponse), while one ``bytes.join`` of the same payload costs about
0.02 ms per MB.  On 2 cores that was the largest single CPU cost of a Spark
write and of a catch-up read.

Parsing goes the other way: :func:`split_payload` walks the top-level fields,
cuts the payload out as a zero-copy ``pyarrow.Buffer`` view of the received
bytes, and the generated class parses the small rest (the generated class
alone would copy the payload once on parse and again on every ``.entries``
access).  The bookie parses AddRequests this way (:func:`parse_add_request`),
the client ReadResponses (:func:`parse_read_response`).  A receiver that
wants the payload in memory of its own reads a message's first bytes,
finds where the payload starts (:func:`trailing_payload`: our framed
messages put it last), receives the rest there and parses the fields
before it (:func:`parse_head`).  Malformed input
raises ``ValueError``, which gRPC turns into a failed call, as it does for
protobuf's own ``DecodeError``.

gRPC needs a serializer that accepts what we hand it: :func:`serialize` takes
either a generated message or bytes that are already a serialized message.
:func:`add_bookie_servicer` registers the bookie service like the generated
``add_BookieServicer_to_server`` does, but with that serializer, so a handler
may answer with pre-framed bytes.  Its deserializers never raise: bytes
that do not parse reach the handler as :class:`Malformed`, answered with
``BAD_REQUEST`` like any other bad request.  Generated code is never edited.

Pure: no I/O.  A conformance test (tests/unit/test_framing.py) checks that
framed messages parse to exactly the message protobuf itself would build, and
that both parsers agree with the generated ones.
"""
from __future__ import annotations

from typing import Any, Callable, Optional, Union

import pyarrow as pa
from google.protobuf.message import DecodeError, Message

from pybk_spark.wire import bookie_wire_pb2 as pb

_LEN_DELIMITED = 2
ENTRIES_FIELD = 3                     # AddRequest.entries and ReadResponse.entries
SERVICE = pb.DESCRIPTOR.services_by_name["Bookie"]
ADD_STREAM_METHOD = f"/{SERVICE.full_name}/AddStream"
READ_ENTRIES_METHOD = f"/{SERVICE.full_name}/ReadEntries"

BytesLike = Union[bytes, bytearray, pa.Buffer]


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        if n:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def payload_parts(head: Message, payload: BytesLike | list[BytesLike],
                  field_number: int = ENTRIES_FIELD) -> tuple[BytesLike, ...]:
    """The pieces of :func:`with_payload`, not yet joined (a caller that adds
    its own header joins once); ``payload`` may be a list of buffers, sent
    one after the other."""
    if isinstance(payload, list):
        size = sum(len(p) for p in payload)
        return (*payload_prefix(head, size, field_number), *payload) if size \
            else (head.SerializeToString(),)
    size = len(payload)
    if size == 0:
        return (head.SerializeToString(),)
    return (*payload_prefix(head, size, field_number), payload)


def payload_prefix(head: Message, size: int, field_number: int = ENTRIES_FIELD) -> tuple[bytes, bytes, bytes]:
    """What precedes a payload of ``size`` > 0 bytes: the serialized head and
    the field's key and length, for a sender that sends the payload itself
    as separate buffers."""
    tag = _varint((field_number << 3) | _LEN_DELIMITED)
    return head.SerializeToString(), tag, _varint(size)


def with_payload(head: Message, payload: BytesLike | list[BytesLike], field_number: int = ENTRIES_FIELD) -> bytes:
    """``head`` (a generated message whose payload field is unset) serialized,
    followed by ``payload`` as length-delimited field ``field_number``.  An
    empty payload is left out, as protobuf itself does for proto3 bytes."""
    return b"".join(payload_parts(head, payload, field_number))


def _read_varint(data: BytesLike, pos: int, end: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        if pos >= end or shift > 63:
            raise ValueError("truncated or overlong varint in AddRequest")
        b = data[pos]
        pos += 1
        value |= (b & 0x7F) << shift
        if not b & 0x80:
            return value, pos
        shift += 7


class Framed:
    """A parsed message whose payload field is a zero-copy view.

    ``head`` is the generated message parsed from every OTHER field;
    ``entries`` is a read-only pyarrow Buffer over the received bytes (crc32c,
    writev and Arrow IPC all take it as is: no copy).  Attribute access falls
    through to ``head``, so ``view.ledger_id`` reads like the generated class."""
    __slots__ = ("head", "entries")

    def __init__(self, head: Message, entries: pa.Buffer) -> None:
        self.head = head
        self.entries = entries

    def __getattr__(self, name: str) -> Any:
        return getattr(self.head, name)


_EMPTY = pa.py_buffer(b"")


def _next_field(data: BytesLike, pos: int, end: int) -> tuple[int, int, int, int]:
    """(field number, wire type, where its value starts, where it ends) of
    the field whose key is at ``pos``; the value's end may lie past ``end``
    (the caller decides).  ``ValueError`` for field number 0, an
    unsupported wire type, or a varint cut off by ``end``."""
    key, pos = _read_varint(data, pos, end)
    field, wire = key >> 3, key & 7
    if field == 0:
        raise ValueError("message has a field number 0")
    if wire == 0:
        _, stop = _read_varint(data, pos, end)
        return field, wire, pos, stop
    if wire == _LEN_DELIMITED:
        size, pos = _read_varint(data, pos, end)
        return field, wire, pos, pos + size
    if wire == 1:
        return field, wire, pos, pos + 8
    if wire == 5:
        return field, wire, pos, pos + 4
    raise ValueError(f"unsupported wire type {wire}")


def split_payload(data: bytes | memoryview, field_number: int = ENTRIES_FIELD
                  ) -> tuple[bytes, pa.Buffer]:
    """(the message without field ``field_number``, that field's value as a
    zero-copy view).  Protobuf semantics: unknown fields are kept in the head,
    a field given twice keeps its last value.  Malformed input raises
    ``ValueError``."""
    view = None
    payload = _EMPTY
    kept: list[tuple[int, int]] = []
    pos, end = 0, len(data)
    while pos < end:
        field, wire, at, stop = _next_field(data, pos, end)
        if stop > end:
            raise ValueError("length-delimited field runs past the end of the message"
                             if wire == _LEN_DELIMITED else "field runs past the end of the message")
        if wire == _LEN_DELIMITED and field == field_number:
            if view is None:
                view = pa.py_buffer(data)
            payload = view[at:stop]
        else:
            kept.append((pos, stop))
        pos = stop
    if view is None:                       # no payload: the whole message is the head
        return bytes(data), payload
    return b"".join(data[a:b] for a, b in kept), payload


def trailing_payload(lead: bytes | memoryview, total: int,
                     field_number: int = ENTRIES_FIELD) -> Optional[tuple[int, int]]:
    """Where field ``field_number`` lies in a message of ``total`` bytes of
    which ``lead`` holds the first ones, when that field is the message's
    last (its value ends at ``total``, as our framed messages put it) and
    its key and length lie within ``lead``: (the field's key offset, its
    value's offset).  The bytes before the key are then the rest of the
    message (``parse_head``), and a receiver may put the value where it
    chooses.  None otherwise: the caller receives the whole message and
    parses it with ``split_payload``."""
    pos, end = 0, len(lead)
    try:
        while pos < end:
            field, wire, at, stop = _next_field(lead, pos, end)
            if wire == _LEN_DELIMITED and field == field_number and stop == total:
                return pos, at
            pos = stop
    except ValueError:                     # cut off by the end of ``lead``, or malformed
        return None
    return None


def parse_head(message_cls: type[Message], head: bytes, payload: pa.Buffer) -> Framed:
    """A ``Framed`` from a message's fields other than its payload
    (``head``, the bytes before ``trailing_payload``'s key offset) and the
    payload received apart; ``ValueError`` where the head does not parse
    (e.g. a varint field sent with the wrong wire type)."""
    try:
        msg = message_cls.FromString(head)
    except DecodeError as exc:
        raise ValueError(f"malformed {message_cls.__name__}: {exc}") from None
    return Framed(msg, payload)


def _parse_framed(message_cls: type[Message], data: bytes | memoryview) -> Framed:
    head, entries = split_payload(data)
    return parse_head(message_cls, head, entries)


def parse_add_request(data: bytes | memoryview) -> Framed:
    """Parse AddRequest wire bytes like ``AddRequest.FromString``, without
    copying the entries (the bookie's request deserializer)."""
    return _parse_framed(pb.AddRequest, data)


def parse_read_response(data: bytes) -> Framed:
    """Parse ReadResponse wire bytes like ``ReadResponse.FromString``, without
    copying the entries (the client's response deserializer for reads: a read
    answer is up to ``max_read_bytes``, and upb copies a bytes field once on
    parse and again on every access)."""
    return _parse_framed(pb.ReadResponse, data)


_REQUEST_PARSERS = {"AddEntries": parse_add_request, "AddStream": parse_add_request}


class Malformed:
    """What the bookie's request deserializer hands a handler for bytes that
    do not parse, instead of raising: gRPC answers a raising deserializer
    with a bare INTERNAL status, and after one inside an ``AddStream`` the
    server's shutdown never completed (found by tests/bookie/test_fuzz_wire.py).
    Handlers answer it with ``BAD_REQUEST``; ``request_id`` and ``ledger_id``
    read as 0 (unknown)."""
    __slots__ = ("error",)
    request_id = 0
    ledger_id = 0

    def __init__(self, error: str) -> None:
        self.error = error


def _lenient(parse: Callable[[bytes], Any]) -> Callable[[bytes], Any]:
    def parse_or_mark(data: bytes) -> Any:
        try:
            return parse(data)
        except (ValueError, DecodeError) as exc:
            return Malformed(f"malformed request: {exc}")
    return parse_or_mark


def _refusing(handler: Callable[[Any, Any], Any], response_cls: Any) -> Callable[[Any, Any], Any]:
    """A unary handler that answers a :class:`Malformed` request itself."""
    def handle(request: Any, context: Any) -> Any:
        if isinstance(request, Malformed):
            return response_cls(code=pb.BAD_REQUEST, message=request.error)
        return handler(request, context)
    return handle


def serialize(message: Message | bytes | bytearray) -> bytes:
    """gRPC serializer: a generated message, or bytes already serialized."""
    if isinstance(message, (bytes, bytearray)):
        return bytes(message)
    return message.SerializeToString()


def add_bookie_servicer(servicer: Any, server: Any) -> None:
    """Register ``servicer`` for every method of the Bookie service; responses
    may be generated messages or pre-framed bytes (:func:`with_payload`)."""
    import grpc  # why: grpc (~90 ms) stays out of a Spark worker that only plans
    handlers = {}
    for method in SERVICE.methods:
        request_cls = getattr(pb, method.input_type.name)
        if method.client_streaming and method.server_streaming:
            make = grpc.stream_stream_rpc_method_handler
        elif method.client_streaming:
            make = grpc.stream_unary_rpc_method_handler
        elif method.server_streaming:
            make = grpc.unary_stream_rpc_method_handler
        else:
            make = grpc.unary_unary_rpc_method_handler
        parse = _REQUEST_PARSERS.get(method.name, request_cls.FromString)
        handler = getattr(servicer, method.name)
        response_cls = getattr(pb, method.output_type.name)
        if "code" in response_cls.DESCRIPTOR.fields_by_name:   # every method but Health
            parse = _lenient(parse)
            if not method.client_streaming:
                handler = _refusing(handler, response_cls)
            # a stream's handler meets Malformed items itself (BookieService.submit_add)
        handlers[method.name] = make(handler, request_deserializer=parse,
                                     response_serializer=serialize)
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE.full_name,
                                                                         handlers),))
    server.add_registered_method_handlers(SERVICE.full_name, handlers)
