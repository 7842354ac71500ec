"""Test-only client faults planted into chaos workers (``workers.py --plant``).

Production code has no fault switch; these wrap a ``BookKeeper``'s
transport pool from the outside (its ``transports`` attribute), so only a
worker started with ``--plant NAME`` misbehaves.

Plants:
  * ``unfenced_recovery``: every read this client sends goes out WITHOUT the
    fence flag, so its recoveries close ledgers that no bookie was told to
    fence.  A writer the recoverer wrongly believes dead (cut off from etcd
    past its lease while it still reaches its bookies: the zombie writer of
    a partition) keeps getting acks after the close; those acknowledged
    entries are not in the closed ledger, and the chaos checker must report
    them (I1).  A correct recovery fences: the zombie's next add ends
    LedgerFenced (unknown), never acked.
"""
from __future__ import annotations


class _UnfencedTransport:
    def __init__(self, transport):
        self._t = transport

    def __getattr__(self, name):
        return getattr(self._t, name)

    def read(self, *args, **kw):
        kw["fence"] = False
        return self._t.read(*args, **kw)

    def read_lac(self, *args, **kw):
        kw["fence"] = False
        return self._t.read_lac(*args, **kw)


class _UnfencedPool:
    def __init__(self, pool):
        self._pool = pool

    def __getattr__(self, name):
        return getattr(self._pool, name)

    def get(self, bookie_id: str):
        return _UnfencedTransport(self._pool.get(bookie_id))


PLANTS = {"unfenced_recovery": lambda bk: setattr(bk, "transports", _UnfencedPool(bk.transports))}


def plant(bk, name: str):
    """Plant ``name`` into ``bk`` (returns it)."""
    try:
        PLANTS[name](bk)
    except KeyError:
        raise SystemExit(f"faulty_client: unknown --plant {name!r}; one of {sorted(PLANTS)}")
    return bk
