"""``BookKeeper``: the client entry point.

    bk = BookKeeper("etcd://127.0.0.1:2379/pybk")
    lh = bk.create_ledger(ensemble=3, write_quorum=2, ack_quorum=2)
    lh.add_entry(b"x"); lh.close()
    rh = bk.open_ledger(lh.ledger_id)          # fencing open + recovery
    rh.read(0, rh.last_add_confirmed)

Metadata goes through the MetadataStore port (CAS only); bookies through a
TransportPool (gRPC by default).  Clock, rng, ``call_later(delay_s, fn)``
(runs ``fn`` after a delay: the overload backoff of adds; default a daemon
``threading.Timer``) and ``executor`` (anything with ``submit(fn, *args)``
returning a Future and ``shutdown(wait=False)``: ensemble changes and the
coalesced async adds run there; default a 4-thread ``ThreadPoolExecutor``,
which the client shuts down on ``close()``) are injectable: the deterministic
simulation (tests/sim/client_sim.py) runs all of them on one seeded loop.
``recovery_listener`` (optional) is called with the ``protocol.recovery.
RecoveryDecision`` of every fencing recovery this client runs (its own
opens, a log leader's take-over, a close by recovery), before that recovery
re-writes anything; it must not raise.  The chaos harness records them.
Handles and recovery get these dependencies as one typed
``context.ClientContext`` (``bk.context``), built here once; they never
call back into the client.
Named logs stand on this client from above: ``pybk_spark/logs/client.py``
adds ``open_log_writer``, ``open_log_reader`` and ``list_logs`` to the
``BookKeeper`` that ``from pybk_spark import BookKeeper`` gives.
"""
from __future__ import annotations

import dataclasses
import random
import threading
import time
import weakref
from concurrent.futures import Executor, ThreadPoolExecutor
from types import TracebackType
from typing import Callable, Mapping, Self, Sequence

from pybk_spark import errors
from pybk_spark.config import ClientConfig, ClientConfLike, as_config
from pybk_spark.ledger.context import ClientContext
from pybk_spark.ledger.ledger_handle import LedgerHandle
from pybk_spark.metadata import EtcdSecurity, keys, open_store
from pybk_spark.metadata.scope import require_bookies
from pybk_spark.metadata.store import (MetadataStore, iter_ids, ledger_key, writer_key)
from pybk_spark.ledger.placement import PlacementPolicy, make_policy, writable_bookies
from pybk_spark.protocol import add_admission as admission
from pybk_spark.protocol import ledger_metadata as lm
from pybk_spark.protocol.recovery import RecoveryDecision
from pybk_spark.ledger.lac_query import query_lac
from pybk_spark.ledger.read_handle import ReadHandle
from pybk_spark.ledger.recovery_op import recover
from pybk_spark.transport.base import TransportPool
from pybk_spark.transport.grpc_bookie import GrpcTransportPool
from pybk_spark.transport.tls import ClientTls

# how long ``close`` waits for the explicit-LAC ticker's current tick
_TICKER_JOIN_S = 1.0


class BookKeeper:
    def __init__(self, metadata_uri: str | None = None, *, conf: ClientConfLike = None,
                 store: MetadataStore | None = None, transports: TransportPool | None = None,
                 clock: Callable[[], float] = time.monotonic, rng: random.Random | None = None,
                 background: bool = True,
                 recovery_listener: Callable[[RecoveryDecision], None] | None = None,
                 call_later: Callable[[float, Callable[[], None]], None] | None = None,
                 executor: Executor | None = None) -> None:
        self.conf: ClientConfig = as_config(conf)
        self.clock = clock
        self.rng = rng or random.Random()
        self._call_later = call_later or _timer
        self._recovery_listener = recovery_listener
        self._own_store = store is None
        if store is None:
            if metadata_uri is None:
                raise errors.IncorrectParameter("metadata_uri or store is required")
            store = open_store(metadata_uri, EtcdSecurity.from_config(self.conf))
        self.metadata_store: MetadataStore = store
        if transports is None:
            transports = GrpcTransportPool(self.metadata_store, tls=ClientTls.from_conf(self.conf),
                                           max_message_bytes=self.conf.max_message_bytes,
                                           timeout=self.conf.add_timeout_s,
                                           stream_idle_close_s=self.conf.add_stream_idle_close_s,
                                           add_transport=self.conf.add_transport,
                                           read_transport=self.conf.read_transport)
        self._transports: TransportPool = transports
        self._placement: PlacementPolicy = make_policy(self.conf.placement_policy, self.rng)
        self.executor = executor if executor is not None else ThreadPoolExecutor(
            max_workers=4, thread_name_prefix="pybk-client")
        # what handles and recovery use of this client, built once (docs: context.py)
        self.context = ClientContext(
            transports=self._transports, metadata_store=self.metadata_store,
            placement=self._placement, executor=self.executor, conf=self.conf, clock=self.clock,
            call_later=self.call_later, rng=self.rng, recovery_listener=recovery_listener)
        self._handles: "weakref.WeakSet[LedgerHandle]" = weakref.WeakSet()
        self._closed = False
        self._stop = threading.Event()
        self._ticker = None
        if background and self.conf.explicit_lac_interval_ms > 0:
            self._ticker = threading.Thread(target=self._tick_loop, name="pybk-lac", daemon=True)
            self._ticker.start()

    # -- the context's parts: replacing one (a test's fault plant, an operator
    # command's placement) replaces the context; handles made earlier keep theirs
    @property
    def transports(self) -> TransportPool:
        return self._transports

    @transports.setter
    def transports(self, pool: TransportPool) -> None:
        self._transports = pool
        self._rebuild_context()

    @property
    def placement(self) -> PlacementPolicy:
        return self._placement

    @placement.setter
    def placement(self, policy: PlacementPolicy) -> None:
        self._placement = policy
        self._rebuild_context()

    @property
    def recovery_listener(self) -> Callable[[RecoveryDecision], None] | None:
        return self._recovery_listener

    @recovery_listener.setter
    def recovery_listener(self, listener: Callable[[RecoveryDecision], None] | None) -> None:
        self._recovery_listener = listener
        self._rebuild_context()

    def _rebuild_context(self) -> None:
        if hasattr(self, "context"):
            self.context = dataclasses.replace(
                self.context, transports=self._transports, placement=self._placement,
                recovery_listener=self._recovery_listener)

    # -- ledgers ----------------------------------------------------------------------------
    def create_ledger(self, ensemble: int = 3, write_quorum: int = 2, ack_quorum: int = 2,
                      digest: str = "crc32c", password: bytes = b"",
                      custom_metadata: Mapping[str, str] | None = None,
                      ledger_id: int | None = None) -> LedgerHandle:
        """``ledger_id``: an id taken earlier from :meth:`reserve_ledger_id`
        (so it can be recorded somewhere before the ledger exists); a ledger
        that already has it -> LedgerExists."""
        self._check_open()
        lm.validate_quorums(ensemble, write_quorum, ack_quorum)
        if digest not in lm.DIGEST_TYPES:
            raise errors.IncorrectParameter(f"digest must be one of {lm.DIGEST_TYPES}, got {digest!r}")
        password = _as_bytes(password)
        store = self.metadata_store
        registry = writable_bookies(store)
        if not registry:
            require_bookies(store)            # no bookie at all: EmptyScope if it is the scope
        bookies = self.placement.new_ensemble(ensemble, registry)
        if ledger_id is None:
            ledger_id = self.reserve_ledger_id()
        md = lm.new_ledger(ledger_id, bookies, write_quorum, ack_quorum, digest, password,
                           custom_metadata, ctime_ms=int(time.time() * 1000))
        try:
            store.put_if_absent(ledger_key(ledger_id), md.to_json())
        except errors.MetadataVersion:
            raise errors.LedgerExists(ledger_id=ledger_id) from None
        lease = None
        try:
            lease = store.grant_lease(self.conf.writer_lease_ttl_s)
            store.put(writer_key(ledger_id), b'{"ledger_id": %d}' % ledger_id, lease=lease)
        except errors.BKError:
            # the liveness key is advisory; the ledger itself is created.  A
            # lease granted for nothing is let go (its keep-alive thread would
            # refresh it for the life of the process)
            if lease is not None:
                try:
                    lease.revoke()
                except errors.BKError:
                    pass
            lease = None
        limits = admission.limits(self.conf.max_entry_size_bytes, self.conf.max_message_bytes,
                                  [registry.get(b, {}) for b in bookies])
        lh = LedgerHandle(self.context, md, password, lease, limits=limits,
                          on_close=self._handles.discard)
        self._handles.add(lh)
        return lh

    def reserve_ledger_id(self) -> int:
        """A fresh ledger id (etcd CAS counter), never handed out again."""
        return self.metadata_store.next_id()

    def open_ledger(self, ledger_id: int, password: bytes = b"", recovery: bool = True, *,
                    other_passwords: Sequence[bytes] = ()) -> ReadHandle:
        """``other_passwords``: tried after ``password``; the ledger opens
        with the first whose check its metadata records (a log whose
        segments were written under different passwords)."""
        self._check_open()
        password = _as_bytes(password)
        md = self.get_ledger_metadata(ledger_id)
        if other_passwords:
            password = lm.password_for(md, [password, *map(_as_bytes, other_passwords)])
        lm.check_password(md, password)
        if recovery:
            return recover(self.context, md, password)
        if md.is_closed:
            return ReadHandle(self.context, md, password, md.last_entry_id)
        lac = query_lac(self.context, md, lm.master_key(password), fence=False)
        return ReadHandle(self.context, md, password, lac)

    def get_ledger_metadata(self, ledger_id: int) -> lm.LedgerMetadata:
        return self.context.ledger_metadata(ledger_id)

    def list_ledgers(self) -> list[int]:
        return list(iter_ids(k for k, _ in self.metadata_store.list_prefix(keys.LEDGERS_PREFIX)))

    def delete_ledger(self, ledger_id: int) -> None:
        """Delete the metadata (CAS); bookies garbage-collect the entries."""
        store = self.metadata_store
        key = ledger_key(ledger_id)
        while True:
            v = store.get(key)
            if v is None:
                raise errors.NoSuchLedger(ledger_id=ledger_id)
            try:
                store.delete(key, expected_version=v.version)
                return
            except errors.MetadataVersion:
                continue

    def set_custom_metadata(self, ledger_id: int, custom: Mapping[str, str]) -> lm.LedgerMetadata:
        raw, _ = self.metadata_store.update(
            ledger_key(ledger_id),
            lambda r: lm.with_custom(lm.LedgerMetadata.from_json(r), dict(custom)).to_json())
        return lm.LedgerMetadata.from_json(raw)

    def is_writer_alive(self, ledger_id: int) -> bool:
        return self.metadata_store.get(writer_key(ledger_id)) is not None

    # -- lifecycle ---------------------------------------------------------------------------
    def call_later(self, delay_s: float, fn: Callable[[], None]) -> None:
        """Run ``fn`` after ``delay_s`` seconds (RuntimeError once closed)."""
        if self._closed:
            raise RuntimeError("client closed")
        self._call_later(delay_s, fn)

    def _tick_loop(self) -> None:
        interval = self.conf.explicit_lac_interval_ms / 1000.0
        while not self._stop.wait(max(0.05, interval / 2)):
            for lh in list(self._handles):
                try:
                    lh.tick(self.clock())
                except Exception:  # noqa: BLE001 - never kill the ticker thread
                    pass

    def _check_open(self) -> None:
        if self._closed:
            raise errors.ClientClosed()

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._stop.set()
        if self._ticker is not None and self._ticker is not threading.current_thread():
            # at most one tick long: a closed client leaves no thread behind
            self._ticker.join(_TICKER_JOIN_S)
        self.executor.shutdown(wait=False)
        self.transports.close()
        if self._own_store:
            self.metadata_store.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()


def _timer(delay_s: float, fn: Callable[[], None]) -> None:
    t = threading.Timer(delay_s, fn)
    t.daemon = True
    t.start()


def _as_bytes(password: str | bytes | None) -> bytes:
    if isinstance(password, str):
        return password.encode()
    if isinstance(password, lm.MasterKey):       # an operator's learned key
        return password
    return bytes(password or b"")
