"""Bookie identity cookie: one copy in etcd (``cookies/<id>``), one on disk.

Theory of operation
-------------------
``decide(local, remote, data_dir_has_data)`` is pure and returns what to do:
  * neither cookie and an empty data dir      -> CREATE both (new instance id)
  * both present and equal (bookie id, instance id) -> OK
  * anything else (etcd cookie but wiped/foreign data dir, local cookie but
    none in etcd, mismatching ids, data without a cookie) -> refuse with
    InvalidCookie.  A wiped bookie must never rejoin silently: it would
    answer NoSuchEntry for entries it once acknowledged.
  * a local cookie from before ``ENTRY_FORMAT`` 2 (entries without their
    cumulative ``length``, docs/protocol.md "Entry format") -> refuse with
    InvalidCookie: the bookie could not replay or serve that data, and
    silently skipping it would be the same as a wiped disk.
``format`` (the escape hatch, like BookKeeper's bookieformat) deletes the etcd
cookie and the local data so the bookie can join as a new one.

A new instance under an old id: the ledger metadata still names the bookie
id in every ensemble that held it, but the new instance holds none of those
entries (``pybk_spark/protocol/bookie_instances.py``).  So ``format`` sets
the id's damage marker to ``unattributed`` (``mark_data_lost``) before it
deletes anything, and a newly created cookie is appended to the id's
instance history (``bookies/instances/<id>``, by CAS); when an earlier,
different instance is recorded there the marker is set too.  The bookie
adopts the marker before it serves (answering BookieIOError, never
NoSuchEntry, for what it lacks), and the auditor copies every entry its
write sets lack back onto it (``pybk_spark/admin/operations/damage_repair.py``).

The cookie also records the bookie's advertised address (``address``,
``host:port`` of gRPC, bookie_server/serving/identity.py), as BookKeeper's cookie
records its bookie host.  ``decide_address(recorded, current)`` (pure):
  * no address recorded (a cookie from before addresses were recorded)
    -> RECORD it now, in both copies;
  * the same address -> OK;
  * another address -> refuse with InvalidCookie: the data dir was last
    served at another address, which clients and ledger metadata may still
    name.  ``update_address`` (``bookie-server updatecookie``, BookKeeper's
    ``bookkeeper shell updatecookie``) rewrites both copies once an operator
    confirms the move.
"""
from __future__ import annotations

import json
import logging
import os
import shutil
import time
import uuid
from typing import TYPE_CHECKING, Any, Callable, Optional

from pybk_spark import errors
from pybk_spark.metadata import keys
from pybk_spark.protocol import bookie_instances as bi
from pybk_spark.protocol import damage_marker as dm

if TYPE_CHECKING:
    from pybk_spark.metadata.store import MetadataStore

log = logging.getLogger("bookie.cookie")

LOCAL_NAME = "cookie.json"
LOCK_NAME = "bookie.lock"     # the data dir's lock (pybk_spark/dirlock.py): not data
CREATE, OK, RECORD = "create", "ok", "record"
ENTRY_FORMAT = 2          # 2: entries carry ``length`` (pybk_spark/wire/entries.py)


def cookie_key(bookie_id: str) -> str:
    return keys.cookie_key(bookie_id)


def decide(bookie_id: str, local: Optional[dict[str, Any]], remote: Optional[dict[str, Any]],
           data_dir_has_data: bool, standalone: bool) -> str:
    if local is not None and local.get("bookie_id") != bookie_id:
        raise errors.InvalidCookie(f"data dir belongs to bookie {local.get('bookie_id')!r}, "
                                   f"not {bookie_id!r}")
    if standalone:
        if local is None and data_dir_has_data:
            raise errors.InvalidCookie("data dir has data but no cookie.json (foreign dir?)")
        return CREATE if local is None else _format_ok(local)
    if local is None and remote is None:
        if data_dir_has_data:
            raise errors.InvalidCookie("data dir has data but no cookie.json (foreign dir?)")
        return CREATE
    if local is None:
        raise errors.InvalidCookie(
            f"cookie for {bookie_id!r} exists in metadata (instance {(remote or {}).get('instance_id')}) "
            "but the data dir has none: it was wiped or is foreign. Refusing to start; run "
            "`bookie-server format` to rejoin as a new bookie")
    if remote is None:
        raise errors.InvalidCookie(
            f"data dir has cookie instance {local.get('instance_id')} but metadata has no cookie "
            f"for {bookie_id!r}: stale data dir (bookie was formatted). Refusing to start")
    if local.get("instance_id") != remote.get("instance_id"):
        raise errors.InvalidCookie(
            f"cookie mismatch for {bookie_id!r}: data dir instance {local.get('instance_id')} != "
            f"metadata instance {remote.get('instance_id')}")
    return _format_ok(local)


def _format_ok(local: dict[str, Any]) -> str:
    """The data dir is this bookie's: OK if its entries are in the format it reads."""
    if local.get("entry_format", 1) < ENTRY_FORMAT:
        raise errors.InvalidCookie(
            f"data dir holds entries in format {local.get('entry_format', 1)} (before entries "
            f"carried their cumulative length); this bookie reads only format {ENTRY_FORMAT}. "
            "Refusing to start; run `bookie-server format` to rejoin as a new bookie")
    return OK


def decide_address(bookie_id: str, recorded: Optional[str], current: str,
                   update_hint: str = "") -> str:
    if not current or recorded == current:
        return OK
    if not recorded:
        return RECORD
    raise errors.InvalidCookie(
        f"bookie {bookie_id!r} was registered at {recorded} but now advertises {current} "
        f"(advertised_address / bind_address / port): refusing to start.  If the bookie "
        f"really moved, record the new address with: "
        f"{update_hint or 'bookie-server updatecookie (with the same flags)'}")


def new_cookie(bookie_id: str, rng_uuid: Callable[[], uuid.UUID] = uuid.uuid4,
               address: str = "") -> dict[str, Any]:
    cookie = {"bookie_id": bookie_id, "instance_id": str(rng_uuid()), "version": 1,
              "entry_format": ENTRY_FORMAT}
    if address:
        cookie["address"] = address
    return cookie


def read_local(data_dir: str) -> Optional[dict[str, Any]]:
    path = os.path.join(data_dir, LOCAL_NAME)
    if not os.path.exists(path):
        return None
    with open(path, encoding="utf-8") as fh:
        cookie: dict[str, Any] = json.load(fh)
    return cookie


def write_local(data_dir: str, cookie: dict[str, Any]) -> None:
    os.makedirs(data_dir, exist_ok=True)
    tmp = os.path.join(data_dir, LOCAL_NAME + ".tmp")
    with open(tmp, "w", encoding="utf-8") as fh:
        json.dump(cookie, fh)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, os.path.join(data_dir, LOCAL_NAME))


def has_data(data_dir: str) -> bool:
    if not os.path.isdir(data_dir):
        return False
    return any(n not in (LOCAL_NAME, LOCK_NAME) for n in os.listdir(data_dir))


def _read_remote(store: Optional[MetadataStore], bookie_id: str
                 ) -> tuple[Optional[dict[str, Any]], Optional[int]]:
    got = store.get(cookie_key(bookie_id)) if store is not None else None
    return (json.loads(got.value), got.version) if got is not None else (None, None)


def check_or_create(data_dir: str, bookie_id: str, store: Optional[MetadataStore] = None,
                    address: str = "",
                    update_hint: str = "", clock: Callable[[], float] = time.time) -> dict[str, Any]:
    """Verify identity (and the advertised ``address``); create the cookies
    on first start (recording the new instance, ``record_instance``).
    Raises InvalidCookie."""
    local = read_local(data_dir)
    remote, version = _read_remote(store, bookie_id)
    action = decide(bookie_id, local, remote, has_data(data_dir), standalone=store is None)
    if action == OK and local is not None:      # OK: there is a local cookie (decide)
        for recorded in (local.get("address"), (remote or {}).get("address")):
            decide_address(bookie_id, recorded, address, update_hint)
        if address and (local.get("address") != address
                        or (remote is not None and remote.get("address") != address)):
            _write_address(data_dir, bookie_id, store, local, remote, version, address)
        return read_local(data_dir) or local
    cookie = local or remote or new_cookie(bookie_id, address=address)
    if address and not cookie.get("address"):
        cookie = {**cookie, "address": address}
    if store is not None and remote is None:
        record_instance(store, bookie_id, cookie["instance_id"], clock())
        try:
            store.put_if_absent(cookie_key(bookie_id), json.dumps(cookie).encode())
        except errors.MetadataVersion:
            raise errors.InvalidCookie(f"another bookie registered cookie {bookie_id!r} "
                                       "concurrently") from None
    write_local(data_dir, cookie)
    return cookie


def _write_address(data_dir: str, bookie_id: str, store: Optional[MetadataStore], local: dict[str, Any],
                   remote: Optional[dict[str, Any]], version: Optional[int], address: str) -> None:
    """Both copies now say ``address``: etcd first (by CAS), then the disk."""
    if remote is not None and store is not None and version is not None:
        try:
            store.compare_and_swap(cookie_key(bookie_id),
                                   json.dumps({**remote, "address": address}).encode(), version)
        except errors.MetadataVersion:
            raise errors.InvalidCookie(f"cookie {bookie_id!r} changed in metadata concurrently; "
                                       "retry") from None
    write_local(data_dir, {**local, "address": address})


def update_address(data_dir: str, bookie_id: str, store: Optional[MetadataStore],
                   address: str) -> Optional[str]:
    """``bookie-server updatecookie``: record ``address`` in both copies of a
    valid cookie (same bookie id and instance); returns the old address.
    Raises InvalidCookie for anything ``decide`` would refuse."""
    local = read_local(data_dir)
    remote, version = _read_remote(store, bookie_id)
    if local is None:
        raise errors.InvalidCookie(f"data dir {data_dir} has no cookie.json: nothing to update")
    decide(bookie_id, local, remote, has_data(data_dir), standalone=store is None)
    old = local.get("address") or (remote or {}).get("address")
    _write_address(data_dir, bookie_id, store, local, remote, version, address)
    return old


def mark_data_lost(store: MetadataStore, bookie_id: str) -> None:
    """Set ``unattributed`` in the id's damage marker (merged by CAS): every
    ledger with the bookie in an ensemble is checked and copied back."""
    store.upsert(dm.marker_key(bookie_id),
                 lambda raw: dm.marker_value(dm.parse_marker(raw)[0], True))


def record_instance(store: MetadataStore, bookie_id: str, instance_id: str, now: float) -> bool:
    """Append ``instance_id`` to the id's instance history (by CAS); True,
    with the damage marker set, when the id had another instance before:
    its data is not in this one."""
    raw = store.upsert(bi.instances_key(bookie_id),
                       lambda raw: bi.value(bi.with_instance(bi.parse(raw), instance_id, now)))
    history = bi.parse(raw)
    if not bi.data_lost(history, instance_id):
        return False
    mark_data_lost(store, bookie_id)
    earlier = [i["instance_id"] for i in history if i["instance_id"] != instance_id]
    log.warning("event=bookie_instance_replaced bookie_id=%s instance=%s previous=%s "
                "marker=%s (every ledger naming this bookie is checked and copied back)",
                bookie_id, instance_id, earlier[-1], dm.marker_key(bookie_id))
    return True


def holds_anything(data_dir: str) -> bool:
    """The data dir has a cookie or data (anything but its lock file)."""
    return has_data(data_dir) or os.path.exists(os.path.join(data_dir, LOCAL_NAME))


def format_bookie(data_dir: str, bookie_id: str, store: Optional[MetadataStore] = None) -> bool:
    """Delete the metadata cookie and the local data (bookieformat).  The
    caller holds the data dir's lock; its lock file is kept.  When the id
    held anything (a cookie in either place, data, a recorded instance) its
    damage marker is set first (``mark_data_lost``); returns whether it was."""
    marked = False
    if store is not None:
        if (store.get(cookie_key(bookie_id)) is not None or holds_anything(data_dir)
                or store.get(bi.instances_key(bookie_id)) is not None):
            mark_data_lost(store, bookie_id)
            marked = True
        store.delete(cookie_key(bookie_id))
    if os.path.isdir(data_dir):
        for name in os.listdir(data_dir):
            if name == LOCK_NAME:
                continue
            path = os.path.join(data_dir, name)
            if os.path.isdir(path):
                shutil.rmtree(path)
            else:
                os.unlink(path)
    return marked
