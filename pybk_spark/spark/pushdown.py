"""Filter pushdown: Spark filters on ``ledger_id`` / ``entry_id`` -> read bounds.

Theory of operation
-------------------
Spark (with ``spark.sql.python.filterPushdown.enabled=true``) offers the
reader its filters; the reader returns those it does NOT fully handle and
Spark re-evaluates only those.  :func:`push` folds every filter it can apply
EXACTLY into a :class:`Bounds` value (ledger set / range, entry range); the
planner then plans only entries inside the bounds, so a filter reported as
handled is enforced entry by entry, not just partition by partition.
``entry_id IN (...)`` only narrows the range (conservative) and is returned
to Spark as unhandled.  Non-integer literals and other columns are unhandled.

Pure: no I/O.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Iterable, Optional

from pyspark.sql.datasource import (EqualTo, Filter, GreaterThan, GreaterThanOrEqual, In,
                                    IsNotNull, IsNull, LessThan, LessThanOrEqual)

NEVER = -1          # an inclusive upper bound below every id: nothing matches


@dataclass(frozen=True)
class Bounds:
    ledger_lo: int = 0
    ledger_hi: Optional[int] = None           # inclusive; None = unbounded
    ledger_in: Optional[frozenset] = None     # None = any
    entry_lo: int = 0
    entry_hi: Optional[int] = None            # inclusive; None = unbounded

    def allows_ledger(self, ledger_id: int) -> bool:
        if ledger_id < self.ledger_lo or (self.ledger_hi is not None and ledger_id > self.ledger_hi):
            return False
        return self.ledger_in is None or ledger_id in self.ledger_in

    @property
    def is_unbounded(self) -> bool:
        return self == Bounds()


def _int(value) -> Optional[int]:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _min(a: Optional[int], b: int) -> int:
    return b if a is None else min(a, b)


def _range(lo: int, hi: Optional[int], f: Filter) -> Optional[tuple[int, Optional[int]]]:
    """Fold one comparison into [lo, hi]; None if not an integer comparison."""
    if isinstance(f, (IsNotNull,)):
        return lo, hi                       # our columns are never null
    if isinstance(f, IsNull):
        return lo, NEVER
    v = _int(getattr(f, "value", None))
    if v is None:
        return None
    if isinstance(f, EqualTo):
        return max(lo, v), _min(hi, v)
    if isinstance(f, GreaterThan):
        return max(lo, v + 1), hi
    if isinstance(f, GreaterThanOrEqual):
        return max(lo, v), hi
    if isinstance(f, LessThan):
        return lo, _min(hi, v - 1)
    if isinstance(f, LessThanOrEqual):
        return lo, _min(hi, v)
    return None


def push_one(b: Bounds, f: Filter) -> tuple[Bounds, bool]:
    """-> (new bounds, handled exactly)."""
    column = tuple(getattr(f, "attribute", ()))
    if column == ("ledger_id",):
        if isinstance(f, In):
            values = [_int(v) for v in f.value]
            if any(v is None for v in values):
                return b, False
            keep = frozenset(values) if b.ledger_in is None else b.ledger_in & frozenset(values)
            return replace(b, ledger_in=keep), True
        got = _range(b.ledger_lo, b.ledger_hi, f)
        return (replace(b, ledger_lo=got[0], ledger_hi=got[1]), True) if got else (b, False)
    if column == ("entry_id",):
        if isinstance(f, In):
            values = [_int(v) for v in f.value]
            if not values or any(v is None for v in values):
                return b, False
            return replace(b, entry_lo=max(b.entry_lo, min(values)),
                           entry_hi=_min(b.entry_hi, max(values))), False
        got = _range(b.entry_lo, b.entry_hi, f)
        return (replace(b, entry_lo=got[0], entry_hi=got[1]), True) if got else (b, False)
    return b, False


def push(filters: Iterable[Filter]) -> tuple[Bounds, list[Filter]]:
    """-> (bounds, filters NOT handled exactly, in the order given)."""
    bounds, unhandled = Bounds(), []
    for f in filters:
        bounds, handled = push_one(bounds, f)
        if not handled:
            unhandled.append(f)
    return bounds, unhandled
