"""Where etcd and gRPC failures become ``pybk_spark.errors``: ``translate(fn)``
wraps one call of the etcd client so that every failure it raises is a typed
pybk error (one attempt; ``etcd_connection.EtcdConnection.call`` adds
retries and the endpoints).  Refusals (TLS, authentication, permissions) are
``etcd_refusals``' to name.
"""
from __future__ import annotations

import functools

import grpc
from pyetcd import exceptions as etcd_exc

from pybk_spark import errors
from pybk_spark.metadata.etcd_refusals import refusal_for_status, refusal_for_transport
from pybk_spark.metadata.security import EtcdSecurity


def _details(exc: BaseException | None) -> str:
    """The gRPC detail behind a pyetcd exception (pyetcd raises its own
    classes inside ``except RpcError``, so the RpcError is the context)."""
    for e in (exc, getattr(exc, "__context__", None)):
        if isinstance(e, grpc.RpcError) and hasattr(e, "details"):
            return e.details() or ""
    return ""


# What every request asks of the member it reaches (etcd's clientv3
# ``WithRequireLeader``): a member that has no leader (cut off from the
# majority, or mid-election) refuses it at once, in its gRPC interceptor,
# before the request is looked at, instead of holding it until the deadline.
REQUIRE_LEADER = (("hasleader", "true"),)
_NO_LEADER = "etcdserver: no leader"


def refused_without_leader(exc: BaseException) -> bool:
    """``exc`` (a translated error) is a member's refusal for want of a
    leader: the request was not applied, so even a write may be resent."""
    return _NO_LEADER in _details(exc.__cause__)


def translate(fn, sec: EtcdSecurity | None = None):
    """Turn every etcd/gRPC failure raised by ``fn`` into a pybk error (one
    attempt; ``EtcdMetadataStore._call`` adds retries and the endpoints)."""
    sec = sec or EtcdSecurity()

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except errors.BKError:
            raise
        except (etcd_exc.ConnectionFailedError, etcd_exc.ConnectionTimeoutError,
                etcd_exc.NoServerAvailableError, etcd_exc.InternalServerError,
                etcd_exc.WatchTimedOut) as exc:
            refused = refusal_for_transport(_details(exc), sec)
            if refused is not None:
                raise refused from exc
            detail = _details(exc)
            raise errors.MetadataUnavailable(
                f"etcd unavailable: {exc or type(exc).__name__}"
                + (f" ({detail})" if _NO_LEADER in detail else "")) from exc
        except etcd_exc.PreconditionFailedError as exc:
            ctx = exc.__context__
            refused = (refusal_for_status(ctx.code().name, _details(ctx), sec)
                       if isinstance(ctx, grpc.RpcError) else None)
            if refused is not None:
                raise refused from exc
            raise errors.MetadataError(f"etcd error: {type(exc).__name__} {exc}") from exc
        except etcd_exc.Etcd3Exception as exc:
            raise errors.MetadataError(f"etcd error: {type(exc).__name__} {exc}") from exc
        except grpc.RpcError as exc:
            code = exc.code() if hasattr(exc, "code") else None
            detail = exc.details() if hasattr(exc, "details") else str(exc)
            refused = (refusal_for_status(code.name if code else "", detail or "", sec)
                       or refusal_for_transport(detail or "", sec))
            if refused is not None:
                raise refused from exc
            if code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED,
                        grpc.StatusCode.CANCELLED, grpc.StatusCode.UNKNOWN):
                raise errors.MetadataUnavailable(f"etcd unavailable: {code} {detail}") from exc
            if code == grpc.StatusCode.NOT_FOUND:
                raise errors.MetadataError(f"etcd: {detail}") from exc
            if ((code == grpc.StatusCode.INVALID_ARGUMENT and "too large" in (detail or ""))
                    or (code == grpc.StatusCode.RESOURCE_EXHAUSTED
                        and "larger than max" in (detail or ""))):
                raise errors.MetadataTooLarge.refused(detail) from exc
            if code == grpc.StatusCode.INVALID_ARGUMENT:
                raise errors.IncorrectParameter(f"etcd rejected request: {detail}") from exc
            raise errors.MetadataError(f"etcd error: {code} {detail}") from exc
    return wrapper
