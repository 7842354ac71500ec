"""``LedgerClient``: what logs, admin operations and the Spark connector use
of a ledger client.

``BookKeeper`` (``ledger/client.py``) is the implementation; the layers
above ledgers (``logs/``, ``admin/``, ``spark/``) take a ``LedgerClient``
so that the type checker sees every call they make into the client, and so
that nothing above ledgers reaches into the client's private parts.  The
simulation's and the tests' clients are ``BookKeeper`` instances too.

* ``metadata_store``: the CAS port; ``conf``: the client settings;
  ``rng``: the client's injected randomness (log uids, password claims).
* ``context``: the ``ClientContext`` that handles and recovery run on.
* a context manager: ``with`` closes it.
* ``transports`` / ``placement``: the bookie connections and the ensemble
  policy; an operator command may replace the placement for one run.
"""
from __future__ import annotations

import random
from types import TracebackType
from typing import Mapping, Protocol, Self, Sequence

from pybk_spark.config import ClientConfig
from pybk_spark.ledger.context import ClientContext
from pybk_spark.ledger.ledger_handle import LedgerHandle
from pybk_spark.ledger.placement import PlacementPolicy
from pybk_spark.ledger.read_handle import ReadHandle
from pybk_spark.metadata.store import MetadataStore
from pybk_spark.protocol import ledger_metadata as lm
from pybk_spark.transport.base import TransportPool


class LedgerClient(Protocol):
    conf: ClientConfig
    metadata_store: MetadataStore
    rng: random.Random

    @property
    def context(self) -> ClientContext: ...

    @property
    def transports(self) -> TransportPool: ...

    @property
    def placement(self) -> PlacementPolicy: ...

    @placement.setter
    def placement(self, policy: PlacementPolicy) -> None: ...

    def create_ledger(self, ensemble: int = 3, write_quorum: int = 2, ack_quorum: int = 2,
                      digest: str = "crc32c", password: bytes = b"",
                      custom_metadata: Mapping[str, str] | None = None,
                      ledger_id: int | None = None) -> LedgerHandle: ...

    def reserve_ledger_id(self) -> int: ...

    def open_ledger(self, ledger_id: int, password: bytes = b"", recovery: bool = True, *,
                    other_passwords: Sequence[bytes] = ()) -> ReadHandle: ...

    def get_ledger_metadata(self, ledger_id: int) -> lm.LedgerMetadata: ...

    def list_ledgers(self) -> list[int]: ...

    def delete_ledger(self, ledger_id: int) -> None: ...

    def set_custom_metadata(self, ledger_id: int,
                            custom: Mapping[str, str]) -> lm.LedgerMetadata: ...

    def is_writer_alive(self, ledger_id: int) -> bool: ...

    def close(self) -> None: ...

    def __enter__(self) -> Self: ...

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None: ...
