"""The etcd key layout: every key and prefix the client, bookies and tools use.

Theory of operation
-------------------
All keys live under the store's scope (``etcd://.../SCOPE``; the adapters add
the scope, callers never do).  The layout, one line per kind:

  ledgers/<id:020d>              ledger metadata (JSON), changed only by CAS
  writers/<id:020d>              the live writer's claim on a ledger
  logs/<name>                    a log: its ordered list of ledgers (the newest, and
                                 the chunks holding the rest: protocol/log_metadata.py)
  logchunks/<name>/<rev>-<i>     a sealed chunk of a long log's list (immutable)
  positions/<log>/<name>         a registered read position on a log
  cookies/<bookie id>            a bookie's identity cookie
  bookies/writable/<bookie id>   a registered writable bookie (under a lease)
  bookies/readonly/<bookie id>   a registered read-only bookie (under a lease)
  bookies/damaged/<bookie id>    a bookie's damage marker (protocol/damage_marker.py)
  bookies/instances/<bookie id>  the cookie instances the id has had (protocol/bookie_instances.py)

Pure string functions, no I/O.  Ids are zero-padded so that a prefix listing
returns ledgers in id order.  etcd roles (admin/commands/etcd_roles.py) grant by these
prefixes, so a new kind of key needs a role change too.
"""
from __future__ import annotations

from typing import Iterator, Optional

from pybk_spark.protocol.damage_marker import MARKER_PREFIX as DAMAGED_PREFIX  # noqa: F401
from pybk_spark.protocol.bookie_instances import INSTANCES_PREFIX  # noqa: F401

LEDGERS_PREFIX = "ledgers/"
WRITERS_PREFIX = "writers/"
LOGS_PREFIX = "logs/"
LOG_CHUNKS_PREFIX = "logchunks/"
POSITIONS_PREFIX = "positions/"
COOKIES_PREFIX = "cookies/"
BOOKIES_PREFIX = "bookies/"
BOOKIE_MODES = ("writable", "readonly")
# every first path element of the layout: how a scope's end is told in a key
# (``audit/`` is the auditor's, ``spark/`` the Spark writer's pending attempts,
# ``idgen`` the ledger id counter)
SCOPE_ROOTS = (LEDGERS_PREFIX, WRITERS_PREFIX, LOGS_PREFIX, LOG_CHUNKS_PREFIX, POSITIONS_PREFIX,
               COOKIES_PREFIX, BOOKIES_PREFIX, "audit/", "spark/", "idgen")


def ledger_key(ledger_id: int) -> str:
    return f"{LEDGERS_PREFIX}{ledger_id:020d}"


def writer_key(ledger_id: int) -> str:
    return f"{WRITERS_PREFIX}{ledger_id:020d}"


def log_key(name: str) -> str:
    return f"{LOGS_PREFIX}{name}"


def log_chunks_prefix(name: str) -> str:
    return f"{LOG_CHUNKS_PREFIX}{name}/"


def log_chunk_key(name: str, head_version: int, index: int) -> str:
    """A sealed chunk of a long log, written by the change made on the head's
    version ``head_version`` (an etcd revision: never reused, so never
    another chunk's name)."""
    return f"{log_chunks_prefix(name)}{head_version:020d}-{index:04d}"


def position_key(log: str, name: str) -> str:
    return f"{POSITIONS_PREFIX}{log}/{name}"


def positions_prefix(log: str) -> str:
    return f"{POSITIONS_PREFIX}{log}/"


def cookie_key(bookie_id: str) -> str:
    return f"{COOKIES_PREFIX}{bookie_id}"


def bookies_prefix(mode: str) -> str:
    """``bookies/<mode>/``; mode is ``writable``, ``readonly`` or ``damaged``."""
    return f"{BOOKIES_PREFIX}{mode}/"


def bookie_key(mode: str, bookie_id: str) -> str:
    return f"{bookies_prefix(mode)}{bookie_id}"


def last_part(key: str) -> str:
    """The id at the end of a key (``bookies/writable/b1`` -> ``b1``)."""
    return key.rsplit("/", 1)[1]


def iter_ids(keys: Iterator[str]) -> Iterator[int]:
    for k in keys:
        yield int(last_part(k))


def scope_of(full_key: str) -> Optional[str]:
    """The scope of a whole etcd key ``/<scope>/<key>`` of this layout (scopes
    may hold ``/``: the shortest one followed by a layout root); None for a
    key of another layout."""
    best = -1
    for root in SCOPE_ROOTS:
        i = full_key.find("/" + root, 1)
        if i > 0 and (best < 0 or i < best):
            best = i
    return full_key[1:best] if best > 0 else None
