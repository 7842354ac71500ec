"""Frames over a TCP socket, for both ends of the add lane (wire/lane_frames.py).

Theory of operation
-------------------
``FrameWriter.send`` is called from whichever thread has a frame to send: the
client's adding thread, or on a bookie the journal's completion callback.
Neither may ever block on a peer that stopped reading (a paused bookie, a
client that only writes): a blocked journal thread would stall every ledger
on the bookie, a blocked writer would outlive its add timeout.  So:

* With nothing queued, ``send`` tries the whole frame at once without
  blocking (``MSG_DONTWAIT``).  On loopback and small frames that is the
  only path: no thread hand-off.  A frame given as a list of buffers (a
  large add: its payloads where they lie) goes with ``sendmsg``, gathered;
  what it did not take queues as views, in order.  A TLS socket cannot
  gather, so there the list is joined first.
* Whatever did not fit is queued, in order, and a helper thread started on
  first need sends the queue with blocking sends.  While anything is queued
  or being sent, later frames queue behind it, so frames never interleave
  and keep their order.
* More than ``max_backlog_bytes`` queued means the peer is not reading: the
  writer shuts the connection down and keeps the reason in ``error``.  The
  connection's reader then sees the end of the stream and fails what is
  still unanswered; a send error is handled the same way.
* ``close`` shuts the socket down, which also wakes a helper thread blocked
  in ``sendall``.
* Inside ``corked()`` a thread's frames are held back, per writer, and each
  writer's are sent together as one frame sequence when the block ends: a
  bookie's journal answers a whole group with one send per connection, and
  a pipelining client reads the group's answers with one receive, where a
  send per answer would wake it once per answer.

``read_frame`` reads one frame from a buffered reader of the socket;
``read_frame_into`` reads a large one (a read answer) straight into one new
buffer; ``read_frame_lead`` reads a frame's first bytes only, and
``fill_by`` the rest into memory the caller chose by them, or
``receive_body`` the whole body into one buffer (as ``frame_bodies`` does
with a frame its ``recv`` cut off).
``frame_bodies`` is the bookie's reader: one C call per frame while
frames arrive one at a time, each such body a view of what its ``recv``
returned (no copy); frames that share a ``recv`` are copied out at their own
size and a frame cut off by its ``recv`` is received into one buffer of its
size, so no body keeps a larger receive buffer alive in the write cache.
A ``Backlog`` passed to it says, for each body, whether more of the
stream arrived with it: a pipelining peer's frames that queued while the
receiver was busy.
``send_parts`` is the blocking gathering send of a bookie's read connection
thread, which has nothing else to do while a reader takes an answer.
"""
from __future__ import annotations

import collections
import io
import socket
import threading
from typing import Any, Callable, Iterator, Optional

import pyarrow as pa

from pybk_spark.wire import lane_frames
from pybk_spark.wire.arrow_memory import wire_pool

_DONTWAIT = getattr(socket, "MSG_DONTWAIT", 0)
_IOV_MAX = 1024     # buffers one sendmsg takes (Linux's UIO_MAXIOV)

class _Held(threading.local):
    """A thread's frames held back inside ``corked()`` (writer -> its
    frames), None outside.  The class default answers a thread that never
    corked without the ``AttributeError`` a bare ``threading.local`` raises
    and ``getattr`` catches (0.4 us, on every send)."""
    frames: Optional[dict[Any, list[Any]]] = None


_held = _Held()


class corked:
    """Hold back the frames this thread sends through any ``FrameWriter``
    until the block ends, then send each writer's together (module
    docstring).  Nested blocks send when the outermost ends."""

    __slots__ = ("_frames",)
    # the outermost block's frames (it sends them); None in a nested block
    _frames: Optional[dict[Any, list[Any]]]

    def __enter__(self) -> None:
        self._frames = None
        if _held.frames is None:
            self._frames = _held.frames = {}

    def __exit__(self, *exc: object) -> None:
        frames = self._frames
        if frames is None:
            return
        _held.frames = None
        for writer, held in frames.items():
            if len(held) == 1:
                writer.send(held[0])
            elif any(isinstance(frame, list) for frame in held):
                writer.send([p for frame in held
                             for p in (frame if isinstance(frame, list) else (frame,))])
            else:
                writer.send(b"".join(held))


def configure(sock: socket.socket) -> socket.socket:
    """A blocking socket with Nagle off (answers are a few dozen bytes)."""
    sock.settimeout(None)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return sock


def frame_reader(sock: Any) -> Any:
    """A buffered reader of ``sock`` for ``read_frame``: over a plain
    socket, a file of its descriptor, whose reads are C all the way
    (``makefile``'s ``SocketIO`` runs Python code per read); a TLS socket's
    own ``makefile``.  Only the connection's reader closes the socket,
    after it stopped reading, so the descriptor outlives every read."""
    if isinstance(sock, socket.socket):
        return io.open(sock.fileno(), "rb", buffering=io.DEFAULT_BUFFER_SIZE, closefd=False)
    return sock.makefile("rb")


def read_frame(reader: io.BufferedIOBase, limit: int) -> Optional[bytes]:
    """The next frame's body; ``None`` at a clean end of stream (between
    frames).  ``ValueError`` for an oversized or truncated frame."""
    header = reader.read(lane_frames.HEADER_BYTES)
    if not header:
        return None
    size = lane_frames.frame_length(header, limit)
    body = reader.read(size)
    if len(body) != size:
        raise ValueError(f"connection ended inside a frame ({len(body)} of {size} bytes)")
    return body


def read_frame_into(reader: io.BufferedIOBase, limit: int,
                    take: Optional[Callable[[int], tuple[memoryview, Any]]] = None
                    ) -> Optional[memoryview]:
    """Like :func:`read_frame`, but the body lands in one new buffer from
    the wire pool (wire/arrow_memory.py), with no intermediate copy
    (``readinto`` on a buffered reader passes large reads straight to the
    socket).  The pool neither zero-fills it nor returns its pages to the
    kernel between reads, as a ``bytearray`` of MiBs (a fresh mapping) or
    pyarrow's default mimalloc pool would: each would be faulted in again,
    zero-filled page by page.  ``take(size)``, where given, supplies the
    buffer instead: (a writable view of ``size`` bytes, the object the
    returned body is a view of, which keeps the memory alive)."""
    header = reader.read(lane_frames.HEADER_BYTES)
    if not header:
        return None
    size = lane_frames.frame_length(header, limit)
    view, owner = _body_buffer(size, take)
    _fill(reader.readinto, view, 0, size)
    return memoryview(owner)


def read_frame_lead(reader: io.BufferedIOBase, limit: int, lead_bytes: int
                    ) -> Optional[tuple[int, bytes]]:
    """The next frame's body size and its first ``lead_bytes`` bytes (all
    of a smaller body); ``None`` at a clean end of stream.  The caller
    receives the rest (``fill_by(reader.readinto, ...)``) into memory it
    chooses by what the lead says (a read answer's entries straight into a
    journal record's place: bookie_server/serving/peer_lane.py)."""
    header = reader.read(lane_frames.HEADER_BYTES)
    if not header:
        return None
    size = lane_frames.frame_length(header, limit)
    lead = reader.read(min(size, lead_bytes))
    if len(lead) != min(size, lead_bytes):
        raise ValueError(f"connection ended inside a frame ({len(lead)} of {size} bytes)")
    return size, lead


def fill_by(readinto: Callable[[memoryview], int], view: memoryview, got: int = 0) -> None:
    """``view``, its first ``got`` bytes already there, filled by
    ``readinto`` calls (``ValueError`` when the stream ends first)."""
    _fill(readinto, view, got, len(view))


def _body_buffer(size: int, take: Optional[Callable[[int], tuple[memoryview, Any]]]
                 ) -> tuple[memoryview, Any]:
    """(a writable byte view of ``size`` bytes to receive a frame body into,
    the object that holds it): from ``take`` where given, else a new
    buffer of the wire pool."""
    if take is not None:
        return take(size)
    buf = pa.allocate_buffer(size, memory_pool=wire_pool())
    return memoryview(buf).cast("B"), buf


def _fill(readinto: Any, view: memoryview, got: int, size: int) -> memoryview:
    """``view`` (``size`` bytes, the first ``got`` already there) filled
    by ``readinto`` calls; ``ValueError`` when the stream ends first."""
    while got < size:
        n = readinto(view[got:])
        if not n:
            raise ValueError(f"connection ended inside a frame ({got} of {size} bytes)")
        got += n
    return view


# what one ``recv`` asks for: many small frames (a pipelining client) per call
_RECV_BYTES = 64 << 10


def recv_at_least(sock: Any, n: int) -> bytes:
    """At least ``n`` bytes, with whatever else the same ``recv`` calls
    returned (fewer than ``n`` at the end of stream).  Taking what came
    (a client sends its magic, hello and first frames at once) spares a
    peer that is refused a reset for unread bytes."""
    got = b""
    while len(got) < n:
        more = sock.recv(_RECV_BYTES)
        if not more:
            break
        got += more
    return got


class Backlog:
    """Whether bytes of another frame were already received with the body
    ``frame_bodies`` last yielded (``more``): its receiver may leave work
    it does per frame to the next one (a bookie lets the last add of a
    burst lead the burst's journal group)."""

    __slots__ = ("more",)

    def __init__(self) -> None:
        self.more = False


def frame_bodies(sock: Any, limit: int, first_limit: int, received: bytes = b"",
                 take: Optional[Callable[[int], tuple[memoryview, Any]]] = None,
                 take_min: int = 0, backlog: Optional[Backlog] = None,
                 place: Optional[Callable[[memoryview, int, Callable[[memoryview], int]], Any]]
                 = None) -> Iterator[Any]:
    """The bodies of the frames arriving on ``sock`` (after ``received``,
    bytes of them already read) until a clean end of stream (between
    frames): a frame that one ``recv`` returned alone as a view of it, a
    frame that shared its ``recv`` as ``bytes`` of its own, a frame cut off
    by its ``recv`` received into one buffer of its size (so a body never
    keeps more than itself alive, and a peer sending a frame in many small
    pieces costs one copy of it, not one per piece): from ``take`` (as
    ``read_frame_into``'s) when it is ``take_min`` bytes or more, else from
    the wire pool.  The first frame (a hello) is held to ``first_limit``, the rest
    to ``limit``: ``ValueError`` for a frame over its limit or cut off by
    the end of the stream; a socket error or timeout propagates.  With a
    ``backlog``, its ``more`` says for each body whether the same ``recv``
    brought bytes after it.  ``place(head, size, recv_into)``, where given,
    is offered each such cut-off frame of ``take_min`` bytes or more first:
    it receives the body where it chooses and returns what stands for it
    (yielded as it is), or None to leave it to the above."""
    recv, frame_size, header = sock.recv, lane_frames.frame_size, lane_frames.HEADER_BYTES
    backlog = backlog if backlog is not None else Backlog()
    bound = first_limit
    rest = b""                  # the start of a frame the last recv cut off
    more = received
    while True:
        if not more:
            more = recv(_RECV_BYTES)
            if not more:
                if rest:
                    raise ValueError(
                        f"connection ended inside a frame ({len(rest)} bytes of it)")
                return
        data = rest + more if rest else more
        view, pos, end = memoryview(data), 0, len(data)
        while end - pos >= header:
            size = frame_size(data, pos, bound)
            stop = pos + header + size
            if stop > end:      # cut off: the rest straight into one buffer of its size
                backlog.more = False
                head = view[pos + header:]
                placed = place(head, size, sock.recv_into) \
                    if place is not None and size >= take_min else None
                yield placed if placed is not None else receive_body(
                    sock.recv_into, head, size,
                    take if take is not None and size >= take_min else None)
                bound, pos = limit, end
                break
            # A view keeps all it points into alive for as long as the bookie
            # holds the record (the write cache, until a checkpoint): only a
            # frame that is the whole recv is handed over as a view; a frame
            # that shares its recv is copied out at its own size.
            backlog.more = stop < end
            yield view[header:] if pos == 0 and stop == end else data[pos + header:stop]
            bound, pos = limit, stop
        rest = data[pos:] if pos < end else b""
        more = b""


def receive_body(readinto: Callable[[memoryview], int], head: Any, size: int,
                 take: Optional[Callable[[int], tuple[memoryview, Any]]] = None) -> memoryview:
    """A ``size``-byte frame body that starts with ``head`` (its bytes
    already read), the rest read by ``readinto`` (a socket's ``recv_into``,
    a buffered reader's ``readinto``), in one buffer of the wire pool or
    from ``take`` (as ``read_frame_into``)."""
    view, owner = _body_buffer(size, take)
    view[:len(head)] = head
    _fill(readinto, view, len(head), size)
    return memoryview(owner).cast("B")


def send_parts(sock: socket.socket, parts: list[Any]) -> None:
    """Send every buffer of ``parts``, in order, blocking; large parts are
    sent from where they lie (``sendmsg`` gathers them)."""
    views = [memoryview(p).cast("B") for p in parts if len(p)]
    while views:
        sent = sock.sendmsg(views)
        while views and sent >= len(views[0]):
            sent -= len(views[0])
            views.pop(0)
        if sent:
            views[0] = views[0][sent:]


class FrameWriter:
    def __init__(self, sock: socket.socket, name: str, max_backlog_bytes: int):
        self._sock = sock
        self._name = name
        self._max_backlog = max_backlog_bytes
        self.error: Optional[BaseException] = None
        self._lock = threading.Lock()    # _cond's own lock: send enters it directly (C)
        self._cond = threading.Condition(self._lock)
        self._queue: "collections.deque[memoryview]" = collections.deque()
        self._queued_bytes = 0
        self._sending = False          # the helper thread holds a frame outside the lock
        self._helper: Optional[threading.Thread] = None
        self._closed = False
        self._gathers = isinstance(sock, socket.socket)    # a TlsSocket cannot gather

    @property
    def closed(self) -> bool:
        return self._closed

    def send(self, data: Any) -> bool:
        """Send or queue one frame: one buffer, or a list of buffers whose
        large parts go from where they lie (``sendmsg`` gathers them; over
        TLS they are joined first).  False if the connection is already
        closed (inside ``corked()``: held back, True)."""
        held = _held.frames
        if held is not None:
            held.setdefault(self, []).append(data)
            return True
        if isinstance(data, list):
            if self._gathers:
                return self._send_parts(data)
            data = b"".join(data)
        with self._lock:
            if self._closed:
                return False
            if not self._queue and not self._sending:
                try:
                    sent = self._sock.send(data, _DONTWAIT)
                except BlockingIOError:
                    sent = 0
                except OSError as exc:
                    self._break(exc)
                    return False
                if sent == len(data):
                    return True
                data = memoryview(data)[sent:]
            return self._queue_locked([memoryview(data)])

    def _send_parts(self, parts: list[Any]) -> bool:
        views = [memoryview(p).cast("B") for p in parts if len(p)]
        with self._lock:
            if self._closed:
                return False
            if not self._queue and not self._sending:
                while views:
                    try:
                        sent = self._sock.sendmsg(views[:_IOV_MAX], (), _DONTWAIT)
                    except BlockingIOError:
                        break
                    except OSError as exc:
                        self._break(exc)
                        return False
                    while views and sent >= len(views[0]):
                        sent -= len(views.pop(0))
                    if sent:
                        views[0] = views[0][sent:]
                if not views:
                    return True
            return self._queue_locked(views)

    def _queue_locked(self, views: list[memoryview]) -> bool:
        """Queue what was not sent for the helper thread (lock held)."""
        self._queue.extend(views)
        self._queued_bytes += sum(len(v) for v in views)
        if self._queued_bytes > self._max_backlog:
            self._break(BufferError(f"peer not reading: {self._queued_bytes} bytes queued"))
            return False
        if self._helper is None:
            self._helper = threading.Thread(target=self._drain, name=self._name, daemon=True)
            self._helper.start()
        self._cond.notify()
        return True

    def _drain(self) -> None:
        while True:
            with self._cond:
                while not self._queue and not self._closed:
                    self._cond.wait()
                if self._closed:
                    return
                data = self._queue.popleft()
                self._queued_bytes -= len(data)
                self._sending = True
            try:
                self._sock.sendall(data)
            except OSError as exc:
                with self._cond:
                    self._sending = False
                    self._break(exc)
                return
            with self._cond:
                self._sending = False
                self._cond.notify_all()

    def flush(self, timeout: float) -> bool:
        """Wait until everything queued is sent (True) or the writer closed."""
        with self._cond:
            return self._cond.wait_for(
                lambda: self._closed or (not self._queue and not self._sending), timeout)

    def _break(self, exc: BaseException) -> None:
        """Close for ``exc`` (lock held): the reader sees the end of stream."""
        if not self._closed:
            self.error = exc
            self._close_locked()

    def _close_locked(self) -> None:
        self._closed = True
        self._queue.clear()
        self._queued_bytes = 0
        self._cond.notify_all()
        _shutdown(self._sock)

    def close(self) -> None:
        with self._cond:
            self._close_locked()


def _shutdown(sock: socket.socket) -> None:
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
