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
  * ``reuse_id_on_timeout``: a writer that treats a timed-out add as failed
    and reuses its ids.  When an add request to a bookie times out (the
    bookie's reply was lost: a one-way drop, a writer <-> bookie partition),
    the writer rewinds its next entry id to the first id of that request and
    sends the entries it assigns afterwards (different payloads) under the
    ids it already used, with digests recomputed for the reused ids (what a
    writer with its own id counter would send).  The client itself still
    believes its own ids (it releases entry N+d when the bookies acked wire
    id N), so an acknowledged entry ends up missing from the closed ledger
    or another payload sits at its id: the checker must report I1.  A
    correct writer never reuses an id after a timeout (unknown outcome).
    Only ``Timeout`` failures rewind: a refused connection (a killed bookie)
    does not, a paused bookie (SIGSTOP past the 5 s add timeout) does.
"""
from __future__ import annotations

import threading

import numpy as np
import pyarrow as pa

from pybk_spark import errors
from pybk_spark.wire.digest import Digester
from pybk_spark.wire.entries import ENTRY_SCHEMA, batch_from_bytes, batch_to_buffer, joined


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


class _Rewinds:
    """Per ledger: the writer's rewinds, as (first client id, ids reused)."""

    def __init__(self, bk):
        self._bk = bk
        self._lock = threading.Lock()
        self._segments: dict[int, list[tuple[int, int]]] = {}
        self._max_sent: dict[int, int] = {}
        self._rewound: set[tuple[int, int]] = set()     # (ledger, first client id)
        self._digest_type: dict[int, str] = {}

    def _shift(self, lid: int, ids: np.ndarray) -> np.ndarray:
        out = ids.copy()
        for start, d in self._segments.get(lid, ()):
            out[ids >= start] -= d
        return out

    def outgoing(self, lid: int, key: bytes, data):
        """The bytes the faulty writer sends for ``data`` (client ids)."""
        data = joined(data)
        batch = batch_from_bytes(data)
        if batch.num_rows == 0:
            return data, None
        ids = batch.column("entry_id").to_numpy()
        with self._lock:
            self._max_sent[lid] = max(self._max_sent.get(lid, -1), int(ids[-1]))
            if not self._segments.get(lid):
                return data, int(ids[0])
            wire = self._shift(lid, ids)
            lac = self._shift(lid, batch.column("lac").to_numpy())
        if np.array_equal(wire, ids):
            return data, int(ids[0])
        lac = np.minimum(lac, wire - 1)
        lengths = batch.column("length").to_pylist()
        payloads = batch.column("payload").to_pylist()
        dig = Digester.with_key(self._type(lid), key)
        digests = dig.compute(lid, wire.tolist(), lac.tolist(), lengths, payloads)
        out = pa.RecordBatch.from_arrays(
            [batch.column("ledger_id"), pa.array(wire, pa.int64()), pa.array(lac, pa.int64()),
             batch.column("payload"), pa.array(digests, pa.binary()),
             batch.column("length")], schema=ENTRY_SCHEMA)
        return batch_to_buffer(out), int(ids[0])

    def timed_out(self, lid: int, first: int) -> None:
        """The add of client ids from ``first`` timed out: rewind."""
        with self._lock:
            if (lid, first) in self._rewound:
                return
            self._rewound.add((lid, first))
            start = self._max_sent.get(lid, first) + 1      # the next id it assigns
            ids = np.array([first, start], dtype=np.int64)
            wire = self._shift(lid, ids)
            d = int(wire[1] - wire[0])
            if d <= 0:
                return                  # already rewound past it
            self._segments.setdefault(lid, []).append((start, d))
        print(f"faulty_client: ledger {lid}: the add from id {first} timed out; ids from "
              f"{start} go out {d} lower (reused)", flush=True)

    def _type(self, lid: int) -> str:
        if lid not in self._digest_type:
            self._digest_type[lid] = self._bk.get_ledger_metadata(lid).digest_type
        return self._digest_type[lid]


class _IdReusingTransport:
    def __init__(self, transport, rewinds: _Rewinds):
        self._t, self._rw = transport, rewinds

    def __getattr__(self, name):
        return getattr(self._t, name)

    def add(self, ledger_id, master_key, entries, recovery=False, timeout=None):
        if recovery:
            return self._t.add(ledger_id, master_key, entries, recovery=recovery,
                               timeout=timeout)
        data, first = self._rw.outgoing(ledger_id, master_key, entries)
        fut = self._t.add(ledger_id, master_key, data, recovery=recovery, timeout=timeout)

        def done(f):
            if first is not None and isinstance(f.exception(), errors.Timeout):
                self._rw.timed_out(ledger_id, first)
        fut.add_done_callback(done)
        return fut


class _IdReusingPool:
    def __init__(self, pool, rewinds: _Rewinds):
        self._pool, self._rw = pool, rewinds

    def __getattr__(self, name):
        return getattr(self._pool, name)

    def get(self, bookie_id: str):
        return _IdReusingTransport(self._pool.get(bookie_id), self._rw)


def _reuse_id_on_timeout(bk) -> None:
    bk.transports = _IdReusingPool(bk.transports, _Rewinds(bk))


PLANTS = {"unfenced_recovery": lambda bk: setattr(bk, "transports", _UnfencedPool(bk.transports)),
          "reuse_id_on_timeout": _reuse_id_on_timeout}


def plant(bk, name: str):
    """Plant ``name`` into ``bk`` (returns it)."""
    try:
        PLANTS[name](bk)
    except KeyError:
        raise SystemExit(f"faulty_client: unknown --plant {name!r}; one of {sorted(PLANTS)}") from None
    return bk
