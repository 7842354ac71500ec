"""The metadata store port: what the client, bookies and tools need of etcd.

Two adapters implement it and ONE conformance suite (tests/conformance/
test_metadata_store.py) runs against both:
  * ``EtcdMetadataStore``   (pybk_spark/metadata/etcd_store.py) - the real thing
  * ``MemoryMetadataStore`` (pybk_spark/metadata/memory_store.py) - the twin

Versions are etcd ``mod_revision``s (opaque ints to callers).  Every write is
conditional: put-if-absent or compare-and-swap on a version.  Conflicts raise
``errors.MetadataVersion``; unreachable store raises
``errors.MetadataUnavailable`` (outcome unknown).

Key layout under the scope prefix ``/<scope>/``:
  ledgers/<id:020d>              ledger metadata JSON
  idgen                          ledger id counter (CAS)
  bookies/writable/<bookie_id>   registration JSON, under the bookie's lease
  bookies/readonly/<bookie_id>   registration JSON, under the bookie's lease
  bookies/damaged/<bookie_id>    entry ranges the bookie lost to damage (no lease: it
                                 outlives restarts); the bookie CAS-merges, the auditor
                                 CAS-removes what it copied back (protocol/damage_marker.py)
  cookies/<bookie_id>            identity cookie JSON
  instanceid                     cluster instance id
  writers/<ledger id:020d>       writer liveness, under the writer's lease
  logs/<name>                    log metadata JSON (a long log: its newest segments and
                                 the chunks it names, protocol/log_metadata.py)
  logchunks/<name>/<rev>-<i>     a sealed, immutable chunk of a long log's segments
  positions/<log>/<name>         a consumer's committed read position of the log (CAS; it
                                 holds back truncation: protocol/positions.py)
  spark/pending/<...>            Spark write attempts in flight
  audit/missing/<bookie_id>      auditor: first time the bookie was seen unregistered
  audit/decommissioned/<id>      operator: bookie being decommissioned (pybk decommission)
  audit/leader                   autorecovery leader {"id"}, under its lease
  audit/config                   autorecovery switches: enabled, lost_bookie_recovery_delay_s
                                 (metadata/audit_control.py; CAS, absent = defaults)
  audit/trigger                  pybk triggeraudit's request (CAS); a new version = audit now
"""
from __future__ import annotations

import abc
import threading
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Mapping, Optional, TypeVar

from pybk_spark import errors
from pybk_spark.metadata.scope import require_bookies
from pybk_spark.protocol.ledger_metadata import LedgerMetadata
# the key layout lives in metadata/keys.py; these names stay importable from here
from pybk_spark.metadata.keys import (iter_ids, ledger_key, log_key,  # noqa: F401
                                      position_key, positions_prefix, writer_key)

T = TypeVar("T")


@dataclass(frozen=True)
class Versioned:
    value: bytes
    version: int          # etcd mod_revision


KEEPALIVE_MAX_PERIOD_S = 2.0
# etcd caps a transaction's operations (--max-txn-ops, 128 by default)
MAX_TXN_OPS = 128


def keepalive_period(ttl: float) -> float:
    """Seconds between keep-alives of a ``ttl`` s lease: ttl/3, at most 2 s.

    The cap is for a leader that stalls (SIGSTOP, a disk or GC stall) and
    resumes: etcd before v3.5.13 lets it revoke every lease that expired in
    its own view, which stopped at the stall, before it learns that another
    member leads and has kept the leases alive.  A lease survives a stall of
    up to ``ttl - period`` seconds, so the period stays short beside the ttl."""
    return max(0.2, min(ttl / 3.0, KEEPALIVE_MAX_PERIOD_S))


class Lease(abc.ABC):
    """A TTL lease; keys put under it vanish when it expires or is revoked.

    ``lost`` is set, and ``on_lost(lease)`` called once, when the store finds
    the lease gone while the holder still wanted it."""

    def __init__(self, lease_id: int, ttl: int,
                 on_lost: Callable[[Any], None] | None = None) -> None:
        self.id = lease_id
        self.ttl = ttl
        self.lost = threading.Event()
        self._on_lost = on_lost

    def _mark_lost(self) -> None:
        if not self.lost.is_set():
            self.lost.set()
            if self._on_lost is not None:
                try:
                    self._on_lost(self)
                except Exception:  # noqa: BLE001 - a callback bug must not kill the refresher
                    pass

    @abc.abstractmethod
    def refresh(self) -> None: ...

    @abc.abstractmethod
    def revoke(self) -> None: ...


class MetadataStore(abc.ABC):
    """Minimal CAS key-value store.  Keys are str relative to the scope."""

    @abc.abstractmethod
    def get(self, key: str) -> Optional[Versioned]: ...

    @abc.abstractmethod
    def put_if_absent(self, key: str, value: bytes, lease: Lease | None = None) -> int:
        """Create; raises MetadataVersion if the key exists.  Returns version."""

    @abc.abstractmethod
    def compare_and_swap(self, key: str, value: bytes, expected_version: int,
                         lease: Lease | None = None) -> int:
        """Replace iff current version == expected; raises MetadataVersion
        otherwise (including when the key is gone).  Returns the new version."""

    @abc.abstractmethod
    def swap_with(self, key: str, value: bytes, expected_version: int,
                  creates: Mapping[str, bytes], deletes: Iterable[str] = ()) -> int:
        """One atomic step (one etcd transaction, one revision): replace
        ``key`` iff its version is ``expected_version``, create every key of
        ``creates`` (none may exist) and delete every key of ``deletes``.
        MetadataVersion, and nothing changed, if any condition fails.
        Returns the new version of ``key``."""

    @abc.abstractmethod
    def put(self, key: str, value: bytes, lease: Lease | None = None) -> int:
        """Unconditional put.  ONLY for keys owned by one process (registrations
        under its own lease); never for shared metadata."""

    @abc.abstractmethod
    def delete(self, key: str, expected_version: int | None = None) -> bool:
        """Delete; with expected_version a CAS delete (MetadataVersion on
        mismatch).  Returns False if the key was already absent."""

    @abc.abstractmethod
    def delete_all(self, keys: Iterable[str]) -> int:
        """Delete every key of ``keys`` (one that is absent is no error), in
        transactions of at most ``MAX_TXN_OPS`` keys, each one revision: one
        round trip where a loop of ``delete`` takes one per key.  Returns
        how many existed."""

    @abc.abstractmethod
    def list_prefix(self, prefix: str) -> list[tuple[str, Versioned]]:
        """All keys under prefix, sorted by key."""

    @abc.abstractmethod
    def scopes_with(self, prefix: str) -> list[str]:
        """Every scope of this store's keyspace (this one and the others) that
        holds a key under ``prefix`` (``bookies/``: scopes bookies registered
        in), sorted.  MetadataUnauthorized when the credentials may read this
        scope only."""

    @abc.abstractmethod
    def grant_lease(self, ttl_seconds: int) -> Lease: ...

    @abc.abstractmethod
    def lease_time_left(self, key: str) -> Optional[float]:
        """Seconds until the lease ``key`` is under ends unless refreshed
        (its ttl remaining: a live holder keeps it near the full ttl, a dead
        one's counts down to 0 and the key vanishes); None when the key is
        absent or under no lease."""

    @abc.abstractmethod
    def wait_for_change(self, prefix: str, after_revision: int, timeout: float) -> bool:
        """Block until something under prefix changes after ``after_revision``
        or timeout; True if it changed."""

    @abc.abstractmethod
    def close(self) -> None: ...

    # -- helpers built on the primitives (shared by both adapters) -------------
    def update(self, key: str, transform: Callable[[bytes], bytes], *,
               max_attempts: int = 100) -> tuple[bytes, int]:
        """Read-transform-CAS loop.  ``transform`` is re-run on every conflict,
        so it must decide from the value it is given (never from stale state).
        If transform returns the value unchanged no write is made."""
        for _ in range(max_attempts):
            current = self.get(key)
            if current is None:
                raise errors.NoSuchLedger(f"no metadata at {key}")
            new_value = transform(current.value)
            if new_value == current.value:
                return current.value, current.version
            try:
                return new_value, self.compare_and_swap(key, new_value, current.version)
            except errors.MetadataVersion:
                continue
            except errors.MetadataTooLarge as exc:
                raise errors.MetadataTooLarge(str(exc), key=key, value_bytes=len(new_value)) from exc
        raise errors.MetadataVersion(f"gave up after {max_attempts} CAS conflicts on {key}")

    def upsert(self, key: str, transform: Callable[[Optional[bytes]], bytes], *,
               max_attempts: int = 100) -> bytes:
        """``update`` for a key that may not exist yet: ``transform`` gets None
        for an absent key, whose value is then created (put-if-absent).  Re-run
        on every conflict; returns the value written (or found unchanged)."""
        for _ in range(max_attempts):
            current = self.get(key)
            new_value = transform(current.value if current is not None else None)
            try:
                if current is None:
                    self.put_if_absent(key, new_value)
                elif new_value != current.value:
                    self.compare_and_swap(key, new_value, current.version)
                return new_value
            except errors.MetadataVersion:
                continue
        raise errors.MetadataVersion(f"gave up after {max_attempts} CAS conflicts on {key}")

    def next_id(self, key: str = "idgen") -> int:
        """Allocate a unique 64-bit id with a CAS counter."""
        while True:
            current = self.get(key)
            if current is None:
                try:
                    self.put_if_absent(key, b"1")
                    return 1
                except errors.MetadataVersion:
                    continue
            value = int(current.value) + 1
            try:
                self.compare_and_swap(key, str(value).encode(), current.version)
                return value
            except errors.MetadataVersion:
                continue


def read_ledger_metadata(store: "MetadataStore", ledger_id: int) -> LedgerMetadata:
    """The ledger's metadata, or NoSuchLedger."""
    v = store.get(ledger_key(ledger_id))
    if v is None:
        require_bookies(store)            # EmptyScope: the wrong scope, not the id
        raise errors.NoSuchLedger(
            f"no ledger {ledger_id} in this metadata scope: it was never created here, or "
            "it was deleted (`pybk listledgers` lists the scope's ledgers)", ledger_id=ledger_id)
    return LedgerMetadata.from_json(v.value)
