"""``ClientContext``: what writers, readers and recovery may use of a client.

``BookKeeper`` builds one at construction and hands it to every
``LedgerHandle``/``LedgerWriter``, ``ReadHandle`` and fencing recovery; they
take their dependencies from it and never from the client object, so they
can run under any transport, metadata store, executor, clock and timer (the
deterministic simulation injects its own).  Frozen: a context never
changes; a different setup is a different context.

* ``transports``: bookie connections; ``metadata_store``: the CAS port;
  ``placement``: new ensembles and replacements; ``conf``: client settings.
* ``executor``: background work (ensemble changes, coalesced adds); a
  ``submit`` after the client closed raises RuntimeError.
* ``clock``: monotonic seconds; ``call_later(delay_s, fn)``: runs ``fn``
  later (RuntimeError once the client closed); ``rng``: jitter.
* ``recovery_listener``: called with every recovery's decision before it
  re-writes anything (``protocol.recovery.RecoveryDecision``); must not
  raise.
"""
from __future__ import annotations

import random
from concurrent.futures import Executor
from dataclasses import dataclass
from typing import Callable

from pybk_spark.config import ClientConfig
from pybk_spark.metadata.store import MetadataStore, read_ledger_metadata
from pybk_spark.ledger.placement import PlacementPolicy
from pybk_spark.protocol import ledger_metadata as lm
from pybk_spark.protocol.recovery import RecoveryDecision
from pybk_spark.transport.base import TransportPool


@dataclass(frozen=True)
class ClientContext:
    transports: TransportPool
    metadata_store: MetadataStore
    placement: PlacementPolicy
    executor: Executor
    conf: ClientConfig
    clock: Callable[[], float]
    call_later: Callable[[float, Callable[[], None]], None]
    rng: random.Random
    recovery_listener: Callable[[RecoveryDecision], None] | None = None

    def ledger_metadata(self, ledger_id: int) -> lm.LedgerMetadata:
        """The ledger's current metadata (NoSuchLedger if absent)."""
        md: lm.LedgerMetadata = read_ledger_metadata(self.metadata_store, ledger_id)
        return md
