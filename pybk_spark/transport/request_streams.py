"""Adds over one long-lived connection per bookie: an ``AddStream``, or an
add lane connection (transport/lane_client.py, same semantics).

Theory of operation
-------------------
A unary ``AddEntries`` call per chunk pays call set-up, a deadline timer and a
completion-queue hand-off each time; one stream per bookie pays them once.
Requests carry a ``request_id`` the bookie echoes, so answers are matched by id
(the bookie answers as journal groups become durable, normally in order).

* ``submit`` enqueues the request; gRPC's own thread drains the queue into the
  stream, in submission order, so a bookie journals a writer's chunks in the
  order they were sent.
* One reader thread per stream settles requests as answers arrive: each
  request carries a ``deliver(result, error)`` callback the reader thread
  calls (``submit`` / ``submit_framed`` wrap a future in one; a writer's
  lone adds pass their own, ``send_framed``, so no future is made per
  bookie per add).
* When the stream ends or breaks (bookie died, channel closed) every
  unanswered add fails with the translated transport error: its outcome is
  UNKNOWN.  The next ``submit`` opens a fresh stream.
* Timeouts: ``expire(now)`` (called by the pool's watchdog) cancels a stream
  whose oldest unanswered add is older than its timeout; all its adds then fail
  with ``Timeout`` (unknown outcome), as BookKeeper's addEntryTimeout does.
  One slow bookie therefore never holds a writer longer than the timeout.
* An open stream holds one of the bookie's gRPC server threads, so a stream
  idle for ``idle_close_s`` (no add pending) is closed by ``expire``; the next
  add opens a new one.
* Requests travel pre-framed (wire/framing.py): the entries payload is
  appended to the serialized request head, which avoids protobuf's slow
  handling of large bytes fields.
"""
from __future__ import annotations

import itertools
import queue
import threading
from concurrent.futures import Future
from typing import Callable

import grpc

from pybk_spark import errors
from pybk_spark.transport.base import Deliver, answer_error, deliver_to
from pybk_spark.wire import bookie_wire_pb2 as pb
from pybk_spark.wire import codes, framing

_CLOSE = object()
# request ids are unique per connection; one counter for all of them lets a
# request sent to several bookies carry the same id (framed once)
_request_ids = itertools.count(1)
next_request_id: Callable[[], int] = _request_ids.__next__


def add_stream_opener(channel) -> Callable:
    """The AddStream call of ``channel`` taking pre-framed request bytes."""
    return channel.stream_stream(framing.ADD_STREAM_METHOD,
                                 request_serializer=framing.serialize,
                                 response_deserializer=pb.AddResponse.FromString)


class PendingRequests:
    """The unanswered requests of one connection (an AddStream, or a lane
    connection carrying adds or reads): register, answer by request_id, fail
    all on a break, and the watchdog's timeout and idle checks.  Subclasses
    send and close."""

    def __init__(self, bookie_id: str, now: float):
        self.bookie_id = bookie_id
        self.last_used = now
        # request_id -> (deadline, convert, deliver)
        self.pending: dict[int, tuple[float, Callable, Deliver]] = {}
        self.lock = threading.Lock()
        self.broken: errors.BKError | None = None
        self.timed_out = False

    def answer(self, resp) -> None:
        """Complete the add ``resp`` answers (an unknown id is ignored)."""
        with self.lock:
            item = self.pending.pop(resp.request_id, None)
        if item is None:
            return
        _deadline, convert, deliver = item
        try:                       # ``outcome``, inline: one call less per answer
            result = convert(resp)
        except Exception as exc:  # noqa: BLE001 - a typed error, or a malformed answer
            deliver(None, answer_error(exc, bookie=self.bookie_id))
            return
        deliver(result, None)

    def ended(self, err: errors.BKError) -> None:
        """The connection is over: fail every unanswered add (a timeout
        cancellation reports ``Timeout``)."""
        if self.timed_out:
            err = errors.Timeout("add timed out (connection cancelled)", bookie=self.bookie_id)
        self._fail_all(err)

    def _fail_all(self, err: errors.BKError) -> None:
        with self.lock:
            self.broken = self.broken or err
            items, self.pending = list(self.pending.values()), {}
        self._after_break()
        for _deadline, _convert, deliver in items:
            deliver(None, err)

    def _after_break(self) -> None:
        pass

    def add(self, request_id: int, req, deadline: float, convert: Callable, deliver: Deliver,
            now: float) -> bool:
        """False if the connection is already broken (caller opens a new one)."""
        with self.lock:
            if self.broken is not None:
                return False
            self.pending[request_id] = (deadline, convert, deliver)
            self.last_used = now
        if self._send(req):
            return True
        with self.lock:           # not sent: retry on a new connection, unless the
            item = self.pending.pop(request_id, None)   # break already failed the add
        return item is None

    def _send(self, req) -> bool:
        raise NotImplementedError

    def _cancel(self) -> None:
        raise NotImplementedError

    def expire(self, now: float, idle_close_s: float) -> None:
        with self.lock:
            late = any(item[0] <= now for item in self.pending.values())
            idle = (not self.pending and self.broken is None
                    and now - self.last_used >= idle_close_s)
            if idle:
                self.broken = errors.BookieUnavailable("idle add connection closed",
                                                       bookie=self.bookie_id)
        if late:
            self.timed_out = True
            self._cancel()
        elif idle:
            self.close()

    def close(self, drain_s: float = 2.0) -> None:
        raise NotImplementedError


class _Stream(PendingRequests):
    """Adds over one gRPC AddStream."""

    def __init__(self, open_call: Callable, bookie_id: str, now: float):
        super().__init__(bookie_id, now)
        self.requests: "queue.SimpleQueue" = queue.SimpleQueue()
        try:
            self.call = open_call(self._iter_requests())
        except (grpc.RpcError, ValueError) as exc:  # ValueError: channel closed
            raise codes.translate_rpc_error(exc, bookie=bookie_id) from None
        self.reader = threading.Thread(target=self._read, name=f"pybk-add-{bookie_id}",
                                       daemon=True)
        self.reader.start()

    def _iter_requests(self):
        while True:
            req = self.requests.get()
            if req is _CLOSE:
                return
            yield req

    def _read(self) -> None:
        err: errors.BKError
        try:
            for resp in self.call:
                self.answer(resp)
            err = errors.BookieUnavailable("add stream ended by the bookie", bookie=self.bookie_id)
        except Exception as exc:  # noqa: BLE001 - gRPC error / cancellation
            err = codes.translate_rpc_error(exc, bookie=self.bookie_id)
        self.ended(err)

    def _after_break(self) -> None:
        self.requests.put(_CLOSE)           # lets gRPC's request thread finish

    def _send(self, req) -> bool:
        self.requests.put(req)
        return True

    def _cancel(self) -> None:
        self.call.cancel()

    def close(self, drain_s: float = 2.0) -> None:
        """Half-close, let the bookie answer what it already has (at most
        ``drain_s``), then cancel."""
        self.requests.put(_CLOSE)
        if self.reader is not threading.current_thread():
            self.reader.join(drain_s)
        self.call.cancel()


def stream_connector(channel, bookie_id: str) -> Callable[[float], PendingRequests]:
    """Opens a gRPC AddStream on ``channel`` (see :class:`RequestStreamer`)."""
    opener = add_stream_opener(channel)
    return lambda now: _Stream(opener, bookie_id, now)


class RequestStreamer:
    """One kind of request to one bookie (its adds, or its lane reads) over
    one long-lived connection (``connect(now)`` opens a
    :class:`PendingRequests`: an AddStream or a lane connection), reopened
    after a break."""

    def __init__(self, connect: Callable[[float], PendingRequests], bookie_id: str,
                 clock: Callable[[], float], idle_close_s: float = 30.0, frame=None):
        self._connect = connect
        self._frame = frame or framing.with_payload
        self._idle_close_s = idle_close_s
        self._bookie_id = bookie_id
        self._clock = clock
        self._lock = threading.Lock()
        self._stream: PendingRequests | None = None
        self._closed = False

    def submit(self, head: pb.AddRequest, entries, timeout: float, convert: Callable) -> Future:
        """Send ``head`` (an AddRequest without its entries) + ``entries``."""
        def frame(request_id: int):
            head.request_id = request_id
            return self._frame(head, entries)
        return self.submit_framed(frame, timeout, convert)

    def submit_framed(self, frame: Callable[[int], object], timeout: float,
                      convert: Callable) -> Future:
        """Send ``frame(request_id)``: a request the caller frames itself."""
        fut: Future = Future()
        request_id = next_request_id()
        self.send_framed(request_id, frame(request_id), timeout, convert, deliver_to(fut))
        return fut

    def send_framed(self, request_id: int, req, timeout: float, convert: Callable,
                    deliver: Deliver) -> None:
        """Send ``req``, framed with ``request_id`` (from ``next_request_id``;
        the same request to several bookies may share one), and call
        ``deliver(convert(answer), None)`` or ``deliver(None, error)`` once:
        from the connection's reader thread, or from this thread when it
        could not be sent."""
        now = self._clock()
        deadline = now + timeout
        stream = self._stream
        if stream is not None and stream.broken is None and not self._closed \
                and stream.add(request_id, req, deadline, convert, deliver, now):
            return
        for _attempt in range(2):
            with self._lock:
                if self._closed:
                    deliver(None, errors.BookieUnavailable("client closed",
                                                           bookie=self._bookie_id))
                    return
                stream = self._stream
                if stream is None or stream.broken is not None:
                    try:
                        stream = self._stream = self._connect(now)
                    except errors.BKError as exc:  # channel closed, bookie refused
                        deliver(None, exc)
                        return
            if stream.add(request_id, req, deadline, convert, deliver, now):
                return
        broken = stream.broken if stream is not None else None
        cls = errors.TlsError if isinstance(broken, errors.TlsError) \
            else errors.BookieUnavailable
        deliver(None, cls(f"add stream keeps breaking: {broken}", bookie=self._bookie_id))

    @property
    def connection(self) -> PendingRequests | None:
        """The connection requests go over now (None before the first one,
        or once closed); a broken one stays until the next request replaces
        it.  For diagnostics and tests."""
        return self._stream

    def expire(self) -> None:
        stream = self._stream
        if stream is not None:
            stream.expire(self._clock(), self._idle_close_s)

    def close(self) -> None:
        with self._lock:
            self._closed = True
            stream, self._stream = self._stream, None
        if stream is not None:
            stream.close()
