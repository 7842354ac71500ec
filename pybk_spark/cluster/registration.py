"""A bookie's registration as a cluster launcher waits for it.

``fresh_registration`` reads the bookie's registration (``bookies/<mode>/<id>``,
``metadata/keys.py``) and returns it only if it was written after the etcd
revision ``since`` (the revision read before the launch), so a registration
left by the bookie's previous run does not count.  An unavailable metadata
store reads as "not yet": the caller polls until its own deadline.
"""
from __future__ import annotations

import json
from typing import Optional

from pybk_spark import errors
from pybk_spark.metadata import keys

MODES = {None: ("writable", "readonly"), False: ("writable",), True: ("readonly",)}


def fresh_registration(store, bookie_id: str, since: int,
                       read_only: Optional[bool] = None) -> Optional[dict]:
    """The registration JSON of ``bookie_id`` written after revision ``since``,
    in either mode (``read_only=None``) or the one asked for; else None."""
    for mode in MODES[read_only]:
        try:
            got = store.get(keys.bookie_key(mode, bookie_id))
        except errors.MetadataUnavailable:
            got = None
        if got is not None and got.version > since:
            return json.loads(got.value)
    return None
