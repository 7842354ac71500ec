"""This bookie as a reader of a peer bookie over the peer's read lane
(``READ_MAGIC`` connections, protocol: pybk_spark/wire/lane_frames.py): the
sparse reads of a pull (bookie_server/serving/pull.py) when the peer
registered a lane and the bookies talk plaintext.

Why not gRPC: a peer answers a lane read from where its stored entries lie
(``batch_to_parts`` + ``sendmsg``) and this bookie receives the answer's
entries straight into the place its journal writes them from
(``read_frame_lead`` reads the answer's other fields,
``framing.trailing_payload`` says where its entries start, and the rest
lands in a ``journal.direct_write.RecordSpace``: the pull's recovery add
is then framed there, with no copy; an answer under ``_SPACE_MIN_BYTES``,
or one shaped otherwise, lands whole in a ``direct_buffers.ANSWER_BUFFERS``
buffer), parsed in place; over gRPC the same
8 MiB answer is IPC-encoded, joined into ``bytes``, copied into gRPC's
slices, and copied again on receipt (measured: the lane halves the CPU a
pull costs the two bookies; docs/performance.md, (8)).

Pipelined, on the pull's own thread.  A lane read connection answers its
reads one at a time, in the order they were sent, so the reads a pull
keeps in flight (its window) are all sent ahead on one connection
(``send``) and their answers received in that order (``receive``) by the
thread that runs the pull: no reader thread, no future, no hand-off per
answer (with a thread per read in flight, the threads' turns at the GIL
were a third of the context switches of a bookie taking four pulls).
The reader outlives a pull: serving/peer_pool.py hands it to the next pull
of the same peer, its connection included; a pull that ends with reads
still unanswered (it stopped on an error) leaves their answers on the
connection, so ``discard`` closes it and the next read opens a new one.
A connection that fails is closed and the read fails with the typed error
of ``wire.codes.translate_socket_error`` (the pull then counts the peer's
ids not copied); a refused read fails with its wire code's error, like
gRPC.  A connection idle since its last answer that fails at the next read
(other than by a timeout: the peer closed it meanwhile, a restart) is
replaced, and the reads in flight sent once more on the new one (reads
change nothing on the peer).
"""
from __future__ import annotations

import socket
from collections import deque
from dataclasses import dataclass
from typing import Any, Optional, cast

from pybk_spark import errors
from pybk_spark.wire import bookie_wire_pb2 as pb, codes, framing, lane_frames
from pybk_spark.wire.frame_socket import (configure, read_frame_lead, receive_body,
                                           send_parts)
from pybk_spark.wire.results import ReadResult
from bookie_server.direct_buffers import ANSWER_BUFFERS
from bookie_server.journal.direct_write import RecordSpace, receive_into_space
from bookie_server.serving.peer_client import read_request, read_result

_CONNECT_TIMEOUT_S = 5.0
# an answer's other fields (code, LAC, end, fenced; a message only when
# refused) and its entries' key and length lie within its first bytes
_LEAD_BYTES = 64
# entries this big are received where the journal writes them from
_SPACE_MIN_BYTES = 64 << 10


@dataclass(frozen=True)
class PeerAnswer(ReadResult):
    """A ``ReadResult`` whose ``raw`` entries, where ``space`` is set, were
    received straight into a journal record's place (``RecordSpace``): a
    pull that journals them as they are frames them there, with no copy."""
    space: Optional[RecordSpace] = None


class _Connection:
    def __init__(self, address: str, bookie_id: str, timeout: float) -> None:
        self.sock = configure(socket.create_connection(lane_frames.split_address(address),
                                                       timeout=min(timeout, _CONNECT_TIMEOUT_S)))
        self.sock.settimeout(timeout)
        self.stream = self.sock.makefile("rb")
        send_parts(self.sock, [lane_frames.hello(bookie_id, lane_frames.READ_MAGIC)])
        # reads were answered on it and more are due: a failure now is not
        # the peer having closed an idle connection
        self.answered = False

    def close(self) -> None:
        try:
            self.stream.close()
            self.sock.close()
        except OSError:
            pass


class LanePeerReader:
    """Sparse reads of one peer bookie over its read lane, pipelined on one
    connection: ``send`` a read, ``receive`` the oldest read's answer as a
    ``ReadResult`` (module docstring)."""

    def __init__(self, lane_address: str, bookie_id: str, max_answer_bytes: int,
                 default_timeout: float = 5.0) -> None:
        self.address = lane_address
        self.bookie_id = bookie_id
        self.max_answer_bytes = max_answer_bytes
        self.default_timeout = default_timeout
        self._conn: Optional[_Connection] = None
        # the reads sent and not yet answered, oldest first: (frame, timeout, context)
        self._sent: deque[tuple[list[Any], float, dict[str, Any]]] = deque()
        self._next = 0

    def send(self, ledger_id: int, first: int, last: int, *, max_entries: int = 0,
             max_bytes: int = 0, timeout: float | None = None, sparse: bool = False) -> int:
        """Send a read; its handle (the order it is answered in).  A failure
        to send shows at its ``receive``."""
        req, ctx = read_request(self.bookie_id, ledger_id, first, last, max_entries=max_entries,
                                max_bytes=max_bytes, sparse=sparse)
        frame = lane_frames.frame_parts(req.SerializeToString())
        self._sent.append((frame, timeout or self.default_timeout, ctx))
        if self._conn is not None:
            try:
                send_parts(self._conn.sock, frame)
            except OSError:
                self._drop()          # ``receive`` reconnects or fails
        handle = self._next
        self._next += 1
        return handle

    def receive(self) -> PeerAnswer:
        """The answer to the oldest read sent (typed errors as gRPC's)."""
        _frame, timeout, ctx = self._sent[0]
        # idle since its last answer: the peer may have closed it meanwhile
        kept = self._conn is not None and not self._conn.answered
        try:
            conn, got = self._next_frame(timeout)
        except (OSError, ValueError, EOFError) as exc:
            self._drop()
            if not kept or isinstance(exc, TimeoutError):
                self._sent.clear()     # the connection and its unanswered reads are gone
                raise codes.translate_socket_error(exc, **ctx) from None
            try:                       # once more, on a new connection
                conn, got = self._next_frame(timeout)
            except (OSError, ValueError, EOFError) as again:
                self._drop()
                self._sent.clear()
                raise codes.translate_socket_error(again, **ctx) from None
        self._sent.popleft()
        conn.answered = bool(self._sent)
        body, space = got
        try:
            resp: Any = (framing.parse_read_response(cast(bytes, body)) if space is None
                         else framing.parse_head(pb.ReadResponse, cast(bytes, body), space.body()))
        except Exception as exc:  # noqa: BLE001 - broad: a malformed answer
            self._sent.clear()         # nothing later on the connection can be trusted
            self._drop()
            raise errors.BadRequest(f"bad bookie response: {exc}", **ctx) from None
        res = read_result(resp, ctx)
        return PeerAnswer(res.batch, res.end, res.lac, res.fenced, res.raw, space)

    def _next_frame(self, timeout: float
                    ) -> tuple[_Connection, tuple[Any, Optional[RecordSpace]]]:
        """The next answer frame, on the connection (a new one, with every
        read in flight sent on it, when there is none): (the whole body,
        None), or where its entries are its last field (our peers' answers)
        (the rest of its fields, the ``RecordSpace`` the entries were
        received into)."""
        conn = self._conn
        if conn is None:
            conn = self._connect(timeout)
            for frame, _t, _c in self._sent:
                send_parts(conn.sock, frame)
        conn.sock.settimeout(timeout)
        got = read_frame_lead(conn.stream, self.max_answer_bytes, _LEAD_BYTES)
        if got is None:
            raise EOFError("read lane closed by the peer")
        size, lead = got
        placed = receive_into_space(lead, size, conn.stream.readinto, _SPACE_MIN_BYTES)
        if placed is None:
            return conn, (receive_body(conn.stream.readinto, lead, size, ANSWER_BUFFERS.take),
                          None)
        return conn, placed

    def discard(self) -> None:
        """Forget the reads still unanswered: their answers would meet the
        next pull's reads, so the connection goes too."""
        if self._sent:
            self._sent.clear()
            self._drop()

    def _connect(self, timeout: float) -> _Connection:
        self._conn = _Connection(self.address, self.bookie_id, timeout)
        return self._conn

    def _drop(self) -> None:
        """After a failure nothing later on a connection can be trusted."""
        conn, self._conn = self._conn, None
        if conn is not None:
            conn.close()

    def close(self) -> None:
        self._sent.clear()
        conn, self._conn = self._conn, None
        if conn is not None:
            try:
                conn.sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            conn.close()
