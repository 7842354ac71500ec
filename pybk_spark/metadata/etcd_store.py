"""The real MetadataStore: etcd v3 through ``pyetcd`` (etcd-sdk-python).

Theory of operation:
  * Keys are ``/<scope>/<key>``; versions are etcd ``mod_revision``s.
  * put-if-absent = txn(version(k) == 0 -> put); compare-and-swap =
    txn(version(k) > 0 and mod_revision(k) == expected -> put); CAS delete
    likewise.  A failed compare raises ``errors.MetadataVersion``; callers
    re-read and re-decide (``MetadataStore.update``).
  * This module is the ONLY place etcd / gRPC exceptions become
    ``pybk_spark.errors``: an unreachable or timing-out etcd is
    ``MetadataUnavailable`` (outcome unknown - a write may have landed),
    whose ``endpoints=`` names the endpoints this operation tried.
  * Several endpoints (``etcd://a:2379,b:2379,c:2379/scope``, the members of
    one cluster): the client is ``MultiEndpointEtcd3Client([Endpoint(host,
    port, secure=False, time_retry=0.5), ...], failover=True)``.  pyetcd
    fails over but never retries: a call that fails with UNAVAILABLE /
    DEADLINE_EXCEEDED / INTERNAL marks its endpoint failed for ``time_retry``
    (0.5 s, so a restarted member is used again soon) and the NEXT call goes
    to the first endpoint not marked; when every endpoint is marked, the call
    raises NoServerAvailableError before sending anything.  The retry policy
    is ours (``_call``), bounded by ``read_retry`` seconds:
      - reads (get, list, revision) are retried on any MetadataUnavailable:
        they are idempotent, and the retry lands on the next endpoint;
      - writes (txn, put, delete, lease grant) are retried ONLY when nothing
        was sent (NoServerAvailableError) or the member refused it for want
        of a leader (below).  A write that reached an endpoint and failed
        there otherwise has an unknown outcome and surfaces as
        MetadataUnavailable; callers re-read and decide.
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
  * Leases refresh themselves from a daemon thread owned by the lease object
    (every ttl/3, at most every 2 s: ``keepalive_period``; every 0.5 s after
    a failed refresh); ``revoke()`` stops the
    thread and revokes the lease.  One keep-alive round is bounded by ttl/3,
    not by ``timeout``, and moves from member to member within the round
    (each try at most half the round): a hung member (SIGSTOPped, a stalled
    disk: connections open, no answer) or one cut off from its peers holds a
    keep-alive until its deadline while the majority's leader counts the
    lease down.  Keep-alives stick to the member that answered last; one
    that timed out is tried last (``_refresh_lease``).  If etcd reports the
    lease gone, ``lease.lost`` is set and ``on_lost`` runs.
  * ``wait_for_change`` is a one-shot watch from ``after_revision + 1``.  A
    watch is a hint, not an answer: one that fails before its timeout (its
    member lost the leader, which cancels a watch that asked for one; its
    connection broke) returns True, "may have changed", so the caller reads
    again, and that read fails over to another member or raises.
  * Security (``EtcdSecurity``, pybk_spark/metadata/security.py): with
    ``etcd_ca_file`` / ``etcd_cert_file`` every endpoint is a TLS channel
    (server verified against the CA; the client certificate presented when
    etcd runs with --client-cert-auth).  With ``etcd_user`` the store
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
  * ``auth_request`` is the port of the etcd Auth API (users, roles, grants)
    that ``pybk_spark/admin/commands/etcd_roles.py`` drives.
"""
from __future__ import annotations

import logging
import threading
import time
from typing import Callable, Iterable, Mapping, Optional

import grpc
import pyetcd
from pyetcd import etcdrpc
from pyetcd import exceptions as etcd_exc

from pybk_spark import errors
from pybk_spark.metadata import etcd_errors, keys
from pybk_spark.metadata.etcd_refusals import StaleToken
from pybk_spark.metadata.security import EtcdSecurity
from pybk_spark.metadata.store import Lease, MetadataStore, Versioned, keepalive_period

log = logging.getLogger("pybk_spark.metadata")


def parse_endpoints(endpoints: str | Iterable) -> list[tuple[str, int]]:
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


class EtcdLease(Lease):
    """A lease that keeps itself alive until revoked (or found lost)."""

    def __init__(self, store: "EtcdMetadataStore", lease_id: int, ttl: int,
                 keepalive: bool, on_lost: Callable[["EtcdLease"], None] | None):
        self._store = store
        self.id = lease_id
        self.ttl = ttl
        self.lost = threading.Event()
        self._on_lost = on_lost
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None
        if keepalive:
            self._thread = threading.Thread(target=self._keepalive_loop,
                                            name=f"etcd-lease-{lease_id:x}", daemon=True)
            self._thread.start()

    def refresh(self) -> None:
        """One keep-alive; raises MetadataError if the lease no longer exists."""
        ttl = self._store._refresh_lease(self.id, self._store._keepalive_timeout(self.ttl))
        if ttl <= 0:
            self._mark_lost()
            raise errors.MetadataError("lease expired", lease=self.id)

    def _mark_lost(self) -> None:
        if not self.lost.is_set():
            self.lost.set()
            if self._on_lost is not None:
                try:
                    self._on_lost(self)
                except Exception:  # noqa: BLE001 - a callback bug must not kill the refresher
                    pass

    def _keepalive_loop(self) -> None:
        period = keepalive_period(self.ttl)
        while not self._stop.wait(period):
            try:
                self.refresh()
            except errors.MetadataUnavailable:
                period = min(keepalive_period(self.ttl), 0.5)   # etcd away: retry soon
                continue
            except errors.BKError:
                return                                         # lease gone
            period = keepalive_period(self.ttl)

    def stop_keepalive(self) -> None:
        self._stop.set()

    def revoke(self) -> None:
        self._stop.set()
        self._store._forget_lease(self)
        try:
            self._store._revoke_lease(self.id)
        except errors.MetadataError as exc:
            if isinstance(exc, errors.MetadataUnavailable):
                raise            # unknown: the keys may still be there until the TTL ends
            # already gone (expired): same end state


# Reconnect quickly after a member returns (gRPC's default backoff grows to 120 s).
_CHANNEL_OPTIONS = [("grpc.initial_reconnect_backoff_ms", 200),
                    ("grpc.min_reconnect_backoff_ms", 200),
                    ("grpc.max_reconnect_backoff_ms", 1000)]


class EtcdMetadataStore(MetadataStore):
    """MetadataStore on etcd; thread-safe (one gRPC channel per endpoint, shared)."""

    def __init__(self, endpoints: str | Iterable, scope: str, *, timeout: float = 10.0,
                 read_retry: float = 5.0, security: EtcdSecurity | None = None):
        scope = scope.strip("/")
        if not scope:
            raise errors.IncorrectParameter("empty metadata scope")
        self.scope = scope
        self.endpoints = parse_endpoints(endpoints)
        self.security = sec = security or EtcdSecurity()
        sec.validate()
        self._prefix = f"/{scope}/"
        self._all_endpoints = [f"{h}:{p}" for h, p in self.endpoints]
        self._read_retry = read_retry
        self._timeout = timeout
        creds = None
        if sec.tls:
            creds = grpc.ssl_channel_credentials(sec.read_file("etcd_ca_file"),
                                                 sec.read_file("etcd_key_file"),
                                                 sec.read_file("etcd_cert_file"))
        self._password = sec.password() if sec.etcd_user else None
        self._auth_lock = threading.Lock()
        self._auth_epoch = 0                 # authentications so far (0: not yet)
        self._client = pyetcd.MultiEndpointEtcd3Client(
            [pyetcd.Endpoint(host, port, secure=sec.tls, creds=creds, time_retry=0.5,
                             opts=list(_CHANNEL_OPTIONS))
             for host, port in self.endpoints],
            failover=True, timeout=timeout)
        self._client.metadata = etcd_errors.REQUIRE_LEADER
        self._tx = self._client.transactions
        self._leases: list[EtcdLease] = []
        self._leases_lock = threading.Lock()
        self._keepalive_preferred = ""       # the member that answered the last keep-alive
        self._keepalive_failed_at: dict[str, float] = {}
        self._closed = False

    @property
    def uri(self) -> str:
        eps = ",".join(f"{h}:{p}" for h, p in self.endpoints)
        query = self.security.query()
        return f"etcd://{eps}/{self.scope}" + (f"?{query}" if query else "")

    # -- helpers --------------------------------------------------------------
    def _k(self, key: str) -> bytes:
        return (self._prefix + key).encode()

    def _check(self) -> None:
        if self._closed:
            raise errors.ClientClosed("metadata store closed")

    def _endpoint_in_use(self) -> str:
        try:
            return self._client.endpoint_in_use.netloc
        except AttributeError:         # no endpoint chosen yet (None)
            return ""

    # -- authentication -------------------------------------------------------------
    def _authenticate(self, seen_epoch: int) -> None:
        """Get a token for etcd_user unless another thread did since ``seen_epoch``."""
        with self._auth_lock:
            if self._auth_epoch != seen_epoch:
                return
            req = etcdrpc.AuthenticateRequest(name=self.security.etcd_user,
                                              password=self._password)
            try:
                resp = self._direct(lambda: self._client.authstub.Authenticate(req, self._timeout))
            except etcd_exc.PreconditionFailedError as exc:
                status = exc.__context__
                if not (isinstance(status, grpc.RpcError)
                        and "not enabled" in (status.details() or "")):
                    raise
                token = None                 # auth not enabled (yet): go without a token
            else:
                token = resp.token
            self._client.metadata = etcd_errors.REQUIRE_LEADER + ((("token", token),)
                                                                if token else ())
            self._client._clear_old_stubs()  # the watcher keeps the metadata it was made with
            self._auth_epoch += 1

    def _direct(self, rpc):
        """``rpc()``, a call on a pyetcd stub made here rather than through a
        pyetcd method (for a timeout or a request pyetcd does not offer),
        failing as pyetcd's own methods do: the endpoint marked failed."""
        try:
            return rpc()
        except grpc.RpcError as exc:
            self._client._manage_grpc_errors(exc)   # marks the endpoint failed; raises
            raise

    def _ensure_auth(self) -> int:
        epoch = self._auth_epoch
        if self._password is not None and epoch == 0:
            self._call(lambda: self._authenticate(0), idempotent=True, auth=False)
        return self._auth_epoch

    def _call(self, fn, *, idempotent: bool, auth: bool = True):
        """``fn()`` with etcd errors translated; retried for ``read_retry``
        seconds when that is safe (see the module docstring).  The final
        MetadataUnavailable names the endpoints tried.  A stale auth token
        is renewed once and the call repeated."""
        deadline = time.monotonic() + self._read_retry
        delay = 0.05
        tried: list[str] = []
        renewed = False
        reason = ""                          # what the last endpoint reached said
        while True:
            try:
                epoch = self._ensure_auth() if auth else 0
                return etcd_errors.translate(fn, self.security)()
            except StaleToken as exc:
                if renewed or not auth or self._password is None:
                    raise errors.MetadataUnauthorized(
                        f"{exc}: check etcd_user / etcd_password_file") from exc.__cause__
                renewed = True
                self._call(lambda: self._authenticate(epoch), idempotent=True, auth=False)  # noqa: B023
            except errors.MetadataUnavailable as exc:
                netloc = self._endpoint_in_use()     # the one that failed (or last chosen)
                unsent = isinstance(exc.__cause__, etcd_exc.NoServerAvailableError)
                unapplied = unsent or etcd_errors.refused_without_leader(exc)
                if not unsent or not reason:
                    reason = str(exc.args[0]) if exc.args else "etcd unavailable"
                for ep in (self._all_endpoints if unsent else [netloc]):
                    if ep and ep not in tried:
                        tried.append(ep)
                if (not (idempotent or unapplied) or self._closed
                        or time.monotonic() + delay > deadline):
                    raise errors.MetadataUnavailable(
                        reason, endpoints=",".join(tried) or ",".join(self._all_endpoints),
                    ) from exc.__cause__
                time.sleep(delay)
                delay = min(delay * 2, 0.5)

    def _read(self, fn):
        return self._call(fn, idempotent=True)

    def _write(self, fn):
        return self._call(fn, idempotent=False)

    def _txn(self, compare, success):
        return self._write(lambda: self._client.transaction(compare=compare, success=success,
                                                            failure=[]))

    # -- the port -------------------------------------------------------------
    def get(self, key: str) -> Optional[Versioned]:
        self._check()
        resp = self._read(lambda: self._client.get_response(self._k(key)))
        if not resp.kvs:
            return None
        kv = resp.kvs[0]
        return Versioned(bytes(kv.value), kv.mod_revision)

    def current_revision(self) -> int:
        """The store's revision now (use as ``after_revision`` for waits)."""
        self._check()
        resp = self._read(lambda: self._client.get_response(self._k(""), count_only=True))
        return resp.header.revision

    def put_if_absent(self, key: str, value: bytes, lease: Lease | None = None) -> int:
        self._check()
        k = self._k(key)
        ok, responses = self._txn([self._tx.version(k) == 0],
                                  [self._tx.put(k, bytes(value), lease=_lease_id(lease))])
        if not ok:
            raise errors.MetadataVersion("key exists", key=key)
        return responses[0].response_put.header.revision

    def compare_and_swap(self, key: str, value: bytes, expected_version: int,
                         lease: Lease | None = None) -> int:
        self._check()
        k = self._k(key)
        ok, responses = self._txn(
            [self._tx.version(k) > 0, self._tx.mod(k) == int(expected_version)],
            [self._tx.put(k, bytes(value), lease=_lease_id(lease))])
        if not ok:
            raise errors.MetadataVersion("version conflict", key=key, expected=expected_version)
        return responses[0].response_put.header.revision

    def swap_with(self, key: str, value: bytes, expected_version: int,
                  creates: Mapping[str, bytes], deletes: Iterable[str] = ()) -> int:
        self._check()
        k = self._k(key)
        compare = [self._tx.version(k) > 0, self._tx.mod(k) == int(expected_version)]
        success = [self._tx.put(k, bytes(value))]
        for ck, cv in creates.items():
            compare.append(self._tx.version(self._k(ck)) == 0)
            success.append(self._tx.put(self._k(ck), bytes(cv)))
        success += [self._tx.delete(self._k(dk)) for dk in deletes]
        ok, responses = self._txn(compare, success)
        if not ok:
            raise errors.MetadataVersion("version conflict", key=key, expected=expected_version)
        return responses[0].response_put.header.revision

    def put(self, key: str, value: bytes, lease: Lease | None = None) -> int:
        self._check()
        k = self._k(key)
        resp = self._write(lambda: self._client.put(k, bytes(value), lease=_lease_id(lease)))
        return resp.header.revision

    def delete(self, key: str, expected_version: int | None = None) -> bool:
        self._check()
        k = self._k(key)
        if expected_version is None:
            resp = self._write(lambda: self._client.delete(k, return_response=True))
            return resp.deleted >= 1
        ok, responses = self._txn(
            [self._tx.version(k) > 0, self._tx.mod(k) == int(expected_version)],
            [self._tx.delete(k)])
        if not ok:
            raise errors.MetadataVersion("version conflict on delete", key=key,
                                         expected=expected_version)
        return responses[0].response_delete_range.deleted >= 1

    def list_prefix(self, prefix: str) -> list[tuple[str, Versioned]]:
        self._check()
        full = self._k(prefix)
        resp = self._read(lambda: self._client.get_prefix_response(full, sort_order="ascend",
                                                                   sort_target="key"))
        n = len(self._prefix.encode())
        return [(bytes(kv.key)[n:].decode(), Versioned(bytes(kv.value), kv.mod_revision))
                for kv in resp.kvs]

    def scopes_with(self, prefix: str) -> list[str]:
        """A skip scan: the first key from a cursor names a scope (keys.scope_of);
        one count of ``/<scope>/<prefix>``, then the cursor jumps past the whole
        scope.  Two small requests per scope, however many keys each holds."""
        self._check()
        found: list[str] = []
        cursor, end = b"/", b"0"                  # every key that starts with "/"
        for _ in range(_SCOPE_SCAN_STEPS):
            resp = self._read(lambda c=cursor: self._client.get_range_response(  # type: ignore[misc]
                c, end, limit=1, keys_only=True))
            if not resp.kvs:
                break
            key = bytes(resp.kvs[0].key)
            scope = keys.scope_of(key.decode("utf-8", "replace"))
            if scope is None:                     # another layout's key: step over it
                cursor = key + b"\0"
                continue
            root = f"/{scope}/".encode()
            counted = self._read(lambda r=root: self._client.get_prefix_response(  # type: ignore[misc]
                r + prefix.encode(), count_only=True))
            if counted.count:
                found.append(scope)
            cursor = _prefix_end(root)
        return sorted(found)

    def grant_lease(self, ttl_seconds: int, *, keepalive: bool = True,
                    on_lost: Callable[[EtcdLease], None] | None = None) -> EtcdLease:
        """A lease refreshed by its own daemon thread (unless keepalive=False)."""
        self._check()
        if ttl_seconds < 1:
            raise errors.IncorrectParameter("lease ttl must be >= 1 s", ttl=ttl_seconds)
        raw = self._write(lambda: self._client.lease(int(ttl_seconds)))
        lease = EtcdLease(self, raw.id, int(raw.ttl), keepalive, on_lost)
        with self._leases_lock:
            self._leases.append(lease)
        return lease

    def lease_time_left(self, key: str) -> Optional[float]:
        """etcd's LeaseTimeToLive of the key's lease (whole seconds; -1 from
        etcd, a lease that just ended, is 0)."""
        self._check()
        resp = self._read(lambda: self._client.get_response(self._k(key)))
        if not resp.kvs or not resp.kvs[0].lease:
            return None
        lease_id = resp.kvs[0].lease
        info = self._read(lambda: self._direct(lambda: self._client.leasestub.LeaseTimeToLive(
            etcdrpc.LeaseTimeToLiveRequest(ID=lease_id), self._timeout,
            credentials=self._client.call_credentials, metadata=self._client.metadata)))
        return float(max(0, info.TTL))

    def _forget_lease(self, lease: EtcdLease) -> None:
        with self._leases_lock:
            if lease in self._leases:
                self._leases.remove(lease)

    def _refresh_lease(self, lease_id: int, budget: float) -> int:
        """One keep-alive, tried member by member within ``budget`` seconds
        (not the store's RPC timeout); returns the TTL the first member to
        answer reports (0: the lease is gone).

        A hung member (stopped process, stalled disk: its connections stay
        open, nothing answers) or one cut off from its peers holds a
        keep-alive until the deadline, while the majority's leader counts the
        lease down, so the keep-alive must reach another member within the
        same round.  Each try gets at most half the budget; the member that
        answered last is tried first (a keep-alive sticks to a healthy
        member), the others in the order of their last keep-alive failure,
        oldest first, so a member that just timed out is tried last (one
        member alone gets the whole budget).  A
        member that timed out is also marked failed for the store's other
        calls (as a failed pyetcd call marks it).  A keep-alive is idempotent,
        so trying another member after a timeout is safe."""
        request = etcdrpc.LeaseKeepAliveRequest(ID=lease_id)
        deadline = time.monotonic() + budget
        per_try = budget / 2.0 if len(self._all_endpoints) > 1 else budget
        tried: list[str] = []
        last: Optional[errors.MetadataUnavailable] = None
        for netloc in self._keepalive_order():
            left = deadline - time.monotonic()
            if left <= 0.05:
                break
            tried.append(netloc)
            try:
                ttl = self._keepalive_at(netloc, request, min(per_try, left))
            except errors.MetadataUnavailable as exc:
                last = exc
                self._keepalive_failed(netloc)
                continue
            self._keepalive_preferred = netloc
            return ttl
        raise errors.MetadataUnavailable(
            str(last.args[0]) if last is not None and last.args else "etcd unavailable",
            endpoints=",".join(tried) or ",".join(self._all_endpoints),
        ) from (last.__cause__ if last is not None else None)

    def _keepalive_order(self) -> list[str]:
        rest = sorted((ep for ep in self._all_endpoints if ep != self._keepalive_preferred),
                      key=lambda ep: self._keepalive_failed_at.get(ep, 0.0))
        return ([self._keepalive_preferred] if self._keepalive_preferred else []) + rest

    def _keepalive_failed(self, netloc: str) -> None:
        self._keepalive_failed_at[netloc] = time.monotonic()
        if self._keepalive_preferred == netloc:
            self._keepalive_preferred = ""
        if self._endpoint_in_use() == netloc:
            self._client.endpoint_in_use.fail()
            self._client._clear_old_stubs()

    def _keepalive_at(self, netloc: str, request, timeout: float) -> int:
        """One LeaseKeepAlive on member ``netloc``; MetadataUnavailable when it
        does not answer in ``timeout`` s or refuses for want of a leader.  A
        stale auth token is renewed once and the keep-alive repeated."""
        stub = etcdrpc.LeaseStub(self._client.endpoints[netloc].channel)

        def once() -> int:
            responses = etcd_errors.translate(lambda: list(stub.LeaseKeepAlive(
                iter([request]), timeout, credentials=self._client.call_credentials,
                metadata=self._client.metadata)), self.security)()
            return responses[-1].TTL if responses else 0
        epoch = self._ensure_auth()
        try:
            return once()
        except StaleToken as exc:
            if self._password is None:
                raise errors.MetadataUnauthorized(
                    f"{exc}: check etcd_user / etcd_password_file") from exc.__cause__
        self._call(lambda: self._authenticate(epoch), idempotent=True, auth=False)
        return once()

    def _keepalive_timeout(self, ttl: int) -> float:
        """The bound of one keep-alive round of a ``ttl`` s lease: a third of
        the ttl (at least 1 s, at most the store's RPC timeout), tried on two
        members at least, so that a round every ttl/3 that meets a hung member
        still reaches a live one well before the lease ends."""
        return min(self._timeout, max(1.0, ttl / 3.0))

    def _revoke_lease(self, lease_id: int) -> None:
        self._write(lambda: self._client.revoke_lease(lease_id))

    def wait_for_change(self, prefix: str, after_revision: int, timeout: float) -> bool:
        self._check()
        full = self._k(prefix)
        if timeout <= 0:
            return False
        epoch = self._ensure_auth()
        try:
            resp = etcd_errors.translate(self._client.watch_prefix_once_response, self.security)(
                full, timeout=timeout, start_revision=int(after_revision) + 1)
        except StaleToken:
            self._call(lambda: self._authenticate(epoch), idempotent=True, auth=False)
            return True            # not watched: something may have changed
        except errors.MetadataUnavailable as exc:
            if isinstance(exc.__cause__, etcd_exc.WatchTimedOut):
                return False
            return self._lost_watch(exc, timeout)
        except errors.MetadataError as exc:
            if isinstance(exc.__cause__, etcd_exc.RevisionCompactedError):
                return True        # history gone: something may have changed
            raise
        if isinstance(resp, BaseException) and not isinstance(
                resp, etcd_exc.RevisionCompactedError):   # the stream ended (no leader, ...)
            return self._lost_watch(resp, timeout)
        return True     # a change, or history compacted: something may have changed

    def _lost_watch(self, error: BaseException, timeout: float) -> bool:
        """A watch that ended without an answer (its member lost the leader,
        which ends the watch streams that asked for one; a broken
        connection): a lost hint, not an error.  True, "may have changed":
        the caller reads again, and that read fails over to another member or
        raises.  Paced, for a caller that loops on a failing watch."""
        log.info("event=etcd_watch_failed endpoints=%s error=%r (read again)",
                 self._endpoint_in_use(), error)
        time.sleep(min(timeout, 0.1))
        return True

    # -- etcd Auth API (users, roles, grants): pybk_spark/admin/commands/etcd_roles.py ----------
    def auth_request(self, op: str, perm: tuple[str, str, bool] | None = None, **fields):
        """One etcd Auth API call: ``op`` names the RPC ("UserAdd", "RoleGet",
        "RoleGrantPermission", "AuthEnable", ...), ``fields`` its request's
        fields, ``perm`` a ``(READ|WRITE|READWRITE, key, is_prefix)`` grant on
        a key relative to this store's scope.  Returns the protobuf response.
        Not retried (a write); MetadataError / MetadataUnauthorized."""
        self._check()
        name = op if op.startswith("Auth") else f"Auth{op}"
        if perm is not None:
            kind, key, is_prefix = perm
            start = self._k(key)
            end = (start[:-1] + bytes([start[-1] + 1])) if is_prefix else b""
            fields["perm"] = etcdrpc.Permission(permType=getattr(etcdrpc.Permission, kind),
                                                key=start, range_end=end)
        try:
            request = getattr(etcdrpc, f"{name}Request")(**fields)
        except (AttributeError, TypeError, ValueError) as exc:
            raise errors.IncorrectParameter(f"bad etcd auth request {op}: {exc}") from None

        return self._write(lambda: self._direct(
            lambda: getattr(self._client.authstub, op)(request, self._timeout,
                                                       metadata=self._client.metadata)))

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        with self._leases_lock:
            leases, self._leases = self._leases, []
        for lease in leases:
            lease.stop_keepalive()
        try:
            self._client.close()
        except Exception:  # noqa: BLE001 - closing etcd's channels is best effort; we are closed regardless
            pass


def _lease_id(lease: Lease | None) -> int:
    return 0 if lease is None else int(lease.id)


_SCOPE_SCAN_STEPS = 1000        # bounds a scan of a keyspace full of other layouts' keys


def _prefix_end(prefix: bytes) -> bytes:
    """The first key after every key that starts with ``prefix``."""
    return prefix[:-1] + bytes([prefix[-1] + 1])
