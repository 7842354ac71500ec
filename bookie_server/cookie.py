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
"""
from __future__ import annotations

import json
import os
import shutil
import uuid
from typing import Optional

from pybk_spark import errors

LOCAL_NAME = "cookie.json"
LOCK_NAME = "bookie.lock"     # the data dir's lock (pybk_spark/dirlock.py): not data
CREATE, OK = "create", "ok"
ENTRY_FORMAT = 2          # 2: entries carry ``length`` (pybk_spark/wire/entries.py)


def cookie_key(bookie_id: str) -> str:
    return f"cookies/{bookie_id}"


def decide(bookie_id: str, local: Optional[dict], remote: Optional[dict],
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
            f"cookie for {bookie_id!r} exists in metadata (instance {remote.get('instance_id')}) "
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


def _format_ok(local: dict) -> str:
    """The data dir is this bookie's: OK if its entries are in the format it reads."""
    if local.get("entry_format", 1) < ENTRY_FORMAT:
        raise errors.InvalidCookie(
            f"data dir holds entries in format {local.get('entry_format', 1)} (before entries "
            f"carried their cumulative length); this bookie reads only format {ENTRY_FORMAT}. "
            "Refusing to start; run `bookie-server format` to rejoin as a new bookie")
    return OK


def new_cookie(bookie_id: str, rng_uuid=uuid.uuid4) -> dict:
    return {"bookie_id": bookie_id, "instance_id": str(rng_uuid()), "version": 1,
            "entry_format": ENTRY_FORMAT}


def read_local(data_dir: str) -> Optional[dict]:
    path = os.path.join(data_dir, LOCAL_NAME)
    if not os.path.exists(path):
        return None
    with open(path, encoding="utf-8") as fh:
        return json.load(fh)


def write_local(data_dir: str, cookie: dict) -> None:
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


def check_or_create(data_dir: str, bookie_id: str, store=None) -> dict:
    """Verify identity; create the cookies on first start.  Raises InvalidCookie."""
    local = read_local(data_dir)
    remote = None
    if store is not None:
        got = store.get(cookie_key(bookie_id))
        remote = json.loads(got.value) if got is not None else None
    action = decide(bookie_id, local, remote, has_data(data_dir), standalone=store is None)
    if action == OK:
        return local
    cookie = local or remote or new_cookie(bookie_id)
    if store is not None and remote is None:
        try:
            store.put_if_absent(cookie_key(bookie_id), json.dumps(cookie).encode())
        except errors.MetadataVersion:
            raise errors.InvalidCookie(f"another bookie registered cookie {bookie_id!r} "
                                       "concurrently") from None
    write_local(data_dir, cookie)
    return cookie


def format_bookie(data_dir: str, bookie_id: str, store=None) -> None:
    """Delete the metadata cookie and the local data (bookieformat).  The
    caller holds the data dir's lock; its lock file is kept."""
    if store is not None:
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
