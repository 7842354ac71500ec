"""gRPC adapter of the bookie transport, and the registry-backed pool.

Non-OK response codes become typed errors via ``wire.codes.raise_for_code``;
gRPC failures via ``wire.codes.translate_rpc_error`` (deadline => Timeout,
outcome unknown).  Channels get explicit send/receive message limits.
Adds go over one connection per bookie: the bookie's add lane when it
registered one and the client's ``add_transport`` is ``lane`` (the default;
transport/lane_client.py), else one bidirectional ``AddStream``
(transport/request_streams.py).  Entry reads likewise go over one read lane
connection per bookie (``read_transport``, default ``lane``), else the unary
``ReadEntries``.  The pool's watchdog thread expires adds and lane reads
older than their timeout.  Everything else (LAC, fencing, info) is gRPC.
With ``tls`` (transport/tls.py) the channel and the lane connections are
TLS; a bookie whose registration disagrees with the client about TLS is
refused before any connection (``TlsError`` naming the setting).
"""
from __future__ import annotations

import json
import threading
import time
from concurrent.futures import Future
from typing import Callable

import grpc
import numpy as np

from pybk_spark import errors
from pybk_spark.metadata.store import MetadataStore
from pybk_spark.transport.lane_client import (frame_add, frame_read, lane_connector,
                                           read_lane_connector)
from pybk_spark.transport.request_streams import (PendingRequests, RequestStreamer,
                                                 next_request_id, stream_connector)
from pybk_spark.transport.base import (BookieTransport, Deliver, LoneEntry, PullResult,
                                       TransportPool, deliver_to, fail, failed_future, settle)
from pybk_spark.wire import bookie_wire_pb2 as pb
from pybk_spark.wire import bookie_wire_pb2_grpc as pbg
from pybk_spark.wire import codes, framing, lane_frames
from pybk_spark.wire.entries import batch_from_bytes
from pybk_spark.wire.channel_options import bookie_channel_options
from pybk_spark.wire.results import LacResult, ReadResult
from pybk_spark.metadata import keys

ADD_TRANSPORTS = ("lane", "grpc")
READ_TRANSPORTS = ADD_TRANSPORTS


class BookieClient(BookieTransport):
    def __init__(self, address: str, max_message_bytes: int = 64 << 20,
                 default_timeout: float = 5.0, bookie_id: str = "",
                 clock: Callable[[], float] = time.monotonic, stream_idle_close_s: float = 30.0,
                 add_lane_address: str = "", resolve_add_lane: Callable[[], str] = lambda: "",
                 read_lane_address: str = "", tls=None):
        self.address = address
        self.bookie_id = bookie_id or address
        self.default_timeout = default_timeout
        options = bookie_channel_options(max_message_bytes)
        if tls is None:
            self._channel = grpc.insecure_channel(address, options=options)
        else:
            self._channel = grpc.secure_channel(address, tls.channel_credentials(),
                                                options=options + tls.channel_options())
        self._stub = pbg.BookieStub(self._channel)
        # read answers are parsed in place (wire/framing.py): no copy of the entries
        self._read_entries = self._channel.unary_unary(
            framing.READ_ENTRIES_METHOD, request_serializer=pb.ReadRequest.SerializeToString,
            response_deserializer=framing.parse_read_response)
        self._lane_adds = bool(add_lane_address)
        if add_lane_address:
            add_connector = lane_connector(add_lane_address, self.bookie_id, default_timeout,
                                           resolve_add_lane, tls=tls)
            self._adds = RequestStreamer(add_connector, self.bookie_id, clock,
                                         stream_idle_close_s, frame=frame_add)
        else:
            self._adds = RequestStreamer(stream_connector(self._channel, self.bookie_id),
                                         self.bookie_id, clock, stream_idle_close_s)
        self._reads = None                  # None: reads are unary ReadEntries calls
        if read_lane_address:
            read_connector = read_lane_connector(read_lane_address, self.bookie_id,
                                                 default_timeout, resolve_add_lane,
                                                 max_message_bytes, tls)
            self._reads = RequestStreamer(read_connector, self.bookie_id, clock,
                                          stream_idle_close_s, frame=frame_read)

    @property
    def add_connection(self) -> PendingRequests | None:
        """The connection adds go over now: a lane connection or an
        AddStream (see ``RequestStreamer.connection``)."""
        return self._adds.connection

    @property
    def read_connection(self) -> PendingRequests | None:
        """The read lane connection entry reads go over now; None when reads
        are unary ``ReadEntries`` calls (no lane, or ``read_transport =
        grpc``) or before the first read."""
        return None if self._reads is None else self._reads.connection

    @property
    def reads_over_lane(self) -> bool:
        return self._reads is not None

    def _call(self, method, request, timeout, convert: Callable) -> Future:
        ctx = {"bookie": self.bookie_id}
        try:
            gfut = method.future(request, timeout=timeout or self.default_timeout)
        except (grpc.RpcError, ValueError) as exc:  # ValueError: channel closed
            return failed_future(codes.translate_rpc_error(exc, **ctx))
        out: Future = Future()

        def done(f) -> None:
            try:
                resp = f.result()
            except Exception as exc:  # noqa: BLE001 - `out` must settle, or its caller waits forever
                fail(out, codes.translate_rpc_error(exc, **ctx))
                return
            settle(out, convert, resp, **ctx)
        gfut.add_done_callback(done)
        # a caller that cancels (a reader that stopped early) stops the call
        out.add_done_callback(lambda o: gfut.cancel() if o.cancelled() else None)
        return out

    def _check(self, resp, **ctx) -> None:
        codes.raise_for_code(resp.code, resp.message, bookie=self.bookie_id, **ctx)

    def add(self, ledger_id, master_key, entries, recovery=False, timeout=None):
        head = pb.AddRequest(ledger_id=ledger_id, master_key=master_key, recovery=recovery)

        def conv(resp):
            self._check(resp, ledger_id=ledger_id)
            return resp.first_entry_id, resp.last_entry_id
        return self._adds.submit(head, entries, timeout or self.default_timeout, conv)

    def add_entry(self, master_key, record_head, payload, recovery=False, timeout=None):
        if not self._lane_adds:          # the AddStream carries batches only
            return super().add_entry(master_key, record_head, payload, recovery, timeout)
        fut: Future = Future()
        self.send_entry(LoneEntry(master_key, record_head, payload, recovery), timeout,
                        deliver_to(fut))
        return fut

    def send_entry(self, entry: LoneEntry, timeout, deliver: Deliver) -> None:
        if not self._lane_adds:          # the AddStream carries batches only
            super().send_entry(entry, timeout, deliver)
            return
        framed = entry.framed
        if framed is None:               # first bookie of the write set: frame it once
            request_id = next_request_id()
            framed = entry.framed = (request_id, lane_frames.entry_frame(
                request_id, entry.recovery, entry.master_key, entry.head, entry.payload))
        self._adds.send_framed(framed[0], framed[1], timeout or self.default_timeout,
                               self._entry_acked, deliver)

    def _entry_acked(self, resp) -> tuple[int, int]:
        if resp.code != pb.OK:
            self._check(resp)
        return resp.first_entry_id, resp.last_entry_id

    def expire(self) -> None:
        """Fail adds and lane reads older than their timeout (called by the
        pool's watchdog)."""
        self._adds.expire()
        if self._reads is not None:
            self._reads.expire()

    def read(self, ledger_id, first, last, *, max_entries=0, max_bytes=0, fence=False,
             master_key=b"", timeout=None, sparse=False, stripe=None):
        req = pb.ReadRequest(ledger_id=ledger_id, first_entry_id=first, last_entry_id=last,
                             max_entries=max_entries, max_bytes=max_bytes, fence=fence,
                             master_key=master_key, sparse=sparse,
                             stripe_ensemble=stripe[0] if stripe else 0,
                             stripe_slot=stripe[1] if stripe else 0)

        def conv(resp):
            self._check(resp, ledger_id=ledger_id, entry_id=first)
            return ReadResult(batch_from_bytes(resp.entries),
                              codes.READ_END_NAMES.get(resp.end, "MISSING"), resp.lac, resp.fenced, resp.entries)
        if self._reads is not None:
            return self._reads.submit(req, b"", timeout or self.default_timeout, conv)
        return self._call(self._read_entries, req, timeout, conv)

    def read_lac(self, ledger_id, *, fence=False, master_key=b"", wait_for_lac_above=-2,
                 wait_ms=0, timeout=None):
        req = pb.ReadLacRequest(ledger_id=ledger_id, fence=fence, master_key=master_key,
                                wait_for_lac_above=wait_for_lac_above, timeout_ms=wait_ms)

        def conv(resp):
            self._check(resp, ledger_id=ledger_id)
            return LacResult(resp.lac, resp.last_entry_id, resp.fenced, resp.master_key)
        if timeout is None and wait_ms:
            timeout = self.default_timeout + wait_ms / 1000.0
        return self._call(self._stub.ReadLac, req, timeout, conv)

    def write_lac(self, ledger_id, master_key, lac, timeout=None):
        req = pb.WriteLacRequest(ledger_id=ledger_id, master_key=master_key, lac=lac)

        def conv(resp):
            self._check(resp, ledger_id=ledger_id)
        return self._call(self._stub.WriteLac, req, timeout, conv)

    def pull(self, ledger_id, master_key, source, wanted, digest_type, timeout=None):
        req = pb.PullRequest(ledger_id=ledger_id, master_key=master_key,
                             source_address=source.address,
                             source_lane_address=source.lane_address,
                             source_bookie_id=source.bookie_id,
                             wanted_ids=np.asarray(wanted, dtype="<i8").tobytes(),
                             digest_type=digest_type)

        def conv(resp):
            self._check(resp, ledger_id=ledger_id)
            return PullResult(resp.entries, resp.byte_count,
                              np.frombuffer(resp.missing_ids, dtype="<i8").astype(np.int64),
                              resp.message)
        return self._call(self._stub.PullEntries, req, timeout, conv)

    def info(self, timeout=None) -> Future:
        def conv(resp):
            self._check(resp)
            return resp
        return self._call(self._stub.GetBookieInfo, pb.BookieInfoRequest(), timeout, conv)

    def close(self) -> None:
        self._adds.close()
        if self._reads is not None:
            self._reads.close()
        self._channel.close()


def registration_of(store: MetadataStore, bookie_id: str) -> dict | None:
    for state in ("writable", "readonly"):
        v = store.get(keys.bookie_key(state, bookie_id))
        if v is not None:
            try:
                return json.loads(v.value)
            except ValueError:
                return None
    return None


class GrpcTransportPool(TransportPool):
    """bookie id -> BookieClient, address resolved from the registry and cached."""

    def __init__(self, store: MetadataStore, *, max_message_bytes: int = 64 << 20,
                 timeout: float = 5.0, clock: Callable[[], float] = time.monotonic,
                 stream_idle_close_s: float = 30.0, add_transport: str = "lane",
                 read_transport: str = "lane", tls=None):
        if add_transport not in ADD_TRANSPORTS:
            raise errors.IncorrectParameter(
                f"add_transport must be one of {ADD_TRANSPORTS}, not {add_transport!r}")
        if read_transport not in READ_TRANSPORTS:
            raise errors.IncorrectParameter(
                f"read_transport must be one of {READ_TRANSPORTS}, not {read_transport!r}")
        self._tls = tls
        self._use_lane = add_transport == "lane"
        self._read_lane = read_transport == "lane"
        self._store = store
        self._idle_close_s = stream_idle_close_s
        self._max = max_message_bytes
        self._timeout = timeout
        self._clock = clock
        self._lock = threading.Lock()
        self._clients: dict[str, BookieClient] = {}
        # the last registration seen of each bookie id, kept while it is absent
        # from the registry; one entry per id, like _clients
        self._known: dict[str, dict] = {}
        self._stale: dict[str, _LastKnownAddress] = {}    # clients built from _known
        self._stop = threading.Event()
        self._watchdog: threading.Thread | None = None

    def _watch(self) -> None:
        interval = min(1.0, max(0.05, min(self._timeout, self._idle_close_s) / 10))
        while not self._stop.wait(interval):
            with self._lock:
                clients: list[BookieClient | _LastKnownAddress] = [*self._clients.values(),
                                                                   *self._stale.values()]
            for c in clients:
                c.expire()

    def get(self, bookie_id: str) -> BookieTransport:
        # read without the lock: one dict lookup is atomic, ``_lock`` orders
        # the writers (``_cache``, ``invalidate``, ``close``), and a client a
        # writer drops right after this read is one the locked read could
        # have returned as well (every lone add asks three times)
        client = self._clients.get(bookie_id)
        if client is not None:
            return client
        reg = registration_of(self._store, bookie_id)
        if reg is None or not reg.get("address"):
            return self._last_known(bookie_id)
        with self._lock:
            self._known[bookie_id] = reg
            stale = self._stale.pop(bookie_id, None)
        if stale is not None:
            _close_later(stale)
        mismatch = _tls_mismatch(bool(reg.get("tls")), self._tls is not None)
        if mismatch:
            return _Unavailable(bookie_id, errors.TlsError(mismatch, bookie=bookie_id))
        return self._cache(self._clients, bookie_id, self._client_for(bookie_id, reg))

    def _client_for(self, bookie_id: str, reg: dict) -> BookieClient:
        lane = reg.get("add_lane_address") or ""
        return BookieClient(reg["address"], self._max, self._timeout, bookie_id, self._clock,
                            self._idle_close_s, lane if self._use_lane else "",
                            lambda: self._lane_address(bookie_id),
                            lane if self._read_lane else "", self._tls)

    def _cache(self, table: dict, bookie_id: str, client):
        """Put ``client`` in ``table`` unless another thread was first (then
        close ours and return theirs); starts the watchdog."""
        with self._lock:
            old = table.setdefault(bookie_id, client)
            if self._watchdog is None and not self._stop.is_set():
                self._watchdog = threading.Thread(target=self._watch, daemon=True,
                                                  name="pybk-add-watchdog")
                self._watchdog.start()
        if old is not client:
            client.close()
        return old

    def _last_known(self, bookie_id: str) -> BookieTransport:
        """A bookie absent from the registry (restarting, or its lease lapsed
        while etcd stalled) may still answer at the address it last
        registered: reads go there (their answers are verified like any
        other), writes fail as they would without the address."""
        with self._lock:
            stale = self._stale.get(bookie_id)
            reg = self._known.get(bookie_id)
        if stale is not None:
            return stale
        if reg is None or _tls_mismatch(bool(reg.get("tls")), self._tls is not None):
            return _Unavailable(bookie_id)
        return self._cache(self._stale, bookie_id,
                           _LastKnownAddress(self._client_for(bookie_id, reg)))

    def _lane_address(self, bookie_id: str) -> str:
        reg = registration_of(self._store, bookie_id)
        return (reg or {}).get("add_lane_address") or ""

    def last_known_address(self, bookie_id: str) -> str:
        """The gRPC address ``bookie_id`` last registered, as this pool saw
        it ('' when never seen)."""
        with self._lock:
            return (self._known.get(bookie_id) or {}).get("address") or ""

    def invalidate(self, bookie_id: str) -> None:
        """Drop the connections to ``bookie_id`` (the next ``get`` reads the
        registry again); its last known address is kept."""
        with self._lock:
            dropped = [self._clients.pop(bookie_id, None), self._stale.pop(bookie_id, None)]
        for client in dropped:
            if client is not None:
                _close_later(client)

    def close(self) -> None:
        self._stop.set()
        with self._lock:
            clients = [*self._clients.values(), *self._stale.values()]
            self._clients, self._stale = {}, {}
        for c in clients:
            c.close()


def _close_later(client: BookieTransport) -> None:
    # never close in place: callers run in gRPC callbacks on the channel's
    # own thread, and channel.close() waits for that thread (deadlock)
    threading.Thread(target=client.close, name="pybk-close-channel", daemon=True).start()


def _tls_mismatch(bookie_tls: bool, client_tls: bool) -> str:
    """Why this client cannot talk to a bookie registered with(out) TLS ('' = it can)."""
    if bookie_tls and not client_tls:
        return ("the bookie serves TLS only and this client has no TLS settings: set "
                "tls_ca_file (client.conf, or the Spark option tls.caFile) and, if the "
                "bookies require client certificates, tls_cert_file / tls_key_file")
    if client_tls and not bookie_tls:
        return ("this client requires TLS (tls_ca_file is set) and the bookie does not serve "
                "it (its registration has no tls): set tls_cert_file / tls_key_file in the "
                "bookie's conf, or clear tls_ca_file on this client")
    return ""


class _Unavailable(BookieTransport):
    """A bookie that is not registered (dead), or that this client may not
    talk to (TLS on one side only): every call fails at once."""

    def __init__(self, bookie_id: str, error: errors.BKError | None = None):
        self.bookie_id = bookie_id
        self.error = error

    def _fail(self) -> Future:
        return failed_future(self.error or errors.BookieUnavailable("bookie not registered",
                                                                    bookie=self.bookie_id))

    def add(self, *a, **k):
        return self._fail()

    def read(self, *a, **k):
        return self._fail()

    def read_lac(self, *a, **k):
        return self._fail()

    def write_lac(self, *a, **k):
        return self._fail()


class _LastKnownAddress(BookieTransport):
    """A bookie absent from the registry, reached at the address it last
    registered: reads and LAC reads (fencing ones included: a fence that
    reaches a live bookie only makes recovery safer) go there; adds, explicit
    LAC writes and pulls fail as for any unregistered bookie.  A read the
    address does not answer fails with ``BookieUnavailable`` naming both."""

    def __init__(self, client: BookieClient):
        self.client = client
        self.bookie_id = client.bookie_id
        self.address = client.address

    def _refused(self) -> Future:
        return failed_future(errors.BookieUnavailable("bookie not registered",
                                                      bookie=self.bookie_id))

    def _unanswered(self, fut: Future) -> Future:
        out: Future = Future()

        def done(f: Future) -> None:
            if f.cancelled():
                out.cancel()
                return
            exc = f.exception()
            if exc is None:
                settle(out, lambda r: r, f.result())
            elif isinstance(exc, errors.BookieUnavailable) and not isinstance(exc, errors.TlsError):
                fail(out, errors.BookieUnavailable(
                    f"bookie not registered, and its last known address {self.address} did "
                    f"not answer: {exc}", bookie=self.bookie_id))
            else:
                fail(out, exc)
        fut.add_done_callback(done)
        out.add_done_callback(lambda o: fut.cancel() if o.cancelled() else None)
        return out

    def add(self, *a, **k):
        return self._refused()

    def write_lac(self, *a, **k):
        return self._refused()

    def pull(self, *a, **k):
        return self._refused()

    def read(self, *a, **k):
        return self._unanswered(self.client.read(*a, **k))

    def read_lac(self, *a, **k):
        return self._unanswered(self.client.read_lac(*a, **k))

    def expire(self) -> None:
        self.client.expire()

    def close(self) -> None:
        self.client.close()
