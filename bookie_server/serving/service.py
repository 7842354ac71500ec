"""gRPC shell around the Bookie core: requests in, core calls, codes out.

Every handler catches every exception and answers with the code chosen by
``pybk_spark.wire.codes.error_to_code`` - a request can never crash the
server.  AddStream answers lone adds on its own thread while the journal's
leader path makes each durable inline, and otherwise is pipelined: a reader
thread submits each request as it arrives (bounded by
``max_inflight_per_stream``) and responses are streamed back as their
journal groups become durable, matched by request_id.

With TLS (bookie_server/serving/tls.py) every request is first checked against the
roles of protocol/access.py, the peer known by its client certificate
(``context.auth_context()``; the lane passes the peer of its connection):
a peer with no role gets ``UNAUTHORIZED``; an operator's recovery add or
fence with the empty key skips the master-key check (``keyless``).
"""
from __future__ import annotations

import logging
import queue
import threading
import time
from concurrent import futures
from typing import TYPE_CHECKING, Callable, Hashable, Iterator, Optional, Union, cast

import grpc

from bookie_server.serving import pull
from bookie_server.serving.peer_lane import LanePeerReader
from bookie_server.serving.lane_server import AddLaneServer
from bookie_server.bookie import Bookie
from bookie_server.config import BookieConfig
from bookie_server.journal.direct_write import RecordSpace
from bookie_server.journal.journal import Lead
from bookie_server.serving.peer_client import PeerReader, credentials_of, peer_tls_files
from bookie_server.serving.peer_pool import PeerReaders, Reader
from bookie_server.serving.tls import grpc_peer, policy_of
from bookie_server.storage.entry_store import answer_batch
from pybk_spark import errors
from pybk_spark.protocol import access
from pybk_spark.wire import bookie_wire_pb2 as pb
from pybk_spark.wire import bookie_wire_pb2_grpc as pb_grpc
from pybk_spark.wire import framing, lane_frames
from pybk_spark.wire.codes import READ_END_CODES, error_to_code
from pybk_spark.wire.entries import Record, batch_to_buffer

if TYPE_CHECKING:
    import socket

    import pyarrow as pa

    from bookie_server.journal.journal_format import Position
    from bookie_server.serving.tls import ServerTls

# an add as the request deserializer hands it over (pybk_spark/wire/framing.py)
AddMessage = Union[pb.AddRequest, framing.Framed, framing.Malformed]

log = logging.getLogger("bookie.service")

PROTOCOL_VERSION = 1
_DONE = object()
_LEAD = object()     # an AddStream's reader queued adds for its handler thread to lead
# what ``submit_entry`` returns for an add its ``done`` has answered already
ANSWERED = b""


def _code(exc: BaseException, op: str) -> tuple[int, str]:
    code, msg = error_to_code(exc)
    if code == pb.BAD_REQUEST and not hasattr(exc, "code"):
        log.exception("event=unexpected_error op=%s", op)
    return code, msg


# the generated servicer module has no type information (pyproject.toml: follow_imports = skip)
class BookieService(pb_grpc.BookieServicer):  # type: ignore[misc]
    def __init__(self, bookie: Bookie, cfg: BookieConfig, bookie_id: str):
        self.bookie = bookie
        self.cfg = cfg
        self.bookie_id = bookie_id
        self.m = bookie.metrics
        self._hot = self.m.hot          # the add path's metrics (serving/metrics.py)
        self.policy = policy_of(cfg)
        self.peers = PeerReaders()      # the readers of peers this bookie pulls from

    def close(self) -> None:
        """Close the peer readers kept idle for the next pull
        (serving/peer_pool.py); a reader still in a pull is closed when the
        pull gives it back.  The bookie's stop calls it once the server
        stopped: no connection to a peer outlives the service."""
        self.peers.close()

    def peer(self, context: grpc.ServicerContext) -> access.Peer:
        """Who sent a gRPC request (anonymous without TLS: not looked up)."""
        return grpc_peer(context) if self.policy.tls else access.ANONYMOUS

    def authorize(self, peer: access.Peer, op: str, key: bytes = b"x") -> bool:
        """Unauthorized unless ``peer`` may do ``op``; True for the key-less path."""
        if not self.policy.tls:
            return False
        return access.check(self.policy, peer, op, key)

    # -- adds ---------------------------------------------------------------------------
    def submit_add(self, req: AddMessage,
                   done: Callable[[pb.AddResponse], None],
                   peer: access.Peer = access.ANONYMOUS, lead: Lead = Lead.NOW,
                   space: Optional[RecordSpace] = None) -> None:
        """Submit one add; ``done(response)`` is called exactly once.
        ``lead``: who writes it (``RequestHandlers.add_async``):
        ``Lead.NOW``, this thread; ``Lead.LATER``, the caller's next
        ``lead_journal``; ``Lead.WRITER``, the journal's writer thread.
        ``space``: the journal record space its entries were received into
        (the add lane's large frames), framed where they lie."""
        t0 = time.perf_counter()
        if isinstance(req, framing.Malformed):     # an AddStream message that did not parse
            self._hot.add_error()
            done(pb.AddResponse(code=pb.BAD_REQUEST, message=req.error))
            return
        try:
            keyless = self.authorize(peer, "recovery_add" if req.recovery else "add",
                                     req.master_key)
            fut, first, last = self.bookie.add_async(req.ledger_id, req.master_key,
                                                     req.entries, req.recovery, keyless,
                                                     space=space, lead=lead)
        except BaseException as exc:  # noqa: BLE001 - a request never kills the bookie
            code, msg = _code(exc, "add")
            self._hot.add_error()
            done(pb.AddResponse(code=code, message=msg, ledger_id=req.ledger_id,
                                request_id=req.request_id))
            return
        nbytes = len(req.entries)

        def finished(f: futures.Future[Position]) -> None:
            exc = f.exception()
            if exc is not None:
                code, msg = _code(exc, "add")
                self._hot.add_error()
                done(pb.AddResponse(code=code, message=msg, ledger_id=req.ledger_id,
                                    request_id=req.request_id))
                return
            self._hot.add_ok(last - first + 1, nbytes, time.perf_counter() - t0)
            done(pb.AddResponse(code=pb.OK, ledger_id=req.ledger_id, first_entry_id=first,
                                last_entry_id=last, request_id=req.request_id))

        fut.add_done_callback(finished)

    def submit_entry(self, request_id: int, recovery: bool, master_key: bytes, record: Record,
                     done: Callable[[bytes], None],
                     peer: access.Peer = access.ANONYMOUS, lead: Lead = Lead.NOW) -> Optional[bytes]:
        """Submit a lone add as its entry record (a lane entry frame:
        wire/lane_frames.py); ``done(framed answer)`` is called exactly once,
        or the answer is returned.  Made durable on this thread (an idle
        journal), the add is answered through ``done`` the moment it is
        applied, before the journal's bookkeeping, and ``ANSWERED`` is
        returned; refused, the framed refusal is returned; otherwise None,
        and ``done`` is called later.  An OK answer is an entry answer
        (``lane_frames.entry_answer``), an error an ``AddResponse``.
        ``lead``: as ``submit_add``'s; ``Lead.LATER`` where the connection
        holds more adds already (the add queues for the group its last add
        leads: ``RequestHandlers.add_entry``, ``lead_journal``)."""
        t0 = time.perf_counter()

        def applied(ledger_id: int, entry_id: int) -> None:
            done(lane_frames.entry_answer(request_id, ledger_id, entry_id))
        try:
            keyless = self.policy.tls and self.authorize(
                peer, "recovery_add" if recovery else "add", master_key)
            fut, ledger_id, entry_id = self.bookie.add_entry(record, master_key, recovery,
                                                             keyless, applied, lead)
        except BaseException as exc:  # noqa: BLE001 - a request never kills the bookie
            return self._entry_refused(exc, request_id)
        if fut is None:
            self._hot.add_ok(1, len(record), time.perf_counter() - t0)
            return ANSWERED

        def finished(f: futures.Future[Position]) -> None:
            exc = f.exception()
            if exc is not None:
                done(self._entry_refused(exc, request_id, ledger_id))
                return
            self._hot.add_ok(1, len(record), time.perf_counter() - t0)
            done(lane_frames.entry_answer(request_id, ledger_id, entry_id))

        fut.add_done_callback(finished)
        return None

    def lead_journal(self) -> None:
        """Write and sync what the journal holds queued, on this thread if
        it is idle (the adds a connection submitted with ``Lead.LATER``)."""
        self.bookie.journal.lead()

    def _entry_refused(self, exc: BaseException, request_id: int, ledger_id: int = 0) -> bytes:
        code, msg = _code(exc, "add")
        self._hot.add_error()
        return lane_frames.frame(pb.AddResponse(code=code, message=msg, ledger_id=ledger_id,
                                                request_id=request_id).SerializeToString())

    def AddEntries(self, request: AddMessage, context: grpc.ServicerContext) -> pb.AddResponse:
        box: "queue.Queue[pb.AddResponse]" = queue.Queue(1)
        try:
            self.submit_add(request, box.put, self.peer(context))
            return box.get()
        except BaseException as exc:  # noqa: BLE001 - a request never kills the bookie
            code, msg = _code(exc, "add")
            return pb.AddResponse(code=code, message=msg, request_id=request.request_id)

    def AddStream(self, request_iterator: Iterator[AddMessage], context: grpc.ServicerContext
                  ) -> Iterator[pb.AddResponse]:
        """A reader thread receives each add and queues it in the journal
        without leading it (``Lead.LATER``); this handler thread leads the
        journal for what is queued and sends the answers as their groups
        become durable.  While this thread writes and syncs one group, the
        adds that reach the stream meanwhile queue for the next: one
        fdatasync per group, however many of a client's threads share the
        stream, where a handler that received, led and answered each add
        in turn would give a client's queued adds an idle journal one at a
        time, one fdatasync per add.  The reader wakes this thread with one
        ``_LEAD`` per burst, not per add, and this thread leads the burst
        with one ``lead_journal``.  Answers go out before the next group is
        led, in completion order, each with its request_id."""
        out: queue.SimpleQueue[object] = queue.SimpleQueue()   # answers, _LEAD, then _DONE
        slots = threading.BoundedSemaphore(max(1, self.cfg.max_inflight_per_stream))
        pending = [0]                  # submitted, not yet sent back
        lock = threading.Lock()
        # set by the reader when it puts a _LEAD, cleared by this thread just
        # before it leads: while it is set, a lead is coming that covers every
        # add queued so far, so the reader puts no other _LEAD
        lead_pending = threading.Event()
        peer = self.peer(context)

        def respond(resp: pb.AddResponse) -> None:
            slots.release()
            out.put(resp)

        def reader() -> None:
            try:
                for req in request_iterator:
                    slots.acquire()
                    with lock:
                        pending[0] += 1
                    self.submit_add(req, respond, peer, Lead.LATER)
                    # No lock beyond the Event's: only this thread sets the
                    # flag, only the handler clears it, and the handler
                    # clears it after taking this thread's _LEAD and before
                    # calling lead_journal.  The add is queued before the
                    # flag is read, so either the flag is clear (this thread
                    # sets it and puts a _LEAD: a lead follows) or it is set
                    # and not yet cleared, so the lead that follows its
                    # clearing comes after this add was queued and covers it.
                    if not lead_pending.is_set():
                        lead_pending.set()
                        out.put(_LEAD)
            except BaseException as exc:  # noqa: BLE001 - client went away / cancelled
                if context.is_active():
                    log.debug("event=add_stream_reader_error error=%r", exc)
            finally:
                out.put(_DONE)

        threading.Thread(target=reader, name="add-stream-reader", daemon=True).start()
        owed = reader_done = False
        try:
            while True:
                with lock:
                    if reader_done and pending[0] == 0:
                        return
                try:
                    item = out.get_nowait()
                except queue.Empty:
                    if owed:                 # every answer ready is sent: lead the next group
                        owed = False
                        lead_pending.clear()     # before leading (the reader's comment)
                        self.lead_journal()
                        continue
                    item = out.get()
                if item is _LEAD:
                    owed = True
                    continue
                if item is _DONE:
                    reader_done = True
                    continue
                with lock:
                    pending[0] -= 1
                yield cast(pb.AddResponse, item)     # everything else put is an answer
        finally:          # the stream ended or was cancelled: nothing it queued waits
            self.lead_journal()

    # -- reads ----------------------------------------------------------------------------
    def ReadEntries(self, request: pb.ReadRequest, context: grpc.ServicerContext) -> Union[pb.ReadResponse, bytes]:
        head, batch = self.read_answer(request, self.peer(context))
        if batch is None:
            return head
        # pre-framed: see pybk_spark/wire/framing.py
        return framing.with_payload(head, batch_to_buffer(answer_batch(batch)))

    def read_answer(self, request: pb.ReadRequest, peer: access.Peer = access.ANONYMOUS
                    ) -> tuple[pb.ReadResponse, Optional[pa.RecordBatch | pa.Table]]:
        """(ReadResponse without its entries, the entries as a record batch or
        None): the answer to a read, for gRPC's ``ReadEntries`` and for a
        read lane connection, which encodes the batch itself."""
        t0 = time.perf_counter()
        try:
            keyless = self.authorize(peer, "fence" if request.fence else "read",
                                     request.master_key)
            res = self.bookie.read(request.ledger_id, request.first_entry_id,
                                   request.last_entry_id, max_entries=request.max_entries,
                                   max_bytes=request.max_bytes, fence=request.fence,
                                   master_key=request.master_key, sparse=request.sparse,
                                   stripe=((request.stripe_ensemble, request.stripe_slot)
                                           if request.stripe_ensemble else None),
                                   keyless=keyless)
            self.m.read_requests.labels("ok").inc()
            self.m.read_entries.inc(res.batch.num_rows)
            self.m.read_latency.observe(time.perf_counter() - t0)
            return (pb.ReadResponse(code=pb.OK, end=READ_END_CODES[res.end], lac=res.lac,
                                    fenced=res.fenced, request_id=request.request_id), res.batch)
        except BaseException as exc:  # noqa: BLE001 - a request never kills the bookie
            code, msg = _code(exc, "read")
            self.m.read_requests.labels("error").inc()
            lac, fenced = -1, False
            try:
                r = self.bookie.lac_of(request.ledger_id)
                lac, fenced = r.lac, r.fenced
            except BaseException:  # noqa: BLE001 - the error answer goes out regardless
                pass
            return (pb.ReadResponse(code=code, message=msg, end=pb.MISSING, lac=lac, fenced=fenced,
                                    request_id=request.request_id), None)

    def ReadLac(self, request: pb.ReadLacRequest, context: grpc.ServicerContext) -> pb.ReadLacResponse:
        try:
            peer = self.peer(context)
            keyless = self.authorize(peer, "fence" if request.fence else "read",
                                     request.master_key)
            r = self.bookie.read_lac(request.ledger_id, fence=request.fence,
                                     master_key=request.master_key,
                                     wait_for_lac_above=request.wait_for_lac_above,
                                     timeout_s=request.timeout_ms / 1000.0, keyless=keyless)
            key = (self.bookie.master_key_of(request.ledger_id)
                   if access.may_learn_key(self.policy, peer, request.master_key, request.fence)
                   else b"")
            return pb.ReadLacResponse(code=pb.OK, lac=r.lac, last_entry_id=r.last_entry_id,
                                      fenced=r.fenced, master_key=key)
        except BaseException as exc:  # noqa: BLE001 - a request never kills the bookie
            code, msg = _code(exc, "read_lac")
            return pb.ReadLacResponse(code=code, message=msg, lac=-1, last_entry_id=-1)

    def Fence(self, request: pb.FenceRequest, context: grpc.ServicerContext) -> pb.FenceResponse:
        try:
            keyless = self.authorize(self.peer(context), "fence", request.master_key)
            r = self.bookie.fence(request.ledger_id, request.master_key, keyless)
            return pb.FenceResponse(code=pb.OK, lac=r.lac, last_entry_id=r.last_entry_id)
        except BaseException as exc:  # noqa: BLE001 - a request never kills the bookie
            code, msg = _code(exc, "fence")
            return pb.FenceResponse(code=code, message=msg, lac=-1, last_entry_id=-1)

    def WriteLac(self, request: pb.WriteLacRequest, context: grpc.ServicerContext) -> pb.WriteLacResponse:
        try:
            self.authorize(self.peer(context), "write_lac", request.master_key)
            self.bookie.write_lac(request.ledger_id, request.master_key, request.lac)
            return pb.WriteLacResponse(code=pb.OK)
        except BaseException as exc:  # noqa: BLE001 - a request never kills the bookie
            code, msg = _code(exc, "write_lac")
            return pb.WriteLacResponse(code=code, message=msg)

    # -- info -------------------------------------------------------------------------------
    def GetBookieInfo(self, request: pb.BookieInfoRequest, context: grpc.ServicerContext
                      ) -> pb.BookieInfoResponse:
        try:
            self.authorize(self.peer(context), "info")
            free, total = self.bookie.disk_usage()
            return pb.BookieInfoResponse(
                code=pb.OK, bookie_id=self.bookie_id, free_bytes=free, total_bytes=total,
                state=pb.READ_ONLY_STATE if self.bookie.read_only else pb.WRITABLE,
                ledger_count=len(self.bookie.ledger_ids()),
                entry_count=self.bookie.store.entry_count(), protocol_version=PROTOCOL_VERSION)
        except BaseException as exc:  # noqa: BLE001 - a request never kills the bookie
            code, msg = _code(exc, "info")
            return pb.BookieInfoResponse(code=code, message=msg, bookie_id=self.bookie_id)

    def ListLedgers(self, request: pb.ListLedgersRequest, context: grpc.ServicerContext
                    ) -> pb.ListLedgersResponse:
        try:
            self.authorize(self.peer(context), "info")
            return pb.ListLedgersResponse(code=pb.OK, ledger_ids=self.bookie.ledger_ids())
        except BaseException as exc:  # noqa: BLE001 - a request never kills the bookie
            code, msg = _code(exc, "list")
            return pb.ListLedgersResponse(code=code, message=msg)

    # -- bookie-to-bookie re-replication ---------------------------------------------------
    def _peer_reader(self, request: pb.PullRequest) -> tuple[Hashable, Callable[[], Reader]]:
        """(key, maker) of the reader a pull reads its peer with
        (serving/peer_pool.py): the peer's read lane when it registered one
        and the bookies talk plaintext (serving/peer_lane.py: a third of
        gRPC's CPU per byte), else its gRPC ``ReadEntries``."""
        bookie_id = request.source_bookie_id or request.source_address
        limit = self.cfg.grpc_message_limit()
        if request.source_lane_address and request.source_bookie_id and not self.policy.tls:
            return (("lane", request.source_lane_address, bookie_id),
                    lambda: LanePeerReader(request.source_lane_address, bookie_id, limit))
        files = peer_tls_files(self.cfg, self.policy.tls)
        return (("grpc", request.source_address, bookie_id, files),
                lambda: PeerReader(request.source_address, limit, bookie_id=bookie_id,
                                   credentials=credentials_of(files)))

    def PullEntries(self, request: pb.PullRequest, context: grpc.ServicerContext) -> pb.PullResponse:
        """Copy wanted entries of a ledger from a peer into this bookie
        (bookie_server/serving/pull.py); operators only (protocol/access.py)."""
        try:
            peer = self.peer(context)
            self.authorize(peer, "pull")
            if not request.source_address:
                raise errors.BadRequest("PullEntries needs source_address")
            keyless = self.authorize(peer, "recovery_add", request.master_key)
            wanted = pull.ids_from_bytes(request.wanted_ids)
            with self.peers.reader(*self._peer_reader(request)) as source:
                got = pull.pull(self.bookie, source, request.ledger_id, request.master_key,
                                wanted, request.digest_type or "crc32c", keyless=keyless,
                                window=request.read_window)
            log.info("event=pull ledger=%d source=%s entries=%d bytes=%d missing=%d",
                     request.ledger_id, request.source_address, got.entries, got.bytes,
                     len(got.missing))
            return pb.PullResponse(code=pb.OK, message=got.message, entries=got.entries,
                                   byte_count=got.bytes, missing_ids=pull.ids_to_bytes(got.missing))
        except BaseException as exc:  # noqa: BLE001
            code, msg = _code(exc, "pull")
            return pb.PullResponse(code=code, message=msg)

    def Health(self, request: pb.HealthRequest, context: grpc.ServicerContext) -> pb.HealthResponse:
        return pb.HealthResponse(serving=True, bookie_id=self.bookie_id)


def bind_server(cfg: BookieConfig, tls: Optional[ServerTls] = None) -> tuple[grpc.Server, int]:
    """A gRPC server bound to ``cfg.port`` but serving nothing yet (the port
    is taken before the bookie writes anything anywhere; ``add_service``
    comes once the bookie is open).  OSError if the port cannot be bound.
    ``tls``: a bookie_server.serving.tls.ServerTls, for a TLS port."""
    limit = cfg.grpc_message_limit()
    server = grpc.server(
        futures.ThreadPoolExecutor(max_workers=cfg.grpc_threads, thread_name_prefix="grpc"),
        options=[("grpc.max_send_message_length", limit),
                 ("grpc.max_receive_message_length", limit),
                 ("grpc.so_reuseport", 0)])
    try:
        address = f"{cfg.bind_address}:{cfg.port}"
        port = (server.add_secure_port(address, tls.grpc_credentials()) if tls is not None
                else server.add_insecure_port(address))
    except RuntimeError as exc:           # grpc >= 1.5x raises instead of returning 0
        raise OSError(f"cannot bind {cfg.bind_address}:{cfg.port}: {exc}") from None
    if port == 0:
        raise OSError(f"cannot bind {cfg.bind_address}:{cfg.port}")
    return server, port


def add_service(server: grpc.Server, bookie: Bookie, cfg: BookieConfig,
                bookie_id: str) -> BookieService:
    """The service ``server`` serves the bookie with; its ``close`` is the
    caller's once the server stopped."""
    service = BookieService(bookie, cfg, bookie_id)
    framing.add_bookie_servicer(service, server)
    return service


def make_add_lane(service: BookieService, listener: Optional[socket.socket] = None,
                  tls: Optional[ServerTls] = None) -> Optional[AddLaneServer]:
    """The started add lane server (bookie_server/serving/lane_server.py)
    serving the bookie through ``service``, the gRPC server's (one service
    per bookie: its peer readers and their ``close`` are the bookie's, not
    one per listener), or None when ``add_lane_port`` is -1.
    ``listener``: its socket, bound beforehand; ``tls``: a
    bookie_server.serving.tls.ServerTls for TLS connections."""
    if service.cfg.add_lane_port < 0:
        return None
    return AddLaneServer(service, service.cfg, listener, tls).start()
