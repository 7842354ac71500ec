"""This bookie as a reader of a peer bookie: the sparse reads of a pull
(bookie_server/serving/pull.py), over the peer's gRPC ``ReadEntries``.

It is a thin caller of the gRPC stub, the bookie's own: the client's
transports (pybk_spark/transport/) are not the bookie's to import.  A read
answer is parsed in place (``wire.framing.parse_read_response``: no copy of
the entries) and returned as a ``wire.results.ReadResult`` with the
answer's Arrow IPC bytes kept, so a fully kept answer is journaled as
received.  Errors cross here once: a gRPC failure becomes a typed error
(``wire.codes.translate_rpc_error``), a refused read the typed error of its
wire code (``wire.codes.raise_for_code``).

TLS.  On a TLS bookie the pull is TLS too: this bookie presents its own
certificate (``tls_cert_file`` / ``tls_key_file``, which must allow client
authentication, as trustme's and most CA profiles do) and verifies the
peer's against ``tls_ca_file``.  The files are read per pull, so a
SIGHUP-reloaded certificate is the one presented (a reader kept for later
pulls, serving/peer_pool.py, serves only pulls with the same files).
"""
from __future__ import annotations

from concurrent.futures import Future, InvalidStateError
from typing import Any, Callable, Optional

import grpc

from pybk_spark import errors
from pybk_spark.config import read_setting_file
from pybk_spark.wire import bookie_wire_pb2 as pb
from pybk_spark.wire import codes, framing
from pybk_spark.wire.channel_options import bookie_channel_options
from pybk_spark.wire.entries import batch_from_bytes
from pybk_spark.wire.results import ReadResult


TlsFiles = tuple[bytes, Optional[bytes], Optional[bytes]]   # CA, key, certificate chain


def peer_tls_files(cfg: Any, tls_on: bool) -> TlsFiles | None:
    """The TLS files this bookie reads a peer with, as bytes: None on a
    plaintext bookie; on a TLS one its own certificate and key and
    ``tls_ca_file`` to verify the peer (without which it cannot pull: the
    driver copies through its client instead)."""
    if not tls_on:
        return None
    if not cfg.tls_ca_file:
        raise errors.BadRequest("a pull on a TLS bookie needs tls_ca_file (to verify the "
                                "peer it reads from): copy through a client")
    return (read_setting_file(cfg.tls_ca_file, "tls_ca_file"),
            read_setting_file(cfg.tls_key_file, "tls_key_file") if cfg.tls_key_file else None,
            read_setting_file(cfg.tls_cert_file, "tls_cert_file") if cfg.tls_cert_file else None)


def credentials_of(files: TlsFiles | None) -> grpc.ChannelCredentials | None:
    """``peer_tls_files``' files as gRPC channel credentials (None: plaintext)."""
    if files is None:
        return None
    ca, key, chain = files
    return grpc.ssl_channel_credentials(root_certificates=ca, private_key=key,
                                        certificate_chain=chain)


def read_request(bookie_id: str, ledger_id: int, first: int, last: int, *, max_entries: int,
                 max_bytes: int, sparse: bool) -> tuple[pb.ReadRequest, dict[str, Any]]:
    """A pull's read of a peer, and the context its errors name."""
    req = pb.ReadRequest(ledger_id=ledger_id, first_entry_id=first, last_entry_id=last,
                         max_entries=max_entries, max_bytes=max_bytes, sparse=sparse)
    return req, {"bookie": bookie_id, "ledger_id": ledger_id, "entry_id": first}


def read_result(resp: Any, ctx: dict[str, Any]) -> ReadResult:
    """A peer's parsed read answer as a ``ReadResult``; a refused read
    raises its wire code's typed error."""
    codes.raise_for_code(resp.code, resp.message, **ctx)
    return ReadResult(batch_from_bytes(resp.entries), codes.READ_END_NAMES.get(resp.end, "MISSING"),
                      resp.lac, resp.fenced, resp.entries)


class PeerReader:
    """Sparse reads of one peer bookie, each a future of a ``ReadResult``
    (the shape pull.py's read window drives)."""

    def __init__(self, address: str, max_message_bytes: int, bookie_id: str = "",
                 credentials: grpc.ChannelCredentials | None = None,
                 default_timeout: float = 5.0):
        self.address = address
        self.bookie_id = bookie_id or address
        self.default_timeout = default_timeout
        options = bookie_channel_options(max_message_bytes)
        self._channel = (grpc.insecure_channel(address, options=options) if credentials is None
                         else grpc.secure_channel(address, credentials, options=options))
        self._read_entries = self._channel.unary_unary(
            framing.READ_ENTRIES_METHOD, request_serializer=pb.ReadRequest.SerializeToString,
            response_deserializer=framing.parse_read_response)

    def read(self, ledger_id: int, first: int, last: int, *, max_entries: int = 0,
             max_bytes: int = 0, timeout: float | None = None,
             sparse: bool = False) -> "Future[ReadResult]":
        req, ctx = read_request(self.bookie_id, ledger_id, first, last, max_entries=max_entries,
                                max_bytes=max_bytes, sparse=sparse)
        return self._call(req, timeout or self.default_timeout,
                          lambda resp: read_result(resp, ctx), ctx)

    def _call(self, req: Any, timeout: float, convert: Callable[[Any], ReadResult],
              ctx: dict[str, Any]) -> "Future[ReadResult]":
        out: Future[ReadResult] = Future()
        try:
            gfut = self._read_entries.future(req, timeout=timeout)
        except (grpc.RpcError, ValueError) as exc:      # ValueError: channel closed
            out.set_exception(codes.translate_rpc_error(exc, **ctx))
            return out

        def done(f: Any) -> None:
            try:
                resp = f.result()
            except Exception as exc:  # noqa: BLE001 - broad: `out` must settle, or the pull waits forever
                _settle(out, exc=codes.translate_rpc_error(exc, **ctx))
                return
            try:
                result = convert(resp)
            except errors.BKError as exc:
                _settle(out, exc=exc)
            except Exception as exc:  # noqa: BLE001 - broad: a malformed answer
                _settle(out, exc=errors.BadRequest(f"bad bookie response: {exc}", **ctx))
            else:
                _settle(out, result=result)
        gfut.add_done_callback(done)
        # a read the pull abandons (cancelled) stops its call
        out.add_done_callback(lambda o: gfut.cancel() if o.cancelled() else None)
        return out

    def close(self) -> None:
        self._channel.close()


def _settle(fut: Future[ReadResult], result: Any = None, exc: BaseException | None = None) -> None:
    """Complete ``fut`` unless the pull already cancelled it."""
    try:
        if exc is not None:
            fut.set_exception(exc)
        else:
            fut.set_result(result)
    except InvalidStateError:
        pass
