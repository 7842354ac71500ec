"""Client end of the lane (protocol: wire/lane_frames.py): add and read connections.

Theory of operation
-------------------
One TCP connection per bookie carries this client's adds, with exactly the
semantics of an ``AddStream`` (transport/request_streams.py, whose
:class:`RequestStreamer` reopens connections and whose :class:`PendingRequests`
matches answers, expires late adds and closes idle connections):

* ``submit`` writes the framed request from the caller's own thread
  (``FrameWriter``: never blocking on a bookie that stopped reading), so the
  bookie receives a writer's requests in the order they were submitted.
* One reader thread per connection completes the futures, in the order the
  answers arrive, and runs the callers' callbacks.  An entry answer (a lone
  add's OK) is settled in its loop with one dict pop and one call.
* When the connection ends or breaks, every unanswered add fails with an
  unknown-outcome error (``Timeout`` if the watchdog cut it for a late add).
  An answer with request_id 0 is the bookie refusing the connection's input
  (a malformed frame) before it closes the connection; the unanswered adds
  fail with ``BookieUnavailable`` quoting it (they may have been journaled).

A :class:`ReadLaneConnection` is the same with reads: ``ReadRequest`` out,
``ReadResponse`` back (``READ_MAGIC``).  Each answer is received into one
new buffer and parsed in place (``framing.parse_read_response``): the
entries are a zero-copy view of it.  A reader that cancels its future (it
stopped early) only drops the answer when it comes.

With TLS (``tls``: transport/tls.py) the connection is wrapped and its
handshake completed, within the connect timeout, before the magic is sent
(wire/tls_socket.py: the reader thread and the senders share it safely).

Socket errors become typed errors in ``wire.codes.translate_socket_error``
(a failed handshake: ``TlsError``).
"""
from __future__ import annotations

import socket
import threading
import time
from typing import Any, Callable

from pybk_spark import errors
from pybk_spark.transport.request_streams import PendingRequests
from pybk_spark.wire.frame_socket import (FrameWriter, configure, frame_reader, read_frame,
                                          read_frame_into)
from pybk_spark.wire import lane_frames
from pybk_spark.wire import bookie_wire_pb2 as pb
from pybk_spark.wire import codes, framing
from pybk_spark.wire.tls_socket import handshake

# answers are a few dozen bytes; a bookie that sends more is not one
_MAX_ANSWER_BYTES = 1 << 20


def frame_add(head: pb.AddRequest, entries) -> bytes | list:
    """An AddRequest as one lane frame (header + pre-framed message): one
    buffer, or for entries given as a list of buffers (``add_payload``) the
    frame's buffers, which ``FrameWriter.send`` gathers."""
    parts = framing.payload_parts(head, entries)
    return lane_frames.frame_parts(*parts) if isinstance(entries, list) \
        else lane_frames.frame(*parts)


def frame_read(head: pb.ReadRequest, _entries=b"") -> bytes:
    """A ReadRequest as one lane frame (``RequestStreamer`` passes no entries)."""
    return lane_frames.frame(head.SerializeToString())


class LaneConnection(PendingRequests):
    """Adds over one lane connection."""
    magic = lane_frames.MAGIC
    kind = "add"

    def __init__(self, address: str, bookie_id: str, now: float, connect_timeout: float,
                 max_backlog_bytes: int, tls=None):
        super().__init__(bookie_id, now)
        try:
            host_port = lane_frames.split_address(address)
            sock: Any = socket.create_connection(host_port, timeout=connect_timeout)   # or a TlsSocket
        except (OSError, ValueError) as exc:
            raise codes.translate_socket_error(exc, bookie=bookie_id) from None
        if tls is not None:
            try:
                sock = handshake(sock, tls.context, server_side=False,
                                 server_hostname=tls.server_hostname(host_port[0]),
                                 timeout=connect_timeout)
            except OSError as exc:         # ssl.SSLError, a reset, the timeout
                sock.close()
                if isinstance(exc, TimeoutError):
                    raise codes.translate_socket_error(exc, bookie=bookie_id) from None
                raise codes.translate_tls_error(exc, address, bookie=bookie_id) from None
        self.sock = configure(sock)
        self.writer = FrameWriter(self.sock, f"pybk-lane-send-{bookie_id}", max_backlog_bytes)
        self._send = self.writer.send  # type: ignore[method-assign,assignment]  # a call less per send
        self.writer.send(lane_frames.hello(bookie_id, self.magic))
        self.reader = threading.Thread(target=self._read,
                                       name=f"pybk-{self.kind}-lane-{bookie_id}", daemon=True)
        self.reader.start()

    def _read(self) -> None:
        err: errors.BKError
        try:
            with frame_reader(self.sock) as stream:
                self._serve(stream)
            raise EOFError(f"{self.kind} lane closed by the bookie")
        except Exception as exc:  # noqa: BLE001 - end of stream, socket error, bad frame
            err = codes.translate_socket_error(self.writer.error or exc, bookie=self.bookie_id)
        self.writer.close()
        try:
            self.sock.close()
        except OSError:
            pass
        self.ended(err)

    def _serve(self, stream) -> None:
        """Settle answers until the end of the stream.  An entry answer is
        OK and acknowledges its one entry by definition, so its add gets
        (entry id, entry id), the result an entry frame's ``convert`` makes
        of an OK answer, with no answer object and no ``convert`` call: one
        of these per bookie per lone add."""
        lock = self.lock
        ids = lane_frames.entry_answer_ids
        entry_kind = lane_frames.ENTRY_KIND
        while True:
            body = read_frame(stream, _MAX_ANSWER_BYTES)
            if body is None:
                return
            if body and body[0] == entry_kind:
                request_id, entry_id = ids(body)
                with lock:
                    item = self.pending.pop(request_id, None)
                if item is not None:
                    item[2]((entry_id, entry_id), None)
                continue
            self._settle(pb.AddResponse.FromString(body))

    def _settle(self, resp) -> None:
        """Complete what ``resp`` answers; an error about the connection
        itself ends it."""
        if resp.request_id == lane_frames.CONNECTION_REQUEST_ID and resp.code != pb.OK:
            # earlier adds may be journaled: their outcome stays unknown
            raise ConnectionAbortedError(
                "bookie refused this connection's input: "
                f"{codes.error_for_code(resp.code, resp.message)!r}")
        self.answer(resp)

    def _send(self, req) -> bool:
        return self.writer.send(req)

    def _cancel(self) -> None:
        self.writer.close()            # the reader sees the end and fails what is pending

    def close(self, drain_s: float = 2.0) -> None:
        """Send what is queued, stop sending, let the bookie answer what it
        already has (at most ``drain_s`` in all), then cut the connection."""
        deadline = time.monotonic() + drain_s
        self.writer.flush(drain_s)
        try:
            self.sock.shutdown(socket.SHUT_WR)
        except OSError:
            pass
        if self.reader is not threading.current_thread():
            self.reader.join(max(0.0, deadline - time.monotonic()))
        self.writer.close()


class ReadLaneConnection(LaneConnection):
    """Reads over one lane connection; answers are up to ``max_answer_bytes``."""
    magic = lane_frames.READ_MAGIC
    kind = "read"

    def __init__(self, address: str, bookie_id: str, now: float, connect_timeout: float,
                 max_backlog_bytes: int, max_answer_bytes: int, tls=None):
        self.max_answer_bytes = max_answer_bytes
        super().__init__(address, bookie_id, now, connect_timeout, max_backlog_bytes, tls)

    def _serve(self, stream):
        while True:
            body = read_frame_into(stream, self.max_answer_bytes)
            if body is None:
                return
            self._settle(framing.parse_read_response(body))


def read_lane_connector(address: str, bookie_id: str, connect_timeout: float,
                        resolve: Callable[[], str], max_answer_bytes: int, tls=None
                        ) -> Callable[[float], PendingRequests]:
    """Opens read lane connections; see :func:`lane_connector`."""
    def open_read(addr: str, now: float) -> PendingRequests:
        return ReadLaneConnection(addr, bookie_id, now, connect_timeout, 1 << 20,
                                  max_answer_bytes, tls)
    return _reconnecting(address, resolve, open_read)


def lane_connector(address: str, bookie_id: str, connect_timeout: float,
                   resolve: Callable[[], str] = lambda: "",
                   max_backlog_bytes: int = 1 << 30, tls=None
                   ) -> Callable[[float], PendingRequests]:
    """Opens add lane connections (see ``RequestStreamer``) to ``address``.  When
    the connection is refused, ``resolve()`` is asked for the bookie's
    current lane address (a restarted bookie may listen on a new port) and,
    if it changed, that one is tried once."""
    def open_add(addr: str, now: float) -> PendingRequests:
        return LaneConnection(addr, bookie_id, now, connect_timeout, max_backlog_bytes, tls)
    return _reconnecting(address, resolve, open_add)


def _reconnecting(address: str, resolve: Callable[[], str],
                  open_at: Callable[[str, float], PendingRequests]
                  ) -> Callable[[float], PendingRequests]:
    current = [address]

    def connect(now: float) -> PendingRequests:
        try:
            return open_at(current[0], now)
        except errors.BookieUnavailable as refused:
            try:
                fresh = resolve()
            except errors.BKError:            # registry unreachable: keep the first answer
                raise refused from None
            if not fresh or fresh == current[0]:
                raise
            current[0] = fresh
            return open_at(fresh, now)
    return connect
