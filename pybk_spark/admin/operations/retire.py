"""Retiring a dead bookie id: the last step of ``pybk decommission``.

BookKeeper's ``decommissionbookie`` triggers an audit, waits until every
ledger of the bookie is replicated elsewhere, then deletes the bookie's
cookie.  Here the id is also what the auditor keeps listing as lost, so
retiring removes every record that names it:

  cookies/<id>                 the identity cookie (the auditor knows a bookie by it)
  bookies/instances/<id>       the cookie instances the id has had
  bookies/damaged/<id>         its damage marker (nothing left to copy back onto it)
  audit/missing/<id>           when the auditor first saw it unregistered
  audit/decommissioned/<id>    the decommission mark (a marked bookie counts as lost)

Only when its data is safe: the id is not registered (a live bookie is
stopped first), and no ledger has a fragment with entries on it
(``holding_ledgers``; an empty fragment holds nothing).  Otherwise
``IllegalOp``, one line naming the ledgers.  Each key is deleted by CAS on
the version read; a conflict (the bookie came back and rewrote its cookie,
an auditor marked it meanwhile) re-decides from the start.
"""
from __future__ import annotations

from typing import Iterable

from pybk_spark.ledger.port import LedgerClient
from pybk_spark import errors
from pybk_spark.admin.decisions import audit
from pybk_spark.admin.operations.rereplicate import registered_bookies
from pybk_spark.metadata import keys
from pybk_spark.protocol import ledger_metadata as lm
from pybk_spark.protocol.bookie_instances import instances_key
from pybk_spark.protocol.damage_marker import marker_key

SHOWN_LEDGERS = 10


def record_keys(bookie_id: str) -> list[str]:
    """Every key that names the id once no ledger does, the order they are deleted in
    (what makes the auditor know it first, its marks last)."""
    return [keys.cookie_key(bookie_id), instances_key(bookie_id), marker_key(bookie_id),
            audit.MISSING_PREFIX + bookie_id, audit.DECOMMISSIONED_PREFIX + bookie_id]


def holding_ledgers(mds: Iterable[lm.LedgerMetadata], bookie_id: str) -> list[int]:
    """Ids of the ledgers with a fragment that holds (or, still being
    written, may hold) entries on ``bookie_id``."""
    return sorted(md.ledger_id for md in mds
                  if any(bookie_id in bookies for _f, _l, bookies in md.fragments()))


def ledgers_text(ids: list[int], limit: int = SHOWN_LEDGERS) -> str:
    shown = ", ".join(str(i) for i in ids[:limit])
    return shown + (f" and {len(ids) - limit} more" if len(ids) > limit else "")


def _metadata(bk: LedgerClient) -> list[lm.LedgerMetadata]:
    out = []
    for lid in bk.list_ledgers():
        try:
            out.append(bk.get_ledger_metadata(lid))
        except errors.NoSuchLedger:
            continue
    return out


def refusal(bk: LedgerClient, bookie_id: str) -> str:
    """Why the id cannot be retired now ("" when it can)."""
    if bookie_id in registered_bookies(bk.metadata_store):
        return (f"bookie {bookie_id} is still registered: stop it first (its data may "
                f"still be read from it), then run pybk decommission {bookie_id} again")
    held = holding_ledgers(_metadata(bk), bookie_id)
    if held:
        return (f"bookie {bookie_id} is still in the ensembles of "
                f"{'ledger' if len(held) == 1 else 'ledgers'} {ledgers_text(held)} "
                f"with entries not re-replicated elsewhere: run pybk decommission {bookie_id} "
                f"without --no-copy, or pybk rereplicate --bookie {bookie_id}, first")
    return ""


def retire(bk: LedgerClient, bookie_id: str, max_attempts: int = 20) -> list[str]:
    """Delete every record of a bookie id whose data is safe; the keys
    deleted.  ``IllegalOp`` (naming the ledgers, or the registration) when
    it is not safe."""
    store = bk.metadata_store
    deleted: list[str] = []
    for _ in range(max_attempts):
        why = refusal(bk, bookie_id)
        if why:
            raise errors.IllegalOp(why)
        try:
            for key in record_keys(bookie_id):
                cur = store.get(key)
                if cur is not None and store.delete(key, expected_version=cur.version):
                    deleted.append(key)
        except errors.MetadataVersion:
            continue                     # changed meanwhile: decide again
        return deleted
    raise errors.MetadataVersion(f"gave up retiring {bookie_id} after {max_attempts} CAS "
                                 "conflicts: run pybk decommission again")
