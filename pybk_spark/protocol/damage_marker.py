"""The damage marker: entry ranges a bookie lost and the auditor must copy
back to it.  Pure: no I/O.

Theory of operation
-------------------
Key ``bookies/damaged/<bookie_id>`` (``MARKER_PREFIX``; metadata/store.py's
key layout), value ``{"ranges": [[ledger, first, last], ...],
"unattributed": bool}``.  ``last == OPEN`` (-1) means every id above
``first`` (the damaged bytes may have held a ledger's tail).
``unattributed``: some damaged journal bytes could not be tied to a ledger,
so every ledger with the bookie in an ensemble must be checked.

Two writers, both by CAS on the marker's version:
  * the bookie (``bookie_server/storage/damage.py``) merges new damage in
    (``merge``: union, so re-publishing is idempotent);
  * the auditor (``pybk_spark/admin/operations/damage_repair.py``) copies the entries
    back from the other replicas, then writes ``remaining`` (what it could
    not repair yet: a failed copy, or a ledger whose last fragment, holding
    the bookie, is still being written) or deletes the marker.  If the bookie
    added damage meanwhile the CAS fails and the next round starts over.
The bookie then adopts the marker: repaired ranges leave its lost set, and it
answers NoSuchEntry for them again only once they are stored again.
"""
from __future__ import annotations

import json
from typing import Iterable, Optional

OPEN = -1
MARKER_PREFIX = "bookies/damaged/"

Range = tuple[int, int, int]          # (ledger, first, last or OPEN)


def marker_key(bookie_id: str) -> str:
    return MARKER_PREFIX + bookie_id


def merge(ranges: Iterable[Range]) -> list[Range]:
    """Ranges sorted, overlapping/adjacent ones of a ledger merged."""
    out: list[list[int]] = []
    for lid, first, last in sorted(ranges, key=lambda r: (r[0], r[1])):
        end = float("inf") if last == OPEN else last
        if out and out[-1][0] == lid:
            prev_end = float("inf") if out[-1][2] == OPEN else out[-1][2]
            if first <= prev_end + 1:
                if end > prev_end:
                    out[-1][2] = last
                continue
        out.append([lid, first, last])
    return [(a, b, c) for a, b, c in out]


def parse_marker(raw: Optional[bytes]) -> tuple[list[Range], bool]:
    if not raw:
        return [], False
    doc = json.loads(raw)
    return ([(int(a), int(b), int(c)) for a, b, c in doc.get("ranges", [])],
            bool(doc.get("unattributed", False)))


def marker_value(ranges: Iterable[Range], unattributed: bool) -> bytes:
    return json.dumps({"ranges": [list(r) for r in merge(ranges)],
                       "unattributed": unattributed}).encode()


def ledgers_to_check(ranges: Iterable[Range], unattributed: bool,
                     ledgers_with_bookie: Iterable[int]) -> list[int]:
    """The named ledgers, plus every ledger holding the bookie if unattributed."""
    out = {lid for lid, _f, _l in ranges}
    if unattributed:
        out |= set(ledgers_with_bookie)
    return sorted(out)


def remaining(ranges: Iterable[Range], unrepaired: Iterable[int],
              still_written: dict[int, int]) -> list[Range]:
    """What stays in the marker after a repair round: the ranges of ledgers
    not fully repaired (a ledger checked only because the damage was
    unattributed has no range: all of it, ``(ledger, 0, OPEN)``, so it is
    not forgotten when the unattributed flag is written away), and for a
    ledger whose last fragment holding the bookie is still being written
    (ledger -> that fragment's first id) an OPEN range from there: it is
    checked once the ledger is closed."""
    ranges = list(ranges)
    keep = set(unrepaired)
    named = {r[0] for r in ranges}
    out = [r for r in ranges if r[0] in keep]
    out += [(lid, 0, OPEN) for lid in keep - named]
    out += [(lid, first, OPEN) for lid, first in still_written.items()]
    return merge(out)
