"""Operator switches of the autorecovery daemon, kept in the metadata store.

BookKeeper keeps these in ZooKeeper next to the auditor (``lostBookieRecovery
Delay``, the ``disable`` node of under-replication, ``triggeraudit``); here:

  audit/config    ``{"enabled": bool, "lost_bookie_recovery_delay_s": float|null}``
                  written by ``pybk autorecoveryctl`` / ``pybk lostbookierecoverydelay``
                  (CAS; created on first write).  Absent = enabled, and the delay
                  is the daemon's ``--delay``.  A delay set here overrides ``--delay``.
  audit/trigger   ``{"requested_at": epoch seconds, "by": str}``, rewritten (CAS) by
                  every ``pybk triggeraudit``; a running leader notices its version
                  change and starts a round at once instead of waiting ``--interval``.

Read by ``admin/operations/autorecovery.py`` at every round and by the bookie's admin
HTTP API (``/api/v1/autorecovery/status``): metadata shared by the operator
tools and the bookie, so it lives in the metadata layer.  Time is passed in
(``now``).
"""
from __future__ import annotations

import json
from typing import Callable, Optional

from pybk_spark import errors

CONFIG_KEY = "audit/config"
TRIGGER_KEY = "audit/trigger"
LEADER_KEY = "audit/leader"
MISSING_PREFIX = "audit/missing/"      # the auditor's marks: when a bookie was first seen gone
DEFAULTS = {"enabled": True, "lost_bookie_recovery_delay_s": None}


def read_config(store) -> dict:
    cur = store.get(CONFIG_KEY)
    out = dict(DEFAULTS)
    if cur is not None:
        try:
            out.update(json.loads(cur.value))
        except ValueError:
            pass
    return out


def _cas_merge(store, key: str, change: Callable[[dict], dict]) -> dict:
    """Create ``key`` or CAS-replace it with ``change(current dict)``."""
    merged: dict = {}

    def transform(value: Optional[bytes]) -> bytes:
        try:
            doc = json.loads(value) if value is not None else {}
        except ValueError:
            doc = {}
        merged.clear()
        merged.update(change(dict(doc)))
        return json.dumps(merged, sort_keys=True).encode()
    store.upsert(key, transform)
    return merged


def set_enabled(store, enabled: bool) -> dict:
    return {**DEFAULTS, **_cas_merge(store, CONFIG_KEY, lambda d: {**d, "enabled": enabled})}


def set_lost_bookie_delay(store, seconds: Optional[float]) -> dict:
    """``None`` removes the override (the daemon's ``--delay`` applies again)."""
    if seconds is not None and seconds < 0:
        raise errors.IncorrectParameter("lost bookie recovery delay must be >= 0 seconds")
    return {**DEFAULTS, **_cas_merge(
        store, CONFIG_KEY, lambda d: {**d, "lost_bookie_recovery_delay_s": seconds})}


def trigger(store, now: float, by: str) -> int:
    """Ask the autorecovery leader for a round now; returns the key's version."""
    _cas_merge(store, TRIGGER_KEY, lambda d: {"requested_at": now, "by": by,
                                              "count": int(d.get("count", 0)) + 1})
    return store.get(TRIGGER_KEY).version


def trigger_version(store) -> int:
    cur = store.get(TRIGGER_KEY)
    return cur.version if cur is not None else 0


def status(store) -> dict:
    """What ``autorecoveryctl`` and ``/api/v1/autorecovery/status`` show."""
    conf = read_config(store)
    leader = store.get(LEADER_KEY)
    try:
        leader_id = json.loads(leader.value).get("id") if leader is not None else None
    except ValueError:
        leader_id = None
    trig = store.get(TRIGGER_KEY)
    missing = {}
    for key, v in store.list_prefix(MISSING_PREFIX):
        try:
            missing[key[len(MISSING_PREFIX):]] = json.loads(v.value).get("since")
        except ValueError:
            continue
    return {"enabled": bool(conf["enabled"]),
            "lost_bookie_recovery_delay_s": conf["lost_bookie_recovery_delay_s"],
            "leader": leader_id,
            "last_trigger": json.loads(trig.value) if trig is not None else None,
            "missing_bookies": missing}
