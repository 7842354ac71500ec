"""Repair of the entries bookies reported lost to damage (``bookies/damaged/``).

Theory of operation
-------------------
A bookie that found damage (journal replay, scrubber) publishes the entry
ranges it lost under ``bookies/damaged/<bookie_id>`` (format and CAS rules:
``protocol/damage_marker.py``) and answers BookieIOError for them meanwhile.
Each audit round (``orchestrate.run_rereplicate``: ``pybk rereplicate``,
``pybk autorecovery``) calls ``repair_damaged``; per marker:

  1. The ledgers to check: the named ones, plus - when the damage was
     ``unattributed`` - every ledger with that bookie in an ensemble.
  2. Per ledger: deleted, or the bookie no longer in its ensembles -> nothing
     to do.  A ledger that is no longer OPEN is fenced on the bookie again
     (a damaged FENCE record cannot be recognised; without its fence the
     bookie could let a writer that lost the ledger reach Qa).  Then
     ``rereplicate.verify_ledger(repair=True)`` for that
     bookie only: every complete fragment's ids its slot must hold are read
     from it (sparse reads: a lost id is simply absent), and the absent ones
     are read from the other replicas (digests verified) and written back to
     the SAME bookie with recovery adds (durable before acknowledged).  Ids
     outside the bookie's write set are never copied.  A last fragment still
     being written that holds the bookie is checked once the ledger is closed
     (its range stays, OPEN from the fragment's first id).
  3. The marker is CASed to what is left (``damage_marker.remaining``) or
     CAS-deleted.  A conflict (the bookie reported more damage meanwhile)
     leaves it for the next round.  The bookie adopts the new marker.
Never raises a BKError: the outcome is in the rows.
"""
from __future__ import annotations

from typing import Optional

import numpy as np

from pybk_spark.metadata.store import MetadataStore
from pybk_spark.ledger.port import LedgerClient
from pybk_spark import errors
from pybk_spark.admin.decisions import entry_sets as es
from pybk_spark.admin.operations.recover import access_key
from pybk_spark.admin.operations.rereplicate import verify_ledger
from pybk_spark.protocol import damage_marker as dm
from pybk_spark.protocol import ledger_metadata as lm

COLUMNS = ["bookie", "ledger", "outcome", "copied", "missing", "entries", "error"]


def read_markers(store: MetadataStore) -> list[tuple[str, int, list, bool]]:
    """[(bookie, marker version, ranges, unattributed)]."""
    out = []
    for key, v in store.list_prefix(dm.MARKER_PREFIX):
        ranges, unattributed = dm.parse_marker(v.value)
        out.append((key.rsplit("/", 1)[1], v.version, ranges, unattributed))
    return out


def _refence(bk: LedgerClient, md: lm.LedgerMetadata, bookie: str, password: Optional[bytes]) -> None:
    """Fence the ledger on the damaged bookie again: a FENCE record in the
    damaged bytes cannot be recognised, and a bookie that forgot its fence
    could let a writer that lost the ledger reach Qa."""
    key, _ = access_key(bk, md, password)
    bk.transports.get(bookie).read_lac(md.ledger_id, fence=True, master_key=key,
                                       timeout=bk.conf.read_timeout_s).result()


def repair_damaged(bk: LedgerClient, password: Optional[bytes] = None) -> list[dict]:
    store = bk.metadata_store
    rows: list[dict] = []
    markers = read_markers(store)
    if not markers:
        return rows
    mds = {}
    for lid in bk.list_ledgers():
        try:
            mds[lid] = bk.get_ledger_metadata(lid)
        except errors.NoSuchLedger:
            continue
    for bookie, version, ranges, unattributed in markers:
        holding = [lid for lid, md in mds.items() if bookie in md.all_bookies()]
        unrepaired, still_written = [], {}
        for lid in dm.ledgers_to_check(ranges, unattributed, holding):
            row = {"bookie": bookie, "ledger": lid, "outcome": "repaired", "copied": 0,
                   "missing": 0, "entries": "", "error": ""}
            md = mds.get(lid)
            if md is None or bookie not in md.all_bookies():
                row["outcome"] = "deleted" if md is None else "not-on-bookie"
                rows.append(row)
                continue
            copied: list = []
            try:
                if md.state != lm.OPEN:
                    _refence(bk, md, bookie, password)
                left = verify_ledger(bk, lid, password, repair=True, bookies={bookie},
                                     copied=copied)
            except errors.BKError as exc:
                left = [{"missing": -1, "entries": "", "error": f"{type(exc).__name__}: {exc}"}]
            if copied:
                ids = np.concatenate(copied)
                row.update(copied=int(len(ids)), entries=es.ranges_text(np.sort(ids)))
            if left:
                unrepaired.append(lid)
                row.update(outcome="failed", missing=sum(r["missing"] for r in left),
                           entries="; ".join(r["entries"] for r in left),
                           error="; ".join(r.get("error") or "" for r in left).strip("; "))
            frags = md.fragments()
            if not md.is_closed and frags:
                first, last, last_bookies = frags[-1]
                if last == -1 and bookie in last_bookies:
                    still_written[lid] = first
                    if not left:
                        row["outcome"] = "waiting"
                        row["error"] = "last fragment still being written: checked once closed"
            rows.append(row)
        rest = dm.remaining(ranges, unrepaired, still_written)
        key = dm.marker_key(bookie)
        try:
            if rest:
                value = dm.marker_value(rest, False)
                store.compare_and_swap(key, value, version)
            else:
                store.delete(key, expected_version=version)
        except errors.MetadataVersion:
            rows.append({"bookie": bookie, "ledger": -1, "outcome": "retry", "copied": 0,
                         "missing": 0, "entries": "", "error": "marker changed meanwhile "
                         "(new damage): next round"})
        except errors.BKError as exc:
            rows.append({"bookie": bookie, "ledger": -1, "outcome": "failed", "copied": 0,
                         "missing": 0, "entries": "", "error": f"{type(exc).__name__}: {exc}"})
    return rows
