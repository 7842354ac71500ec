"""This bookie as a reader of a peer bookie over the peer's read lane
(``READ_MAGIC`` connections, protocol: pybk_spark/wire/lane_frames.py): the
sparse reads of a pull (bookie_server/serving/pull.py) when the peer
registered a lane and the bookies talk plaintext.

Why not gRPC: a peer answers a lane read from where its stored entries lie
(``batch_to_parts`` + ``sendmsg``) and this bookie receives the answer into
one pooled buffer (``read_frame_into``), parsed in place; over gRPC the same
8 MiB answer is IPC-encoded, joined into ``bytes``, copied into gRPC's
slices, and copied again on receipt (measured: the lane halves the CPU a
pull costs the two bookies; docs/performance.md, (8)).

A lane read connection answers one read at a time, in order, so the reads
a pull keeps in flight (its window) each get a connection and a thread of
their own: ``read`` hands the request to the next free one.  The reader
outlives a pull: serving/peer_pool.py hands it to the next pull of the same
peer, connections and threads included.  A connection that fails is closed
and its read fails with the typed error of
``wire.codes.translate_socket_error`` (the pull then counts the peer's ids
not copied); a refused read fails with its wire code's error, like gRPC.
A kept connection that fails before its answer (other than by a timeout:
the peer closed it while idle) is replaced, and the read sent once more on
the new one (reads change nothing on the peer).
The same ``read`` / ``close`` shape as ``peer_client.PeerReader``.
"""
from __future__ import annotations

import socket
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Optional, cast

from pybk_spark import errors
from pybk_spark.wire import bookie_wire_pb2 as pb
from pybk_spark.wire import codes, framing, lane_frames
from pybk_spark.wire.frame_socket import configure, read_frame_into, send_parts
from pybk_spark.wire.results import ReadResult
from bookie_server.serving.peer_client import read_request, read_result

_CONNECT_TIMEOUT_S = 5.0


class _Connection:
    def __init__(self, address: str, bookie_id: str, timeout: float) -> None:
        self.sock = configure(socket.create_connection(lane_frames.split_address(address),
                                                       timeout=min(timeout, _CONNECT_TIMEOUT_S)))
        self.sock.settimeout(timeout)
        self.stream = self.sock.makefile("rb")
        send_parts(self.sock, [lane_frames.hello(bookie_id, lane_frames.READ_MAGIC)])

    def close(self) -> None:
        try:
            self.stream.close()
            self.sock.close()
        except OSError:
            pass


class LanePeerReader:
    """Sparse reads of one peer bookie over its read lane, each a future of
    a ``ReadResult``; at most ``window`` at once."""

    def __init__(self, lane_address: str, bookie_id: str, max_answer_bytes: int,
                 window: int, default_timeout: float = 5.0) -> None:
        self.address = lane_address
        self.bookie_id = bookie_id
        self.max_answer_bytes = max_answer_bytes
        self.default_timeout = default_timeout
        self._local = threading.local()
        self._lock = threading.Lock()
        self._open: list[_Connection] = []
        self._pool = ThreadPoolExecutor(max_workers=max(1, window),
                                        thread_name_prefix=f"pull-lane-{bookie_id}")

    def read(self, ledger_id: int, first: int, last: int, *, max_entries: int = 0,
             max_bytes: int = 0, timeout: float | None = None,
             sparse: bool = False) -> "Future[ReadResult]":
        req, ctx = read_request(self.bookie_id, ledger_id, first, last, max_entries=max_entries,
                                max_bytes=max_bytes, sparse=sparse)
        return self._pool.submit(self._read, req, timeout or self.default_timeout, ctx)

    def _read(self, req: pb.ReadRequest, timeout: float, ctx: dict[str, Any]) -> ReadResult:
        frame = lane_frames.frame_parts(req.SerializeToString())
        conn: Optional[_Connection] = getattr(self._local, "conn", None)
        # A kept connection may have been closed by the peer while it was idle
        # (a restart): it gets a second attempt on a new connection (reads
        # change nothing on the peer).  A new connection's failure, or a
        # timeout on any connection, fails the read.
        attempts = 2 if conn is not None else 1
        for attempt in range(1, attempts + 1):
            try:
                if conn is None:
                    conn = self._connect(timeout)
                body = self._exchange(conn, frame, timeout)
                break
            except (OSError, ValueError, EOFError) as exc:
                self._drop(conn)
                conn = None
                if attempt == attempts or isinstance(exc, TimeoutError):
                    raise codes.translate_socket_error(exc, **ctx) from None
        try:
            resp: Any = framing.parse_read_response(cast(bytes, body))   # parsed in place
        except Exception as exc:  # noqa: BLE001 - broad: a malformed answer
            self._drop(conn)
            raise errors.BadRequest(f"bad bookie response: {exc}", **ctx) from None
        return read_result(resp, ctx)

    def _connect(self, timeout: float) -> _Connection:
        conn = self._local.conn = _Connection(self.address, self.bookie_id, timeout)
        with self._lock:
            self._open.append(conn)
        return conn

    def _exchange(self, conn: _Connection, frame: list[Any], timeout: float) -> Any:
        """Send one read on ``conn`` and receive its whole answer frame."""
        conn.sock.settimeout(timeout)
        send_parts(conn.sock, frame)
        body = read_frame_into(conn.stream, self.max_answer_bytes)
        if body is None:
            raise EOFError("read lane closed by the peer")
        return body

    def _drop(self, conn: Optional[_Connection]) -> None:
        """After a failure nothing later on a connection can be trusted."""
        self._local.conn = None
        if conn is not None:
            with self._lock:
                if conn in self._open:
                    self._open.remove(conn)
            conn.close()

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
        with self._lock:
            conns, self._open = self._open, []
        for conn in conns:
            # a worker blocked on a read of it wakes with an error
            try:
                conn.sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            conn.close()
