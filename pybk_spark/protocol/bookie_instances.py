"""The cookie instances a bookie id has had, and what a new one means.
Pure: no I/O, no clock (times are arguments).

Theory of operation
-------------------
A bookie's cookie gets a fresh ``instance_id`` each time it is created:
on the first start of a data dir, and again after ``bookie-server format``
(which empties the data dir and deletes the metadata cookie).  The ledger
metadata names bookies by id only, so a formatted bookie that starts again
under its old id is named by every ensemble that held it, yet it holds none
of those entries: each of those ledgers has one copy too few until the
entries are copied back (BookKeeper: a new cookie instance under an old
bookie id is a new bookie, and the old one's ledgers are under-replicated).

Key ``bookies/instances/<bookie_id>`` (``instances_key``), value
``{"instances": [{"instance_id": ..., "since": wall seconds}, ...]}``,
oldest first, the newest ``MAX_KEPT`` kept.  Format never deletes it.  The
bookie appends its instance when it creates its cookie (``with_instance``,
by CAS).  ``data_lost(history, instance)``: an earlier, different instance
is recorded, so whatever the id held before this instance is gone.

What follows from a loss is the damage marker's job
(``protocol/damage_marker.py``): the id's marker gets ``unattributed`` (every
ledger with the bookie in an ensemble is checked, and the entries its write
sets lack are copied back onto it; ``admin/operations/damage_repair.py``), and the
bookie answers BookieIOError, never NoSuchEntry, for what it does not hold
until then.  ``bookie-server format`` sets that marker itself, so a bookie
id formatted before any instance was recorded is covered too.
"""
from __future__ import annotations

import json
from typing import Any, Optional

Record = dict[str, Any]          # {"instance_id": str, "since": float}

INSTANCES_PREFIX = "bookies/instances/"
MAX_KEPT = 16


def instances_key(bookie_id: str) -> str:
    return INSTANCES_PREFIX + bookie_id


def parse(raw: Optional[bytes]) -> list[Record]:
    """The recorded instances, oldest first ([] for none or an unreadable value)."""
    if not raw:
        return []
    try:
        doc = json.loads(raw)
    except ValueError:
        return []
    items = doc.get("instances", []) if isinstance(doc, dict) else []
    return [i for i in items if isinstance(i, dict) and i.get("instance_id")]


def value(history: list[Record]) -> bytes:
    return json.dumps({"instances": history[-MAX_KEPT:]}).encode()


def with_instance(history: list[Record], instance_id: str, now: float) -> list[Record]:
    """``history`` with ``instance_id`` as its newest entry (unchanged when it
    already is)."""
    if not instance_id:
        raise ValueError("an instance needs an id")
    if history and history[-1].get("instance_id") == instance_id:
        return list(history)
    return (list(history) + [{"instance_id": instance_id, "since": now}])[-MAX_KEPT:]


def data_lost(history: list[Record], instance_id: str) -> bool:
    """True when an instance other than ``instance_id`` was recorded before
    it: the bookie id held data that this instance does not have."""
    earlier = []
    for item in history:
        if item.get("instance_id") == instance_id:
            break
        earlier.append(item)
    return any(i.get("instance_id") != instance_id for i in earlier)


def current(history: list[Record]) -> str:
    """The newest recorded instance id ("" for none)."""
    return str(history[-1].get("instance_id", "")) if history else ""
