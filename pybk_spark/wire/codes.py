"""The ONE place where wire status codes and gRPC errors become typed errors.

Both directions live here:
  * ``error_to_code(exc)``  (bookie side)  BKError -> (StatusCode, message)
  * ``raise_for_code(code, message)``  (client side)  StatusCode -> BKError
  * ``translate_rpc_error(rpc_error)``  (client side)  grpc.RpcError -> BKError
  * ``translate_socket_error(exc)``  (client side, add lane)  OSError etc. -> BKError
    (a failed TLS handshake -> ``TlsError`` naming the setting to check)
"""
from __future__ import annotations

import ssl
from typing import Any

from pybk_spark import errors
from pybk_spark.wire import bookie_wire_pb2 as pb

OK = pb.OK

# How a read stream ended (``ReadResult.end``): wire enum <-> name.
READ_END_NAMES: dict[Any, str] = {pb.COMPLETE: "COMPLETE", pb.LIMIT: "LIMIT", pb.MISSING: "MISSING"}
READ_END_CODES: dict[str, Any] = {name: code for code, name in READ_END_NAMES.items()}

_CODE_TO_ERROR: dict[int, type[errors.BKError]] = {
    pb.NO_SUCH_LEDGER: errors.NoSuchLedger,
    pb.NO_SUCH_ENTRY: errors.NoSuchEntry,
    pb.BAD_REQUEST: errors.BadRequest,
    pb.TOO_LARGE: errors.TooLarge,
    pb.IO_ERROR: errors.BookieIOError,
    pb.UNAUTHORIZED: errors.Unauthorized,
    pb.FENCED: errors.LedgerFenced,
    pb.READ_ONLY: errors.ReadOnly,
    pb.TOO_MANY_REQUESTS: errors.TooManyRequests,
    pb.INVALID_COOKIE: errors.InvalidCookie,
}
_ERROR_TO_CODE = {cls: code for code, cls in _CODE_TO_ERROR.items()}


def error_to_code(exc: BaseException) -> tuple[int, str]:
    """Bookie side: map any exception raised while serving to a wire code."""
    for cls in type(exc).__mro__:
        if cls in _ERROR_TO_CODE:
            return _ERROR_TO_CODE[cls], str(exc)
    if isinstance(exc, errors.IncorrectParameter):
        return pb.BAD_REQUEST, str(exc)
    if isinstance(exc, OSError):
        return pb.IO_ERROR, f"{type(exc).__name__}: {exc}"
    return pb.BAD_REQUEST, f"{type(exc).__name__}: {exc}"


def error_for_code(code: int, message: str = "", **context: Any) -> errors.BKError:
    cls = _CODE_TO_ERROR.get(code, errors.BKError)
    return cls(message or f"bookie returned status {code}", **context)


def raise_for_code(code: int, message: str = "", **context: Any) -> None:
    """Client side: raise the typed error for a non-OK response code."""
    if code != OK:
        raise error_for_code(code, message, **context)


def translate_rpc_error(exc: Exception, **context: Any) -> errors.BKError:
    """Client side: a transport failure.  Outcome of a write is UNKNOWN."""
    import grpc  # why: grpc (~90 ms) stays out of a Spark worker that only plans

    if isinstance(exc, grpc.RpcError) and hasattr(exc, "code"):
        status = exc.code()
        detail = exc.details() if hasattr(exc, "details") else ""
        if status == grpc.StatusCode.DEADLINE_EXCEEDED:
            return errors.Timeout(f"bookie rpc timed out: {detail}", **context)
        if status == grpc.StatusCode.RESOURCE_EXHAUSTED:
            return errors.TooLarge(f"grpc message limit: {detail}", **context)
        if status == grpc.StatusCode.UNAUTHENTICATED:
            return errors.Unauthorized(detail or "", **context)
        low = (detail or "").lower()
        if status == grpc.StatusCode.UNAVAILABLE and any(m in low for m in _TLS_FAILURES):
            hint = ("tls_server_name, or the bookie certificate's subject alternative names "
                    "(they must hold the address the bookie registered)" if "hostname" in low
                    else "the client's tls_ca_file (the CA of the bookie's certificate), "
                    "tls_cert_file / tls_key_file, and the bookie's tls_cert_file (expired?) "
                    "and tls_ca_file")
            return errors.TlsError(f"TLS with the bookie failed: {detail}; check {hint}",
                                   **context)
        return errors.BookieUnavailable(f"{status.name}: {detail}", **context)
    if isinstance(exc, errors.BKError):
        return exc
    return errors.BookieUnavailable(f"{type(exc).__name__}: {exc}", **context)


# gRPC's words for a failed TLS handshake ("Ssl handshake failed", "Hostname
# Verification Check failed")
_TLS_FAILURES = ("handshake", "verification check")


def translate_socket_error(exc: BaseException, **context: Any) -> errors.BKError:
    """Client side, add lane: a socket failure, the end of the connection or
    a malformed frame.  Outcome of a write is UNKNOWN."""
    if isinstance(exc, errors.BKError):
        return exc
    if isinstance(exc, ssl.SSLError):
        return translate_tls_error(exc, **context)
    if isinstance(exc, (TimeoutError, BufferError)):  # connect timed out / bookie not reading
        return errors.Timeout(f"add lane: {type(exc).__name__}: {exc}", **context)
    return errors.BookieUnavailable(f"add lane: {type(exc).__name__}: {exc}", **context)


def translate_tls_error(exc: BaseException, address: str = "", **context: Any) -> errors.TlsError:
    """Client side, lane: a failed TLS handshake, naming what to fix."""
    where = f" at {address}" if address else ""
    if isinstance(exc, ssl.SSLCertVerificationError):
        why = exc.verify_message or str(exc)
        hint = ("tls_server_name, or the bookie certificate's subject alternative names "
                "(they must hold the address the bookie registered)"
                if "hostname" in why.lower() or "ip address" in why.lower()
                else "the client's tls_ca_file (the CA that signed the bookie's "
                     "certificate) and the bookie's tls_cert_file (expired?)")
        return errors.TlsError(f"bookie certificate{where} not accepted: {why}; check {hint}",
                               **context)
    return errors.TlsError(
        f"TLS handshake{where} failed ({type(exc).__name__}: {exc}): the bookie may not serve "
        "TLS, or refused this client's certificate; check the client's tls_cert_file / "
        "tls_key_file and the bookie's tls_ca_file / tls_operator_identities", **context)
