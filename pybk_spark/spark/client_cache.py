"""The per-process client cache of the Spark data source (never pickled).

DataSource and reader objects are pickled between processes, so no client is
held on them; each Python worker keeps one lazily opened client per
(metadata URI, ``bk.*`` settings) (workers are reused across tasks), and
freezes its long-lived objects out of the garbage collector once (Spark
collects after every task).  The batch reader, the writer and the stream
reader share it; ``open_handle``/``close_handle`` open and close one ledger
on such a client.
"""
from __future__ import annotations

import atexit
from typing import Any, Sequence


_CLIENTS: dict[tuple, Any] = {}


def worker_client(uri: str, conf: tuple = ()):
    """The worker's client for (uri, ``bk.*`` settings)."""
    bk = _CLIENTS.get((uri, conf))
    if bk is None:
        from pybk_spark.ledger.client import BookKeeper
        bk = BookKeeper(uri, conf=dict(conf) or None)
        _CLIENTS[(uri, conf)] = bk
        freeze_long_lived_objects()
    return bk


_FROZEN = [False]


def freeze_long_lived_objects() -> None:
    """Once per Python worker: move everything alive now (imported modules,
    the cached client) out of the cyclic garbage collector's sight.

    Spark's worker daemon runs a full ``gc.collect()`` after EVERY task of a
    reused worker.  With grpc, pyarrow, the etcd client and their modules
    loaded that walk costs 25-60 ms of CPU per task on this machine, and a
    1,000,000-row scan is two tasks.  Frozen objects are never collected,
    which is right for modules and the per-process client; anything created
    later is collected as before.  ``gc.collect()`` first, so no garbage is
    frozen with them."""
    if _FROZEN[0]:
        return
    import gc
    gc.collect()
    gc.freeze()
    _FROZEN[0] = True


def drop_client(uri: str, conf: tuple = ()) -> None:
    bk = _CLIENTS.pop((uri, conf), None)
    if bk is not None:
        try:
            bk.close()
        except Exception:  # noqa: BLE001 - closing a broken client must not hide the real error
            pass


@atexit.register
def _close_clients() -> None:
    for uri, conf in list(_CLIENTS):
        drop_client(uri, conf)


def open_handle(bk, ledger_id: int, *, recovery: bool, passwords: Sequence[bytes]):
    """Open with the first of ``passwords`` the ledger's metadata accepts."""
    password, *others = passwords or (b"",)
    if others:
        return bk.open_ledger(ledger_id, recovery=recovery, password=password,
                              other_passwords=others)
    if password:
        return bk.open_ledger(ledger_id, recovery=recovery, password=password)
    return bk.open_ledger(ledger_id, recovery=recovery)


def close_handle(handle) -> None:
    close = getattr(handle, "close", None)
    if close is not None:
        close()
