"""The real MetadataStore: etcd v3 through ``pyetcd`` (etcd-sdk-python).

This module carries the port's operations on keys: reads, the CAS writes and
the scope scan.  The connection they go through (endpoints, failover, the
retry policy, TLS and authentication) is ``etcd_connection.py``; leases and
their keep-alives are ``etcd_leases.py``; the one-shot watch is
``etcd_watch.py``.

Theory of operation:
  * Keys are ``/<scope>/<key>``; versions are etcd ``mod_revision``s.
  * put-if-absent = txn(version(k) == 0 -> put); compare-and-swap =
    txn(version(k) > 0 and mod_revision(k) == expected -> put); CAS delete
    likewise.  A failed compare raises ``errors.MetadataVersion``; callers
    re-read and re-decide (``MetadataStore.update``).
  * etcd / gRPC exceptions become ``pybk_spark.errors`` only in the etcd
    modules of this package (``etcd_errors.translate``, through
    ``EtcdConnection.call``): an unreachable or timing-out etcd is
    ``MetadataUnavailable`` (outcome unknown - a write may have landed).
  * ``auth_request`` is the port of the etcd Auth API (users, roles, grants)
    that ``pybk_spark/admin/commands/etcd_roles.py`` drives.
"""
from __future__ import annotations

from typing import Any, Callable, Iterable, Mapping, Optional

from pyetcd import etcdrpc

from pybk_spark import errors
from pybk_spark.metadata import etcd_watch, keys
from pybk_spark.metadata.etcd_connection import EtcdConnection
from pybk_spark.metadata.etcd_leases import EtcdLease, EtcdLeases
from pybk_spark.metadata.security import EtcdSecurity
from pybk_spark.metadata.store import MAX_TXN_OPS, Lease, MetadataStore, Versioned


class EtcdMetadataStore(MetadataStore):
    """MetadataStore on etcd; thread-safe (one gRPC channel per endpoint, shared)."""

    def __init__(self, endpoints: str | Iterable[Any], scope: str, *, timeout: float = 10.0,
                 read_retry: float = 5.0, security: EtcdSecurity | None = None) -> None:
        scope = scope.strip("/")
        if not scope:
            raise errors.IncorrectParameter("empty metadata scope")
        self.scope = scope
        self.connection = EtcdConnection(endpoints, timeout=timeout, read_retry=read_retry,
                                         security=security or EtcdSecurity())
        self.endpoints = self.connection.endpoints
        self.security = self.connection.security
        self.leases = EtcdLeases(self.connection)
        self._prefix = f"/{scope}/"
        self._client = self.connection.client
        self._tx = self._client.transactions
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

    def _read(self, fn: Callable[[], Any]) -> Any:
        return self.connection.read(fn)

    def _write(self, fn: Callable[[], Any]) -> Any:
        return self.connection.write(fn)

    def _txn(self, compare: list[Any], success: list[Any]) -> Any:
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

    def delete_all(self, keys: Iterable[str]) -> int:
        self._check()
        full = list(dict.fromkeys(self._k(k) for k in keys))   # etcd refuses a key twice in a txn
        deleted = 0
        for at in range(0, len(full), MAX_TXN_OPS):
            _, responses = self._txn([], [self._tx.delete(k) for k in full[at:at + MAX_TXN_OPS]])
            deleted += sum(r.response_delete_range.deleted for r in responses)
        return deleted

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
        return self.leases.grant(ttl_seconds, keepalive=keepalive, on_lost=on_lost)

    def lease_time_left(self, key: str) -> Optional[float]:
        """etcd's LeaseTimeToLive of the key's lease (whole seconds; -1 from
        etcd, a lease that just ended, is 0)."""
        self._check()
        resp = self._read(lambda: self._client.get_response(self._k(key)))
        if not resp.kvs or not resp.kvs[0].lease:
            return None
        return self.leases.time_left(resp.kvs[0].lease)

    def wait_for_change(self, prefix: str, after_revision: int, timeout: float) -> bool:
        self._check()
        return etcd_watch.wait_for_change(self.connection, self._k(prefix), after_revision,
                                          timeout)

    # -- etcd Auth API (users, roles, grants): pybk_spark/admin/commands/etcd_roles.py ----------
    def auth_request(self, op: str, perm: tuple[str, str, bool] | None = None,
                     **fields: Any) -> Any:
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

        conn = self.connection
        return self._write(lambda: conn.direct(
            lambda: getattr(self._client.authstub, op)(request, conn.timeout,
                                                       metadata=self._client.metadata)))

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self.leases.stop_all()
        self.connection.close()


def _lease_id(lease: Lease | None) -> int:
    return 0 if lease is None else int(lease.id)


_SCOPE_SCAN_STEPS = 1000        # bounds a scan of a keyspace full of other layouts' keys


def _prefix_end(prefix: bytes) -> bytes:
    """The first key after every key that starts with ``prefix``."""
    return prefix[:-1] + bytes([prefix[-1] + 1])
