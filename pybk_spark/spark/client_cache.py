"""The per-process client cache of the Spark data source (never pickled).

DataSource and reader objects are pickled between processes, so no client is
held on them; each Python worker keeps one lazily opened client per
(metadata URI, ``bk.*`` settings) (workers are reused across tasks).  A
worker freezes its long-lived objects out of the garbage collector (Spark
collects after every task): its modules once, before it opens its first
store or client (``worker_store``, ``new_client``), and each client it
caches; dropping a cached client (``drop_client``, after a failed task)
unfreezes them, so that the dropped one is collected.  The batch reader,
the writer and the stream reader share the cache;
``open_handle``/``close_handle`` open and close one ledger on such a
client, ``catch_up_lac`` brings an open handle's LAC up to what the driver
planned.

:func:`new_client` is the one place the data source builds a ``BookKeeper``:
the module Spark imports to register and plan the source
(``pyspark_bookkeeper`` -> datasource.py) does not import the ledger client,
gRPC or the etcd client; the first task or planning step that needs a client
does.
"""
from __future__ import annotations

import atexit
import gc
import random
from typing import TYPE_CHECKING, Optional, Sequence

from pybk_spark.spark.client_options import ClientSettings, client_conf

if TYPE_CHECKING:
    from pybk_spark.ledger.port import LedgerClient
    from pybk_spark.ledger.read_handle import ReadHandle
    from pybk_spark.metadata.security import EtcdSecurity
    from pybk_spark.metadata.store import MetadataStore

LAC_CATCH_UP_TIMEOUT_S = 30.0

_CLIENTS: dict[tuple[str, ClientSettings], LedgerClient] = {}


def new_client(uri: str, conf: ClientSettings = (), *, store: Optional[MetadataStore] = None,
               rng: Optional[random.Random] = None) -> LedgerClient:
    """A new ``BookKeeper`` for (uri, ``bk.*`` settings); ``store``: one the
    caller opened already (and closes)."""
    # why: gRPC, etcd and the ledger client cost a Spark worker's start-up; registering needs none
    from pybk_spark.ledger.client import BookKeeper
    freeze_long_lived_objects()
    return BookKeeper(uri, conf=client_conf(conf), store=store, rng=rng)


def worker_store(uri: str, security: Optional[EtcdSecurity] = None) -> MetadataStore:
    """The metadata store at ``uri``, opened in a Python worker that plans
    or commits (schema, partitions, a writer's commit): the etcd client's
    modules, imported here, are frozen with the rest
    (``freeze_long_lived_objects``)."""
    from pybk_spark.metadata import open_store
    freeze_long_lived_objects()
    return open_store(uri, security)


def worker_client(uri: str, conf: ClientSettings = ()) -> LedgerClient:
    """The worker's client for (uri, ``bk.*`` settings)."""
    bk = _CLIENTS.get((uri, conf))
    if bk is None:
        bk = new_client(uri, conf)
        _CLIENTS[(uri, conf)] = bk
        _freeze()                # the cached client lives as long as the worker
    return bk


# whether this process has frozen what it had loaded (``freeze_long_lived_objects``)
_modules_frozen = False


def freeze_long_lived_objects() -> None:
    """Once per Python worker: move everything alive now (imported modules)
    out of the cyclic garbage collector's sight; ``worker_client`` freezes
    each client it caches as well.

    Spark's worker daemon runs a full ``gc.collect()`` after EVERY task of a
    reused worker.  With grpc, pyarrow, the etcd client and their modules
    loaded that walk costs 25-60 ms of CPU per task on this machine, and a
    1,000,000-row scan is two tasks.  The workers on the driver's side
    (a write's ``writer()`` and its commit, a read's planning) pay it too,
    once per write or read.  Frozen objects are never collected,
    which is right for modules and the per-process client; anything created
    later is collected as before.  ``gc.collect()`` first, so no garbage is
    frozen with them."""
    global _modules_frozen
    if _modules_frozen:
        return
    _freeze()
    _modules_frozen = True


def _freeze() -> None:
    gc.collect()
    gc.freeze()


def drop_client(uri: str, conf: ClientSettings = ()) -> None:
    global _modules_frozen
    bk = _CLIENTS.pop((uri, conf), None)
    if bk is not None:
        try:
            bk.close()
        except Exception:  # noqa: BLE001 - closing a broken client must not hide the real error
            pass
        # frozen with the worker (``worker_client``), the dropped client's
        # cycles would never be collected: a worker that drops a client
        # after every failed task would keep each one.  Everything goes
        # back to the collector; the next client this worker opens
        # freezes what is alive then.
        gc.unfreeze()
        _modules_frozen = False


@atexit.register
def _close_clients() -> None:
    for uri, conf in list(_CLIENTS):
        drop_client(uri, conf)


def open_handle(bk: LedgerClient, ledger_id: int, *, recovery: bool,
                passwords: Sequence[bytes]) -> ReadHandle:
    """Open with the first of ``passwords`` the ledger's metadata accepts."""
    password, *others = passwords or (b"",)
    if others:
        return bk.open_ledger(ledger_id, recovery=recovery, password=password,
                              other_passwords=others)
    if password:
        return bk.open_ledger(ledger_id, recovery=recovery, password=password)
    return bk.open_ledger(ledger_id, recovery=recovery)


def close_handle(handle: ReadHandle) -> None:
    handle.close()


def catch_up_lac(handle: ReadHandle, planned_last: int) -> None:
    """The driver saw LAC >= planned_last, but this open's covering quorum may
    have answered a lower one (LACs differ per bookie).  Some bookie holds the
    higher LAC, so a long poll for it returns at once; if it does not come the
    read fails with NoSuchEntry and Spark retries the task."""
    if handle.is_closed or handle.last_add_confirmed >= planned_last:
        return
    handle.wait_for_lac(planned_last - 1, LAC_CATCH_UP_TIMEOUT_S)
