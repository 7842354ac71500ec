"""Bookie end of the add lane and its read connections (protocol:
pybk_spark/wire/lane_frames.py).

Theory of operation
-------------------
A listening socket of its own (``add_lane_port``), one thread per accepted
connection.  That thread checks the connection's magic and that the client
means this bookie (the hello frame holds the bookie id it wants; another id
is refused like a malformed frame, below), then reads frames and hands each
AddRequest to ``BookieService.submit_add`` (an entry frame to
``submit_entry``) in arrival order,
which is what makes the journal order of one connection its send order.

* Frames are read by ``frame_bodies`` (wire/frame_socket.py): a lone add
  that arrives alone is a view of the bytes its ``recv`` returned, so it
  costs one C call to receive and no copy until its record is written
  (frames that share a ``recv`` are copied out at their own size: a record
  held in the write cache keeps only itself alive); the magic is read
  with whatever arrived with it, which ``frame_bodies`` starts from.
  An AddRequest frame of ``_POOLED_FRAME_MIN`` bytes or more (a batch)
  whose first ``recv`` holds its other fields is received apart from its
  entries: they land in a journal ``RecordSpace`` (``_place_add``; from
  ``direct_buffers.LANE_BATCHES``, since the write cache holds them), the
  place the journal frames and writes them from, as a pull's answers do
  (serving/peer_lane.py), so the journal neither copies them nor the
  pages they land in are new.  Any other frame of that size is received
  into a buffer of ``direct_buffers.ANSWER_BUFFERS``, which the pool takes
  back when the write cache lets go of it: the next ones land in pages
  already faulted in (in the wire pool every received byte of a stream of
  4 MiB batches faulted in a new page: about a third of a bookie's CPU on
  a Spark write; docs/performance.md, (6)).

* A connection thread that leads each add it reads (an idle journal) would
  give a pipelining client, whose adds queue on the socket meanwhile, one
  fdatasync per add.  So who leads a frame's add is the journal's ``Lead``
  passed to ``submit_entry`` / ``submit_add``, chosen by whether more of
  the stream is behind it (``frame_socket.Backlog``: frames that queued
  while the thread was busy).  A lone add with more behind it only queues
  in the journal (``Lead.LATER``), and the burst's last add leads them all
  as one group.  A batch with more behind it goes to the journal's writer
  thread (``Lead.WRITER``, woken as the batch queues), which writes it
  while this thread reads on: a batch's group is big enough that this
  thread, leading it, would leave the socket unread for a while.  The last
  frame of a burst is led by this thread (``Lead.NOW``).  Whatever became
  of the frames after a lone add it queued (a batch, a refusal, the end of
  the stream), the thread leads what it left queued once nothing more is
  received, before it waits for a free add slot and before it refuses a
  malformed frame.

* Answers are sent by whichever thread completes the add: the connection
  thread itself when the journal's leader path makes the add durable inline
  (an idle journal: no thread hand-off at all; the answer leaves the moment
  the entry is applied, and the journal's metrics and page-cache advice come
  after it), otherwise the journal's completion callback.  ``FrameWriter``
  never blocks that thread: an answer that does not fit the socket buffer
  is queued for a helper thread, and a client whose unread answers pass
  ``_MAX_UNREAD_ANSWER_BYTES`` is cut off.
* At most ``max_inflight_per_stream`` adds of a connection are unanswered;
  the connection thread waits for a slot before reading on, so a fast
  client is held back by TCP, not buffered without bound.
* An entry frame that succeeds is answered with a compact entry answer
  (wire/lane_frames.py), built without protobuf; errors and AddRequest
  answers are ``AddResponse`` messages.
* A frame over the bookie's message limit or a request that does not parse
  gets an answer with request_id 0 and the BAD_REQUEST code, then the
  connection is closed: after a framing error nothing later on it can be
  trusted.  The adds before that frame are answered too, before or after
  that answer (the drain below).  Nothing a client sends can stop the
  bookie.
* When the client stops sending (or the connection breaks), the adds it
  already submitted are still answered, for at most ``_DRAIN_S``, before the
  connection is closed.
* Each connection holds a thread, so at most ``lane_max_connections`` are
  open (more are closed at accept, counted as refused), and a connection
  that has not sent its magic and hello within ``lane_hello_timeout_s`` is
  closed.  After the hello nothing is timed: an idle client connection is
  the client's to close (it closes idle ones itself).
* TLS (``tls``, bookie_server/serving/tls.py): the connection thread first runs
  the TLS handshake (wire/tls_socket.py) with the context current at that
  moment (a SIGHUP reload serves the next connection), within the same
  ``lane_hello_timeout_s`` as the hello: a handshake that never completes,
  garbage instead of a ClientHello, a plaintext client or a certificate the
  CA does not vouch for closes the connection (counted as refused) and
  frees its thread.  The peer's identities (its certificate) go with every
  request to the role check of protocol/access.py.
* A read connection (``READ_MAGIC``) is served by its thread alone: read a
  ReadRequest, answer it through ``BookieService.read_answer`` (the same
  code, codes and metrics as gRPC's ``ReadEntries``), send the answer whole,
  read the next.  The answer goes out as the buffers of its IPC stream with
  one gathering send; a pull's answer of several stored batches is sent
  from the buffers they were read into (``wire.entry_parts.rows_parts``), with
  no join.  A malformed request is refused like a malformed add.
"""
from __future__ import annotations

import logging
import queue
import socket
import ssl
import threading
import time
from typing import TYPE_CHECKING, Callable, Iterator, Optional, cast

from google.protobuf.message import DecodeError

from bookie_server.config import BookieConfig
from bookie_server.direct_buffers import ANSWER_BUFFERS, LANE_BATCHES
from bookie_server.journal.direct_write import RecordSpace, receive_into_space
from bookie_server.journal.journal import Lead
from bookie_server.serving.tls import cert_peer
from pybk_spark.protocol import access
from pybk_spark.wire.frame_socket import (Backlog, FrameWriter, configure, frame_bodies,
                                           recv_at_least, send_parts)
from pybk_spark.wire import framing
from pybk_spark.wire import lane_frames
from pybk_spark.wire import bookie_wire_pb2 as pb
from pybk_spark.wire.entry_parts import rows_parts
from pybk_spark.wire.framing import parse_add_request
from pybk_spark.wire.tls_socket import TlsSocket, handshake

if TYPE_CHECKING:
    from bookie_server.serving.service import BookieService
    from bookie_server.serving.tls import ServerTls

log = logging.getLogger("bookie.add_lane")

# a connection's free add slots, one token each: taking and giving one back
# are single C calls, where a semaphore's acquire and release are Python
# code around a condition variable, and every add does both
Slots = queue.SimpleQueue[None]

_MAX_UNREAD_ANSWER_BYTES = 16 << 20
_SLOT_WAIT_S = 1.0
_DRAIN_S = 5.0
_MAX_ID_BYTES = 4096
_MAX_READ_REQUEST_BYTES = 64 << 10     # a ReadRequest is a few dozen bytes and a key
# an add frame this big is received into a pooled buffer (module docstring)
_POOLED_FRAME_MIN = 1 << 20


class PlacedAdd:
    """An AddRequest frame received apart: its fields other than the
    entries (``head``), and the journal record space the entries were
    received into (``_place_add``)."""
    __slots__ = ("head", "space")

    def __init__(self, head: bytes, space: RecordSpace) -> None:
        self.head, self.space = head, space


def _place_add(head: memoryview, size: int, recv_into: Callable[[memoryview], int]
               ) -> Optional[PlacedAdd]:
    """``frame_bodies``' ``place`` for the add lane: an AddRequest frame of
    ``size`` bytes, ``head`` its first ones, whose entries' key and length
    lie within ``head``, received with its entries in a ``RecordSpace``;
    None for any other frame (an entry frame, a message cut otherwise)."""
    if lane_frames.is_entry_frame(head):
        return None
    placed = receive_into_space(head, size, recv_into, pool=LANE_BATCHES)
    if placed is None:
        return None
    rest, space = placed
    return PlacedAdd(bytes(rest), space)


def bind_listener(cfg: BookieConfig) -> socket.socket:
    """The add lane's listening socket on ``add_lane_port`` (OSError if taken)."""
    family = socket.AF_INET6 if ":" in cfg.bind_address else socket.AF_INET
    return socket.create_server((cfg.bind_address, cfg.add_lane_port), family=family,
                                backlog=128)


class AddLaneServer:
    def __init__(self, service: BookieService, cfg: BookieConfig,
                 listener: socket.socket | None = None, tls: Optional[ServerTls] = None) -> None:
        self.service = service
        self.bookie_id = service.bookie_id.encode()
        self.metrics = service.m
        self.limit = cfg.grpc_message_limit()
        self.max_inflight = max(1, cfg.max_inflight_per_stream)
        self.max_connections = cfg.lane_max_connections
        self.hello_timeout_s = cfg.lane_hello_timeout_s
        self.tls = tls
        self._listener = listener if listener is not None else bind_listener(cfg)
        self.port = self._listener.getsockname()[1]
        self._lock = threading.Lock()
        self._connections: set[socket.socket | TlsSocket] = set()     # plain or TLS sockets
        self._stopped = threading.Event()
        self._acceptor = threading.Thread(target=self._accept_loop, name="add-lane-accept",
                                          daemon=True)

    def start(self) -> "AddLaneServer":
        self._acceptor.start()
        return self

    def _accept_loop(self) -> None:
        while not self._stopped.is_set():
            try:
                conn, peer = self._listener.accept()
            except OSError as exc:
                if self._stopped.is_set():
                    return
                log.warning("event=add_lane_accept_failed error=%r", exc)
                self._stopped.wait(0.05)
                continue
            with self._lock:
                if self._stopped.is_set():
                    conn.close()
                    return
                full = len(self._connections) >= self.max_connections
                if not full:
                    self._connections.add(conn)
                    self.metrics.lane_connections.set(len(self._connections))
            if full:                      # each connection holds a thread: refuse, never queue
                self.metrics.lane_refused.inc()
                log.warning("event=add_lane_full peer=%s max_connections=%d", peer,
                            self.max_connections)
                conn.close()
                continue
            threading.Thread(target=self._serve, args=(conn, peer), daemon=True,
                             name="add-lane-conn").start()

    def _handshake(self, tls: ServerTls, raw: socket.socket, peer: object
                   ) -> Optional[tuple[TlsSocket, access.Peer]]:
        """The TLS connection over ``raw`` and who is on the other end; None
        (the connection closed, the refusal counted) when the handshake fails."""
        try:
            conn = handshake(raw, tls.lane_context(), server_side=True,
                             timeout=self.hello_timeout_s)
        except TimeoutError:
            why = f"no TLS handshake within lane_hello_timeout_s = {self.hello_timeout_s}"
        except (ssl.SSLError, OSError, ValueError) as exc:
            why = f"TLS handshake failed: {exc}"
        else:
            with self._lock:
                self._connections.discard(raw)
                self._connections.add(conn)
            return conn, cert_peer(conn.getpeercert())
        self.metrics.lane_refused.inc()
        log.info("event=add_lane_tls_refused peer=%s reason=%s", peer, why)
        with self._lock:
            self._connections.discard(raw)
            self.metrics.lane_connections.set(len(self._connections))
        raw.close()
        return None

    def _serve(self, conn: socket.socket, peer: object) -> None:
        who = access.ANONYMOUS
        started = time.monotonic()
        if self.tls is not None:
            done = self._handshake(self.tls, conn, peer)
            if done is None:
                return
            conn, who = cast(socket.socket, done[0]), done[1]    # TlsSocket: a socket's duck type
        writer = FrameWriter(configure(conn), "add-lane-answers", _MAX_UNREAD_ANSWER_BYTES)
        slots: Slots = queue.SimpleQueue()
        for _ in range(self.max_inflight):
            slots.put(None)
        answer_cls: type[pb.AddResponse] | type[pb.ReadResponse] = pb.AddResponse

        def refuse(message: str) -> None:
            self.metrics.lane_refused.inc()
            log.info("event=add_lane_refused peer=%s reason=%s", peer, message)
            writer.send(lane_frames.frame(answer_cls(
                code=pb.BAD_REQUEST, message=message,
                request_id=lane_frames.CONNECTION_REQUEST_ID).SerializeToString()))

        try:
            # a silent connection must not hold a thread (the handshake counts)
            conn.settimeout(max(0.001, self.hello_timeout_s - (time.monotonic() - started)))
            received = recv_at_least(conn, len(lane_frames.MAGIC))
            magic = received[:len(lane_frames.MAGIC)]
            if magic not in lane_frames.MAGICS:
                self.metrics.lane_refused.inc()
                log.info("event=add_lane_bad_magic peer=%s", peer)
                return
            reads = magic == lane_frames.READ_MAGIC
            if reads:
                answer_cls = pb.ReadResponse
            backlog = Backlog()
            frames = frame_bodies(conn, _MAX_READ_REQUEST_BYTES if reads else self.limit,
                                  _MAX_ID_BYTES, received[len(magic):],
                                  take=None if reads else ANSWER_BUFFERS.take,
                                  take_min=_POOLED_FRAME_MIN, backlog=backlog,
                                  place=None if reads else _place_add)
            try:
                wanted = next(frames, None)
            except ValueError as exc:
                refuse(f"malformed add lane hello: {exc}")
                return
            if wanted is None:
                return
            if wanted != self.bookie_id:
                refuse(f"this is bookie {self.bookie_id.decode(errors='replace')}, "
                       f"not {bytes(wanted).decode(errors='replace')}")
                return
            conn.settimeout(None)
            if reads:
                self._serve_reads(conn, frames, refuse, who)
            else:
                self._serve_adds(frames, backlog, writer, slots, refuse, who)
        except TimeoutError:              # only the hello is timed
            self.metrics.lane_refused.inc()
            log.info("event=add_lane_hello_timeout peer=%s", peer)
        except OSError as exc:            # reset by the client, shut down by stop()
            log.debug("event=add_lane_connection_error peer=%s error=%r", peer, exc)
        except Exception:                 # noqa: BLE001 - never let a request kill the bookie
            log.exception("event=add_lane_unexpected_error peer=%s", peer)
        finally:
            if isinstance(writer.error, BufferError):
                self.metrics.lane_refused.inc()
                log.info("event=add_lane_cut peer=%s reason=%s", peer, writer.error)
            self._finish(conn, writer, slots)

    def _serve_adds(self, frames: Iterator[bytes | memoryview], backlog: Backlog,
                    writer: FrameWriter, slots: Slots, refuse: Callable[[str], None],
                    who: access.Peer) -> None:
        send, release, take = writer.send, slots.put, slots.get
        submit_entry, parse_entry = self.service.submit_entry, lane_frames.parse_entry_frame
        submit_add, lead_journal = self.service.submit_add, self.service.lead_journal
        stopped, entry_kind = self._stopped.is_set, lane_frames.ENTRY_KIND

        def respond(answer: bytes) -> None:
            release(None)
            send(answer)

        def respond_add(resp: pb.AddResponse) -> None:
            respond(lane_frames.frame(resp.SerializeToString()))

        owed = False            # lone adds queued for this thread to lead (module docstring)
        try:
            while not stopped():
                try:
                    body = next(frames, None)
                    if body is None:
                        return
                    space = None
                    if isinstance(body, PlacedAdd):     # a batch, its entries in the journal's place
                        space = body.space
                        req = framing.parse_head(pb.AddRequest, body.head, space.body())
                    elif body and body[0] == entry_kind:   # ``is_entry_frame``, inline: a lone add
                        req = None
                        request_id, recovery, key, record = parse_entry(body)
                    else:
                        req = parse_add_request(body)
                except ValueError as exc:
                    if owed:                # the adds before the bad frame: led, not left waiting
                        lead_journal()
                        owed = False
                    refuse(f"malformed add lane frame: {exc}")
                    return
                if owed and slots.empty():      # the slots wait for the adds queued
                    lead_journal()
                    owed = False
                try:                        # a free slot, the common case, with no loop around it
                    take(True, _SLOT_WAIT_S)
                except queue.Empty:
                    if not self._wait_slot(take, writer):
                        return
                more = backlog.more
                if req is None:
                    answer = submit_entry(request_id, recovery, key, record, respond, who,
                                          Lead.LATER if more else Lead.NOW)
                    if answer:                      # refused on this thread: the slot is free again
                        release(None)
                        send(answer)
                    if more:                # this thread leads it with the rest of the burst
                        owed = True
                else:                       # with more behind it, the writer thread writes it
                    submit_add(req, respond_add, who, Lead.WRITER if more else Lead.NOW, space)
                if owed and not more:       # the burst's last frame: lead what this thread queued
                    lead_journal()
                    owed = False
        finally:
            if owed:
                lead_journal()

    def _wait_slot(self, take: Callable[[bool, float], None], writer: FrameWriter) -> bool:
        """Wait for a free add slot; False once the connection or the server
        is closing."""
        while not (writer.closed or self._stopped.is_set()):
            try:
                take(True, _SLOT_WAIT_S)
                return True
            except queue.Empty:
                pass
        return False

    def _serve_reads(self, conn: socket.socket, frames: Iterator[bytes | memoryview],
                     refuse: Callable[[str], None], who: access.Peer) -> None:
        """One read at a time, in arrival order; each answer is sent whole
        (blocking: this thread has nothing else to do) before the next
        request is read, so a client that stops reading holds back only its
        own connection.  The entries go out from the buffer the bookie
        encoded them into."""
        while not self._stopped.is_set():
            try:
                body = next(frames, None)
                if body is None:
                    return
                req = pb.ReadRequest.FromString(bytes(body))     # a few dozen bytes
            except (ValueError, DecodeError) as exc:
                refuse(f"malformed read lane frame: {exc}")
                return
            self._answer_read(conn, req, who)

    def _answer_read(self, conn: socket.socket, req: pb.ReadRequest, who: access.Peer) -> None:
        """Read and send one answer.  Its buffers go back to their pool when
        this returns, before the connection waits for its next request: the
        next answer then takes the same pages, and a connection kept open
        idle (a pull's reader, serving/peer_pool.py) holds none."""
        head, batch = self.service.read_answer(req, who)
        if batch is None:
            send_parts(conn, lane_frames.frame_parts(head.SerializeToString()))
        else:
            ipc = rows_parts(batch)
            prefix = framing.payload_prefix(head, sum(len(p) for p in ipc))
            send_parts(conn, lane_frames.frame_parts(*prefix, *ipc))

    def _finish(self, conn: socket.socket, writer: FrameWriter, slots: Slots) -> None:
        """The client stopped sending (or broke off): answer the adds already
        submitted, at most ``_DRAIN_S`` long, then close."""
        deadline = time.monotonic() + _DRAIN_S
        for _ in range(self.max_inflight):
            if writer.closed:
                break
            try:
                slots.get(True, max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                break
        writer.flush(max(0.0, deadline - time.monotonic()))
        writer.close()
        with self._lock:
            self._connections.discard(conn)
            self.metrics.lane_connections.set(len(self._connections))
        conn.close()

    def stop(self) -> None:
        self._stopped.set()
        try:
            self._listener.close()
        except OSError:
            pass
        with self._lock:
            conns, self._connections = list(self._connections), set()
        for conn in conns:
            try:
                conn.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
