"""In-process twin of the etcd metadata store (tests and simulation).

Theory of operation: one global revision counter, bumped by every successful
write (put, CAS, delete, lease expiry); each key remembers the revision of its
last modification (``mod_revision``) and that is the version callers see, just
as in etcd.  Every mutation happens under one lock, so CAS is atomic and the
revision order is a total order of writes.

Leases: ``grant_lease`` returns a ``MemoryLease`` whose deadline is measured
with the injected ``clock`` (default ``time.monotonic``).  Expiry is explicit
and deterministic: every store operation first calls ``expire_leases()``,
which deletes the keys of every lease whose deadline has passed, so a
simulation that advances its fake clock sees keys vanish on its next call.
There is no background thread in the store; ``MemoryLease.start_keepalive``
mirrors the etcd lease's refresher for code that wants one.

Named stores: ``MemoryMetadataStore.named(name)`` returns the process-wide
instance for ``memory://NAME`` so that several clients in one process share
one store (``close()`` of one handle does not destroy shared state).
"""
from __future__ import annotations

import itertools
import threading
import time
from typing import Callable, Iterable, Mapping, Optional

from pybk_spark import errors
from pybk_spark.metadata import keys
from pybk_spark.metadata.store import MAX_TXN_OPS, Lease, MetadataStore, Versioned


class _Shared:
    """The state behind one named store."""

    def __init__(self, clock: Callable[[], float]):
        self.clock = clock
        self.cond = threading.Condition()
        self.revision = 1                       # etcd starts at 1 too
        self.data: dict[str, tuple[bytes, int, int]] = {}   # key -> (value, mod_rev, lease_id)
        self.changes: list[tuple[int, str]] = []            # (revision, key) log for waits
        self.trimmed = 0                                    # changes <= this were dropped
        self.leases: dict[int, "MemoryLease"] = {}
        self.lease_ids = itertools.count(0x1000)


class MemoryLease(Lease):
    def __init__(self, shared: _Shared, lease_id: int, ttl: int, on_lost=None):
        super().__init__(lease_id, ttl, on_lost)
        self._shared = shared
        self.deadline = shared.clock() + ttl
        self.revoked = False
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None

    def refresh(self) -> None:
        with self._shared.cond:
            if not self.revoked and self._shared.clock() >= self.deadline:
                self.revoked = True
                _drop_lease(self._shared, self.id)
                self._mark_lost()
            if self.revoked or self.id not in self._shared.leases:
                raise errors.MetadataError("lease expired or revoked", lease=self.id)
            self.deadline = self._shared.clock() + self.ttl

    def start_keepalive(self, interval: float | None = None) -> None:
        """Refresh from a daemon thread (real-time) until revoke()."""
        period = interval if interval is not None else max(self.ttl / 3.0, 0.1)

        def loop():
            while not self._stop.wait(period):
                try:
                    self.refresh()
                except errors.BKError:
                    return
        self._thread = threading.Thread(target=loop, name=f"memlease-{self.id:x}", daemon=True)
        self._thread.start()

    def revoke(self) -> None:
        self._stop.set()
        with self._shared.cond:
            if self.revoked:
                return
            self.revoked = True
            _drop_lease(self._shared, self.id)


def _bump(shared: _Shared, key: str) -> int:
    shared.revision += 1
    shared.changes.append((shared.revision, key))
    if len(shared.changes) > 10000:
        shared.trimmed = shared.changes[4999][0]
        del shared.changes[:5000]
    shared.cond.notify_all()
    return shared.revision


def _drop_lease(shared: _Shared, lease_id: int) -> None:
    """Caller holds the lock: remove a lease and delete its keys."""
    shared.leases.pop(lease_id, None)
    for key in [k for k, (_, _, lid) in shared.data.items() if lid == lease_id]:
        del shared.data[key]
        _bump(shared, key)


_REGISTRY: dict[str, _Shared] = {}
_REGISTRY_LOCK = threading.Lock()
MAX_REQUEST_BYTES = 3 << 19          # etcd's default --max-request-bytes: 1.5 MiB


class MemoryMetadataStore(MetadataStore):
    """Thread-safe in-memory MetadataStore with etcd's semantics."""

    def __init__(self, scope: str = "", clock: Callable[[], float] = time.monotonic,
                 _shared: _Shared | None = None):
        self._shared = _shared or _Shared(clock)
        self._prefix = f"/{scope}/" if scope else "/"
        self._closed = False

    @classmethod
    def named(cls, name: str, scope: str = "") -> "MemoryMetadataStore":
        """The process-wide store for ``memory://NAME``."""
        with _REGISTRY_LOCK:
            shared = _REGISTRY.get(name)
            if shared is None:
                shared = _REGISTRY[name] = _Shared(time.monotonic)
        return cls(scope, _shared=shared)

    @staticmethod
    def forget(name: str) -> None:
        """Drop a named store from the registry (tests)."""
        with _REGISTRY_LOCK:
            _REGISTRY.pop(name, None)

    # -- helpers --------------------------------------------------------------
    def _k(self, key: str) -> str:
        return self._prefix + key

    def _check(self) -> None:
        if self._closed:
            raise errors.ClientClosed("metadata store closed")
        self.expire_leases()

    def _fits(self, key: str, value: bytes) -> None:
        self._fits_bytes(len(key) + len(value))

    @staticmethod
    def _fits_bytes(size: int) -> None:
        """etcd refuses a request over its --max-request-bytes (1.5 MiB by
        default); the twin refuses keys and values over that."""
        if size > MAX_REQUEST_BYTES:
            raise errors.MetadataTooLarge.refused("etcdserver: request is too large")

    def _lease_id(self, lease: Lease | None) -> int:
        if lease is None:
            return 0
        if lease.id not in self._shared.leases:
            raise errors.MetadataError("lease expired or revoked", lease=lease.id)
        return lease.id

    def expire_leases(self) -> int:
        """Delete keys of every lease past its deadline; returns how many expired."""
        sh = self._shared
        with sh.cond:
            now = sh.clock()
            dead = [lid for lid, lease in sh.leases.items() if lease.deadline <= now]
            expired = [sh.leases[lid] for lid in dead]
            for lease in expired:
                lease.revoked = True
                _drop_lease(sh, lease.id)
        for lease in expired:
            lease._mark_lost()
        return len(dead)

    def current_revision(self) -> int:
        """The store's revision now (use as ``after_revision`` for waits)."""
        return self._shared.revision

    # -- the port -------------------------------------------------------------
    def lease_time_left(self, key: str) -> Optional[float]:
        self._check()
        sh = self._shared
        with sh.cond:
            item = sh.data.get(self._k(key))
            lease = sh.leases.get(item[2]) if item is not None and item[2] else None
            return None if lease is None else max(0.0, lease.deadline - sh.clock())

    def get(self, key: str) -> Optional[Versioned]:
        self._check()
        with self._shared.cond:
            item = self._shared.data.get(self._k(key))
            return None if item is None else Versioned(item[0], item[1])

    def put_if_absent(self, key: str, value: bytes, lease: Lease | None = None) -> int:
        self._check()
        self._fits(key, value)
        sh = self._shared
        with sh.cond:
            k = self._k(key)
            if k in sh.data:
                raise errors.MetadataVersion("key exists", key=key)
            lid = self._lease_id(lease)
            rev = _bump(sh, k)
            sh.data[k] = (bytes(value), rev, lid)
            return rev

    def compare_and_swap(self, key: str, value: bytes, expected_version: int,
                         lease: Lease | None = None) -> int:
        self._check()
        self._fits(key, value)
        sh = self._shared
        with sh.cond:
            k = self._k(key)
            item = sh.data.get(k)
            if item is None or item[1] != expected_version:
                raise errors.MetadataVersion(
                    "version conflict", key=key, expected=expected_version,
                    actual=None if item is None else item[1])
            lid = self._lease_id(lease)
            rev = _bump(sh, k)
            sh.data[k] = (bytes(value), rev, lid)
            return rev

    def swap_with(self, key: str, value: bytes, expected_version: int,
                  creates: Mapping[str, bytes], deletes: Iterable[str] = ()) -> int:
        self._check()
        deletes = list(deletes)
        self._fits_bytes(len(key) + len(value) + sum(len(k) for k in deletes)
                         + sum(len(k) + len(v) for k, v in creates.items()))
        sh = self._shared
        with sh.cond:
            k = self._k(key)
            item = sh.data.get(k)
            if (item is None or item[1] != expected_version
                    or any(self._k(c) in sh.data for c in creates)):
                raise errors.MetadataVersion(
                    "version conflict", key=key, expected=expected_version,
                    actual=None if item is None else item[1])
            rev = _bump(sh, k)                  # one transaction, one revision (as etcd)
            sh.data[k] = (bytes(value), rev, 0)
            for c, v in creates.items():
                sh.data[self._k(c)] = (bytes(v), rev, 0)
                sh.changes.append((rev, self._k(c)))
            for d in deletes:
                if sh.data.pop(self._k(d), None) is not None:
                    sh.changes.append((rev, self._k(d)))
            return rev

    def put(self, key: str, value: bytes, lease: Lease | None = None) -> int:
        self._check()
        self._fits(key, value)
        sh = self._shared
        with sh.cond:
            k = self._k(key)
            lid = self._lease_id(lease)
            rev = _bump(sh, k)
            sh.data[k] = (bytes(value), rev, lid)
            return rev

    def delete(self, key: str, expected_version: int | None = None) -> bool:
        self._check()
        sh = self._shared
        with sh.cond:
            k = self._k(key)
            item = sh.data.get(k)
            if expected_version is not None and (item is None or item[1] != expected_version):
                raise errors.MetadataVersion(
                    "version conflict on delete", key=key, expected=expected_version,
                    actual=None if item is None else item[1])
            if item is None:
                return False
            del sh.data[k]
            _bump(sh, k)
            return True

    def delete_all(self, keys: Iterable[str]) -> int:
        self._check()
        full = list(dict.fromkeys(self._k(k) for k in keys))   # as etcd's adapter sends them
        sh = self._shared
        deleted = 0
        for at in range(0, len(full), MAX_TXN_OPS):
            with sh.cond:
                present = [k for k in full[at:at + MAX_TXN_OPS] if k in sh.data]
                if not present:                 # a transaction that changes nothing: no revision
                    continue
                rev = _bump(sh, present[0])     # one transaction, one revision (as etcd)
                for k in present:
                    del sh.data[k]
                    if k != present[0]:
                        sh.changes.append((rev, k))
                deleted += len(present)
        return deleted

    def list_prefix(self, prefix: str) -> list[tuple[str, Versioned]]:
        self._check()
        full = self._k(prefix)
        n = len(self._prefix)
        with self._shared.cond:
            items = [(k[n:], Versioned(v, rev)) for k, (v, rev, _) in self._shared.data.items()
                     if k.startswith(full)]
        items.sort(key=lambda kv: kv[0].encode())
        return items

    def scopes_with(self, prefix: str) -> list[str]:
        self._check()
        with self._shared.cond:
            names = list(self._shared.data)
        found = set()
        for k in names:
            scope = keys.scope_of(k)
            if scope is not None and k.startswith(f"/{scope}/{prefix}"):
                found.add(scope)
        return sorted(found)

    def grant_lease(self, ttl_seconds: int, *, keepalive: bool = True,
                    on_lost=None) -> Lease:
        """Like the etcd lease: refreshed from a daemon thread unless
        keepalive=False (simulations with a fake clock pass False)."""
        self._check()
        if ttl_seconds < 1:
            raise errors.IncorrectParameter("lease ttl must be >= 1 s", ttl=ttl_seconds)
        sh = self._shared
        with sh.cond:
            lease = MemoryLease(sh, next(sh.lease_ids), int(ttl_seconds), on_lost)
            sh.leases[lease.id] = lease
        if keepalive:
            lease.start_keepalive()
        return lease

    def wait_for_change(self, prefix: str, after_revision: int, timeout: float) -> bool:
        """Real-time wait (for simulation with a fake clock, poll revision instead)."""
        self._check()
        full = self._k(prefix)
        sh = self._shared
        deadline = time.monotonic() + timeout

        def changed() -> bool:
            if sh.trimmed > after_revision:
                return True           # history trimmed: answer conservatively
            for rev, key in reversed(sh.changes):
                if rev <= after_revision:
                    return False
                if key.startswith(full):
                    return True
            return False

        with sh.cond:
            while True:
                if changed():
                    return True
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return False
                sh.cond.wait(min(remaining, 0.05))
                self.expire_leases()

    def close(self) -> None:
        self._closed = True
