"""Which registered bookies do not answer: the suspects ``pybk triggeraudit``
reports.

A bookie's liveness is its registration (``bookies/writable|readonly/<id>``)
under a lease it refreshes every ttl/3; there is no other heartbeat.  A
bookie killed with SIGKILL stays registered until its lease ends (the
bookie's ``registration_ttl_s``, 15 s by default), and until then an audit
does not count it missing.  So each registered bookie is probed at the
addresses it registered (``probe``: ``GetBookieInfo``, and a
read over the lane when it registered one); one that does not answer is a
suspect, reported with the time its lease has left
(``MetadataStore.lease_time_left``).  A registration that is gone by the
time it is read counts as lapsed (0 s left).
"""
from __future__ import annotations

import json
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Callable, Optional

from pybk_spark.metadata.store import MetadataStore
from pybk_spark import errors
from pybk_spark.metadata import keys
from pybk_spark.transport.grpc_bookie import BookieClient
from pybk_spark.transport.tls import ClientTls

PROBE_TIMEOUT_S = 3.0
_PROBE_LEDGER = 0       # any id: an answer about it, entries or NoSuchLedger, is what counts


def probe(registration: dict, tls: Optional[ClientTls] = None,
          timeout: float = PROBE_TIMEOUT_S) -> str:
    """'' when the bookie answers at the addresses of ``registration``; else
    why not (the typed error, one line)."""
    bookie_id = registration.get("bookie_id", "")
    lane = registration.get("add_lane_address") or ""
    client = BookieClient(registration["address"], default_timeout=timeout, bookie_id=bookie_id,
                          read_lane_address=lane, tls=tls)
    try:
        client.info().result(timeout + 1.0)
        if lane:
            client.read(_PROBE_LEDGER, 0, 0, max_entries=1).result(timeout + 1.0)
    except (errors.BookieUnavailable, errors.Timeout) as exc:
        return f"{type(exc).__name__}: {exc}"
    except errors.BKError:
        pass                    # refused or not found: the bookie answered
    finally:
        client.close()
    return ""


def registrations(store: MetadataStore) -> dict[str, dict]:
    """bookie id -> its registration (with ``mode``), writable and read-only."""
    out: dict[str, dict] = {}
    for mode in keys.BOOKIE_MODES:
        for key, v in store.list_prefix(keys.bookies_prefix(mode)):
            try:
                reg = json.loads(v.value)
            except ValueError:
                reg = {}
            reg = reg if isinstance(reg, dict) else {}
            reg.setdefault("bookie_id", keys.last_part(key))
            out[keys.last_part(key)] = {**reg, "mode": mode}
    return out


def suspects(store: MetadataStore, tls: Optional[ClientTls] = None,
             timeout: float = PROBE_TIMEOUT_S) -> tuple[int, list[dict]]:
    """(bookies probed, [{bookie, address, error, lease_lapses_in_s}] of those
    registered but not answering), by bookie id."""
    regs = registrations(store)
    with ThreadPoolExecutor(max_workers=max(1, min(16, len(regs)))) as pool:
        failed = dict(zip(regs, pool.map(
            lambda reg: probe(reg, tls, timeout) if reg.get("address") else "no address registered",
            regs.values())))
    out: list[dict] = []
    for bookie, why in sorted(failed.items()):
        if not why:
            continue
        left = store.lease_time_left(keys.bookie_key(regs[bookie]["mode"], bookie))
        out.append({"bookie": bookie, "address": regs[bookie].get("address", ""),
                    "error": why, "lease_lapses_in_s": 0.0 if left is None else left})
    return len(regs), out


def wait_lapsed(store: MetadataStore, found: list[dict], *,
                clock: Callable[[], float] = time.monotonic,
                sleep: Callable[[float], None] = time.sleep,
                slack_s: float = 5.0) -> Optional[list[str]]:
    """Wait until every suspect's registration is gone (its lease lapsed);
    at most the longest time left plus ``slack_s``.  None when all lapsed,
    else the ids still registered (a bookie that refreshed its lease after
    all: alive, if slow)."""
    deadline = clock() + max((s["lease_lapses_in_s"] for s in found), default=0.0) + slack_s
    pending = [s["bookie"] for s in found]
    while True:
        regs = registrations(store)
        pending = [b for b in pending if b in regs]
        if not pending:
            return None
        if clock() >= deadline:
            return pending
        sleep(0.2)
