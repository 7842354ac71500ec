"""The connection to an etcd cluster: endpoints, TLS, authentication, and the
retry and failover policy every etcd call of the store goes through.

Theory of operation:
  * Several endpoints (``etcd://a:2379,b:2379,c:2379/scope``, the members of
    one cluster): the client is ``MultiEndpointEtcd3Client([Endpoint(host,
    port, secure=False, time_retry=0.5), ...], failover=True)``.  pyetcd
    fails over but never retries: a call that fails with UNAVAILABLE /
    DEADLINE_EXCEEDED / INTERNAL marks its endpoint failed for ``time_retry``
    (0.5 s, so a restarted member is used again soon) and the NEXT call goes
    to the first endpoint not marked; when every endpoint is marked, the call
    raises NoServerAvailableError before sending anything.  The retry policy
    is ours (``EtcdConnection.call``), bounded by ``read_retry`` seconds:
      - reads (get, list, revision) are retried on any MetadataUnavailable:
        they are idempotent, and the retry lands on the next endpoint;
      - writes (txn, put, delete, lease grant) are retried ONLY when nothing
        was sent (NoServerAvailableError) or the member refused it for want
        of a leader (below).  A write that reached an endpoint and failed
        there otherwise has an unknown outcome and surfaces as
        MetadataUnavailable (``endpoints=`` names the endpoints this
        operation tried); callers re-read and decide.
  * Every request (and watch) carries ``hasleader: true``, as etcd's own
    client does with ``WithRequireLeader``: a member without a leader (cut
    off from the majority, or in an election) refuses it at once in its gRPC
    interceptor, before the request is looked at, with "etcdserver: no
    leader"; that marks the endpoint failed and the retry goes to another
    member.  Without it such a member holds each request until the RPC
    timeout, and is chosen again 0.5 s later.
    So an operation returns or raises within ``read_retry + timeout`` seconds
    (``timeout`` bounds one RPC), with or without a quorum.
  * gRPC channels reconnect with backoff; it is capped at 1 s here so a
    member that was down for a minute is used again within a second of its
    return, not after gRPC's default 120 s cap.
  * Security (``EtcdSecurity``, pybk_spark/metadata/security.py): with
    ``etcd_ca_file`` / ``etcd_cert_file`` every endpoint is a TLS channel
    (server verified against the CA; the client certificate presented when
    etcd runs with --client-cert-auth).  With ``etcd_user`` the connection
    authenticates lazily, on its first call (so opening a store never blocks),
    and sends the token as call metadata.  A token etcd no longer accepts
    (expired simple token, auth store revision moved on) is renewed once and
    the call repeated: the refused call was not applied.  Refusals are
    ``MetadataUnauthorized`` at once, without retries, with a message naming
    the setting to fix: an untrusted server certificate (etcd_ca_file), a
    refused client certificate (etcd_cert_file / etcd_key_file), a wrong
    password or deleted user (etcd_user / etcd_password_file), a permission
    the user's role lacks (docs/operations.md, "Securing etcd").  A
    plaintext client against a TLS etcd sees the socket closed:
    ``MetadataUnavailable`` with a hint to set etcd_ca_file.
  * etcd and gRPC exceptions become ``pybk_spark.errors`` only through
    ``etcd_errors.translate``, which every call here and the watch and
    keep-alive RPCs wrap.
"""
from __future__ import annotations

import threading
import time
from typing import Any, Callable, Iterable

import grpc
import pyetcd
from pyetcd import etcdrpc
from pyetcd import exceptions as etcd_exc

from pybk_spark import errors
from pybk_spark.metadata import etcd_errors
from pybk_spark.metadata.etcd_refusals import StaleToken
from pybk_spark.metadata.security import EtcdSecurity

# Reconnect quickly after a member returns (gRPC's default backoff grows to 120 s).
_CHANNEL_OPTIONS = [("grpc.initial_reconnect_backoff_ms", 200),
                    ("grpc.min_reconnect_backoff_ms", 200),
                    ("grpc.max_reconnect_backoff_ms", 1000)]


def parse_endpoints(endpoints: str | Iterable[Any]) -> list[tuple[str, int]]:
    """``"h:p,h:p"`` or an iterable of ``"h:p"`` / ``(h, p)`` -> [(h, p)]."""
    if isinstance(endpoints, str):
        endpoints = [e for e in endpoints.split(",") if e.strip()]
    out = []
    for ep in endpoints:
        if isinstance(ep, tuple):
            host, port = ep
        else:
            host, _, port = str(ep).strip().rpartition(":")
        try:
            port = int(port)
        except ValueError:
            raise errors.IncorrectParameter(f"bad etcd endpoint {ep!r}") from None
        if not host or not 0 < port < 65536:
            raise errors.IncorrectParameter(f"bad etcd endpoint {ep!r}")
        out.append((host, port))
    if not out:
        raise errors.IncorrectParameter("no etcd endpoints given")
    return out


class EtcdConnection:
    """One pyetcd client over every endpoint (one gRPC channel each, shared
    by threads), its auth token, and ``call``: an etcd call with errors
    translated and retried when that is safe."""

    def __init__(self, endpoints: str | Iterable[Any], *, timeout: float, read_retry: float,
                 security: EtcdSecurity) -> None:
        self.endpoints = parse_endpoints(endpoints)
        self.security = sec = security
        sec.validate()
        self.all_endpoints = [f"{h}:{p}" for h, p in self.endpoints]
        self.read_retry = read_retry
        self.timeout = timeout
        creds = None
        if sec.tls:
            creds = grpc.ssl_channel_credentials(sec.read_file("etcd_ca_file"),
                                                 sec.read_file("etcd_key_file"),
                                                 sec.read_file("etcd_cert_file"))
        self.password = sec.password() if sec.etcd_user else None
        self._auth_lock = threading.Lock()
        self._auth_epoch = 0                 # authentications so far (0: not yet)
        self.client = pyetcd.MultiEndpointEtcd3Client(
            [pyetcd.Endpoint(host, port, secure=sec.tls, creds=creds, time_retry=0.5,
                             opts=list(_CHANNEL_OPTIONS))
             for host, port in self.endpoints],
            failover=True, timeout=timeout)
        self.client.metadata = etcd_errors.REQUIRE_LEADER
        self.closed = False

    @property
    def auth_epoch(self) -> int:
        """How many times this connection logged in (0: not yet, or no user)."""
        return self._auth_epoch

    def endpoint_in_use(self) -> str:
        try:
            return str(self.client.endpoint_in_use.netloc)
        except AttributeError:         # no endpoint chosen yet (None)
            return ""

    # -- authentication -------------------------------------------------------------
    def _authenticate(self, seen_epoch: int) -> None:
        """Get a token for etcd_user unless another thread did since ``seen_epoch``."""
        with self._auth_lock:
            if self._auth_epoch != seen_epoch:
                return
            req = etcdrpc.AuthenticateRequest(name=self.security.etcd_user,
                                              password=self.password)
            try:
                resp = self.direct(lambda: self.client.authstub.Authenticate(req, self.timeout))
            except etcd_exc.PreconditionFailedError as exc:
                status = exc.__context__
                if not (isinstance(status, grpc.RpcError)
                        and "not enabled" in (status.details() or "")):
                    raise
                token = None                 # auth not enabled (yet): go without a token
            else:
                token = resp.token
            self.client.metadata = etcd_errors.REQUIRE_LEADER + ((("token", token),)
                                                               if token else ())
            self.client._clear_old_stubs()  # the watcher keeps the metadata it was made with
            self._auth_epoch += 1

    def ensure_auth(self) -> int:
        """Authenticate if this connection has a user and no token yet;
        returns the token's epoch (for ``renew_auth``)."""
        epoch = self._auth_epoch
        if self.password is not None and epoch == 0:
            self.call(lambda: self._authenticate(0), idempotent=True, auth=False)
        return self._auth_epoch

    def renew_auth(self, epoch: int) -> None:
        """A new token, unless another thread renewed the one of ``epoch`` already."""
        self.call(lambda: self._authenticate(epoch), idempotent=True, auth=False)

    def direct(self, rpc: Callable[[], Any]) -> Any:
        """``rpc()``, a call on a pyetcd stub made here rather than through a
        pyetcd method (for a timeout or a request pyetcd does not offer),
        failing as pyetcd's own methods do: the endpoint marked failed."""
        try:
            return rpc()
        except grpc.RpcError as exc:
            self.client._manage_grpc_errors(exc)   # marks the endpoint failed; raises
            raise

    # -- the retry policy -----------------------------------------------------------
    def call(self, fn: Callable[[], Any], *, idempotent: bool, auth: bool = True) -> Any:
        """``fn()`` with etcd errors translated; retried for ``read_retry``
        seconds when that is safe (see the module docstring).  The final
        MetadataUnavailable names the endpoints tried.  A stale auth token
        is renewed once and the call repeated."""
        deadline = time.monotonic() + self.read_retry
        delay = 0.05
        tried: list[str] = []
        renewed = False
        reason = ""                          # what the last endpoint reached said
        while True:
            try:
                epoch = self.ensure_auth() if auth else 0
                return etcd_errors.translate(fn, self.security)()
            except StaleToken as exc:
                if renewed or not auth or self.password is None:
                    raise errors.MetadataUnauthorized(
                        f"{exc}: check etcd_user / etcd_password_file") from exc.__cause__
                renewed = True
                self.renew_auth(epoch)
            except errors.MetadataUnavailable as exc:
                netloc = self.endpoint_in_use()     # the one that failed (or last chosen)
                unsent = isinstance(exc.__cause__, etcd_exc.NoServerAvailableError)
                unapplied = unsent or etcd_errors.refused_without_leader(exc)
                if not unsent or not reason:
                    reason = str(exc.args[0]) if exc.args else "etcd unavailable"
                for ep in (self.all_endpoints if unsent else [netloc]):
                    if ep and ep not in tried:
                        tried.append(ep)
                if (not (idempotent or unapplied) or self.closed
                        or time.monotonic() + delay > deadline):
                    raise errors.MetadataUnavailable(
                        reason, endpoints=",".join(tried) or ",".join(self.all_endpoints),
                    ) from exc.__cause__
                time.sleep(delay)
                delay = min(delay * 2, 0.5)

    def read(self, fn: Callable[[], Any]) -> Any:
        return self.call(fn, idempotent=True)

    def write(self, fn: Callable[[], Any]) -> Any:
        return self.call(fn, idempotent=False)

    def close(self) -> None:
        self.closed = True
        try:
            self.client.close()
        except Exception:  # noqa: BLE001 - closing etcd's channels is best effort; we are closed regardless
            pass
