"""Re-replication bookie to bookie: the replacement pulls a fragment's
entries from surviving replicas (wire ``PullEntries``, bookie_server/serving/pull.py).

Theory of operation
-------------------
``copy_fragment`` (admin/operations/rereplicate.py) calls :func:`pull_fragment` first.
The ids the lost slot must hold (``entry_sets.slot_entries``) are asked of
the replacement bookie, one surviving source at a time, in the order the
client path reads them (the lost bookie itself first when it is still
registered, as in a decommission; then ``entry_sets.next_source``, the
replica holding most of what is left: ``entry_sets.ReplicaSources``).  Each ``PullEntries`` answer says
which wanted ids were not copied (absent or corrupt on that source, or the
source failed midway); those are asked of the next source.  The entries
travel bookie to bookie as the stored Arrow rows: no client decodes,
verifies or re-encodes them (the replacement checks digests per batch).

Only when every id is durable on the replacement does ``copy_fragment`` CAS
the fragment's ensemble, exactly as on the client path.  Any error of the
pull itself (a replacement that predates ``PullEntries``, a TLS peer that
does not admit the replacement's certificate, a transport without it, the
replacement failing) raises: ``copy_fragment``
then copies through the client (``_gather`` + ``_write``), so a mixed-
version cluster still re-replicates.
"""
from __future__ import annotations

import numpy as np

from pybk_spark.ledger.port import LedgerClient
from pybk_spark import errors
from pybk_spark.admin.decisions import audit
from pybk_spark.admin.decisions import entry_sets as es
from pybk_spark.transport.base import PullSource
from pybk_spark.transport.grpc_bookie import registration_of


def pull_fragment(bk: LedgerClient, w: audit.FragmentWork, write_quorum: int, key: bytes, digest_type: str,
                  lost_registered: bool, timeout: float) -> tuple[int, int]:
    """(entries, bytes) copied to ``w.replacement`` by pulls; raises a BKError
    if the pull path cannot finish (the caller falls back to the client)."""
    store = bk.metadata_store
    target = bk.transports.get(w.replacement)
    E = len(w.ensemble)
    remaining = es.slot_entries(w.first, w.last, E, write_quorum, w.slot)
    sources = es.ReplicaSources(E, write_quorum, w.slot, lost_first=lost_registered)
    notes: list[str] = []
    entries = nbytes = 0
    while (nxt := sources.next(remaining)) is not None:
        slot, ids = nxt
        bookie = w.ensemble[slot]
        reg = registration_of(store, bookie)
        if not reg or not reg.get("address"):
            notes.append(f"{bookie}: not registered")
            continue
        source = PullSource(bookie, reg["address"], reg.get("add_lane_address") or "")
        got = target.pull(w.ledger_id, key, source, ids, digest_type, timeout).result()
        entries += got.entries
        nbytes += got.bytes
        if got.message:
            notes.append(f"{bookie}: {got.message}")
        remaining = _left_after(remaining, ids, got.missing)
    if len(remaining):
        raise errors.ReadError(f"no surviving intact replica for entries "
                               f"{es.ranges_text(remaining)}"
                               + (f" ({'; '.join(notes)})" if notes else ""),
                               ledger_id=w.ledger_id)
    return entries, nbytes


def _left_after(remaining: np.ndarray, asked: np.ndarray, missing: np.ndarray) -> np.ndarray:
    """The ids of ``remaining`` still to copy after a pull of ``asked`` (a
    subset of it) that did not copy ``missing``: the set operations (a sort
    or hash of every id, ~2 ms per 50,000) only where a pull left some
    behind or asked a part, which the usual pull (every id, all copied)
    does not."""
    if len(asked) == len(remaining):             # asked every id still to copy
        return np.asarray(missing, dtype=np.int64)
    left = np.setdiff1d(remaining, asked, assume_unique=True)
    return np.union1d(left, missing) if len(missing) else left
