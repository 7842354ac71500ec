"""etcd leases for the store: granting, keeping alive, revoking.

Theory of operation:
  * A lease refreshes itself from a daemon thread owned by the lease object
    (every ttl/3, at most every 2 s: ``keepalive_period``; every 0.5 s after
    a failed refresh); ``revoke()`` stops the thread and revokes the lease.
  * One keep-alive round is bounded by ttl/3, not by the store's RPC
    ``timeout``, and moves from member to member within the round (each try
    at most half the round): a hung member (SIGSTOPped, a stalled disk:
    connections open, no answer) or one cut off from its peers holds a
    keep-alive until its deadline while the majority's leader counts the
    lease down.  Keep-alives stick to the member that answered last; one
    that timed out is tried last (``EtcdLeases.refresh``).
  * If etcd reports the lease gone, ``lease.lost`` is set and ``on_lost``
    runs.
"""
from __future__ import annotations

import threading
import time
from typing import Callable, Optional

from pyetcd import etcdrpc

from pybk_spark import errors
from pybk_spark.metadata import etcd_errors
from pybk_spark.metadata.etcd_connection import EtcdConnection
from pybk_spark.metadata.etcd_refusals import StaleToken
from pybk_spark.metadata.store import Lease, keepalive_period


class EtcdLease(Lease):
    """A lease that keeps itself alive until revoked (or found lost)."""

    def __init__(self, leases: EtcdLeases, lease_id: int, ttl: int,
                 keepalive: bool, on_lost: Callable[[EtcdLease], None] | None) -> None:
        super().__init__(lease_id, ttl, on_lost)
        self._leases = leases
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None
        if keepalive:
            self._thread = threading.Thread(target=self._keepalive_loop,
                                            name=f"etcd-lease-{lease_id:x}", daemon=True)
            self._thread.start()

    def refresh(self) -> None:
        """One keep-alive; raises MetadataError if the lease no longer exists."""
        ttl = self._leases.refresh(self.id, self._leases.round_budget(self.ttl))
        if ttl <= 0:
            self._mark_lost()
            raise errors.MetadataError("lease expired", lease=self.id)

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
        self._leases.forget(self)
        try:
            self._leases.revoke(self.id)
        except errors.MetadataError as exc:
            if isinstance(exc, errors.MetadataUnavailable):
                raise            # unknown: the keys may still be there until the TTL ends
            # already gone (expired): same end state


class EtcdLeases:
    """The leases a store granted and the member their keep-alives go to."""

    def __init__(self, conn: EtcdConnection) -> None:
        self._conn = conn
        self._leases: list[EtcdLease] = []
        self._lock = threading.Lock()
        self.preferred = ""                  # the member that answered the last keep-alive
        self._failed_at: dict[str, float] = {}

    def grant(self, ttl_seconds: int, *, keepalive: bool,
              on_lost: Callable[[EtcdLease], None] | None) -> EtcdLease:
        if ttl_seconds < 1:
            raise errors.IncorrectParameter("lease ttl must be >= 1 s", ttl=ttl_seconds)
        raw = self._conn.write(lambda: self._conn.client.lease(int(ttl_seconds)))
        lease = EtcdLease(self, raw.id, int(raw.ttl), keepalive, on_lost)
        with self._lock:
            self._leases.append(lease)
        return lease

    def time_left(self, lease_id: int) -> float:
        """etcd's LeaseTimeToLive of ``lease_id`` (whole seconds; -1 from
        etcd, a lease that just ended, is 0)."""
        client = self._conn.client
        info = self._conn.read(lambda: self._conn.direct(lambda: client.leasestub.LeaseTimeToLive(
            etcdrpc.LeaseTimeToLiveRequest(ID=lease_id), self._conn.timeout,
            credentials=client.call_credentials, metadata=client.metadata)))
        return float(max(0, info.TTL))

    def forget(self, lease: EtcdLease) -> None:
        with self._lock:
            if lease in self._leases:
                self._leases.remove(lease)

    def revoke(self, lease_id: int) -> None:
        self._conn.write(lambda: self._conn.client.revoke_lease(lease_id))

    def stop_all(self) -> None:
        """Stop every lease's keep-alive (the store is closing; etcd lets them expire)."""
        with self._lock:
            leases, self._leases = self._leases, []
        for lease in leases:
            lease.stop_keepalive()

    # -- keep-alives --------------------------------------------------------------------
    def refresh(self, lease_id: int, budget: float) -> int:
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
        per_try = budget / 2.0 if len(self._conn.all_endpoints) > 1 else budget
        tried: list[str] = []
        last: Optional[errors.MetadataUnavailable] = None
        for netloc in self._order():
            left = deadline - time.monotonic()
            if left <= 0.05:
                break
            tried.append(netloc)
            try:
                ttl = self._keepalive_at(netloc, request, min(per_try, left))
            except errors.MetadataUnavailable as exc:
                last = exc
                self._failed(netloc)
                continue
            self.preferred = netloc
            return ttl
        raise errors.MetadataUnavailable(
            str(last.args[0]) if last is not None and last.args else "etcd unavailable",
            endpoints=",".join(tried) or ",".join(self._conn.all_endpoints),
        ) from (last.__cause__ if last is not None else None)

    def _order(self) -> list[str]:
        rest = sorted((ep for ep in self._conn.all_endpoints if ep != self.preferred),
                      key=lambda ep: self._failed_at.get(ep, 0.0))
        return ([self.preferred] if self.preferred else []) + rest

    def _failed(self, netloc: str) -> None:
        self._failed_at[netloc] = time.monotonic()
        if self.preferred == netloc:
            self.preferred = ""
        if self._conn.endpoint_in_use() == netloc:
            self._conn.client.endpoint_in_use.fail()
            self._conn.client._clear_old_stubs()

    def _keepalive_at(self, netloc: str, request: etcdrpc.LeaseKeepAliveRequest,
                      timeout: float) -> int:
        """One LeaseKeepAlive on member ``netloc``; MetadataUnavailable when it
        does not answer in ``timeout`` s or refuses for want of a leader.  A
        stale auth token is renewed once and the keep-alive repeated."""
        conn = self._conn
        stub = etcdrpc.LeaseStub(conn.client.endpoints[netloc].channel)

        def once() -> int:
            responses = etcd_errors.translate(lambda: list(stub.LeaseKeepAlive(
                iter([request]), timeout, credentials=conn.client.call_credentials,
                metadata=conn.client.metadata)), conn.security)()
            return int(responses[-1].TTL) if responses else 0
        epoch = conn.ensure_auth()
        try:
            return once()
        except StaleToken as exc:
            if conn.password is None:
                raise errors.MetadataUnauthorized(
                    f"{exc}: check etcd_user / etcd_password_file") from exc.__cause__
        conn.renew_auth(epoch)
        return once()

    def round_budget(self, ttl: int) -> float:
        """The bound of one keep-alive round of a ``ttl`` s lease: a third of
        the ttl (at least 1 s, at most the store's RPC timeout), tried on two
        members at least, so that a round every ttl/3 that meets a hung member
        still reaches a live one well before the lease ends."""
        return min(self._conn.timeout, max(1.0, ttl / 3.0))
