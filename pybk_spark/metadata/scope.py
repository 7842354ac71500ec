"""Is this the right scope?  The one check behind every "empty scope" error.

A scope that any bookie ever started in holds its cookie (``cookies/<id>``)
and, while it runs, its registration (``bookies/<mode>/<id>``), whatever
happened to its ledgers.  A scope with neither (and with no log and no ledger) is
one no cluster uses: almost always a misspelt scope in the metadata URI.  ``require_bookies`` turns that
into ``EmptyScope`` naming the scopes that do have bookies (when the
credentials may list them), instead of the NoSuchLedger / NotEnoughBookies /
LogNotFound the wrong scope otherwise produces.

Who calls it (docs/operations.md, "An empty scope"): ``create_ledger`` when
it finds no writable bookie at all, ``read_ledger_metadata`` before
NoSuchLedger, ``read_log`` before LogNotFound, and the Spark sink's driver before it writes
anything.  Commands that create or inspect metadata only (``bookie-server``
registering the first bookie, ``pybk listbookies``, ``listlogs``, etcd role
set-up) never call it: an empty scope is where they legitimately start.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from pybk_spark import errors
from pybk_spark.metadata import keys

if TYPE_CHECKING:                  # store.py's read_ledger_metadata calls this module
    from pybk_spark.metadata.store import MetadataStore


# what a scope in use holds; the first ones are the small ones, and they
# decide for every scope a bookie ever started in
_IN_USE = (keys.BOOKIES_PREFIX, keys.COOKIES_PREFIX, keys.LOGS_PREFIX, keys.LEDGERS_PREFIX)


def require_bookies(store: "MetadataStore") -> None:
    """EmptyScope unless ``store``'s scope holds a bookie's registration or
    cookie, a log or a ledger."""
    if any(store.list_prefix(prefix) for prefix in _IN_USE):
        return
    raise errors.EmptyScope(f"{describe(store)} holds no bookies and no ledgers: no bookie "
                            f"has registered in it; {_elsewhere(store)}")


def describe(store: "MetadataStore") -> str:
    uri = getattr(store, "uri", None)
    scope = getattr(store, "scope", None)
    if uri and scope:
        return f"metadata scope {scope!r} ({uri.partition('?')[0]})"
    return "the metadata scope"


def _elsewhere(store: "MetadataStore") -> str:
    """Where bookies are: the fix to offer."""
    try:
        scopes = store.scopes_with(keys.bookies_prefix("writable"))
    except errors.MetadataUnauthorized:
        return ("check the scope in the metadata URI (these credentials cannot list the "
                "other scopes)")
    if not scopes:
        return ("no scope of this etcd has bookies either: start bookie-server with this "
                "metadataServiceUri (docs/operations.md)")
    return ("check the scope in the metadata URI; scopes with bookies: "
            + ", ".join(repr(s) for s in scopes))
