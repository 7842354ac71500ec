"""Time-based starts and ends of a read: the options, parsed and checked.

Theory of operation
-------------------
As in Spark's Kafka source, a read may start (and a batch read end) at an
append time instead of an offset, in **milliseconds since the Unix epoch**:
  * ``startingTimestamp`` / ``endingTimestamp``: one time for every ledger;
  * ``startingOffsetsByTimestamp`` / ``endingOffsetsByTimestamp``: JSON
    ``{"<ledgerId>": ms, ...}``; ledgers not named keep the default
    (earliest / latest).
A start time means "from the first entry appended at or after it"; an end
time means "up to, not including, the first entry appended at or after it"
(Kafka's semantics).  The driver turns them into entry ids while planning
(time_seek.py).  Unlike Kafka, which lets one option silently win, a start
given both as offsets and as a time is refused, and so is an end.

Pure: no I/O.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Callable, Mapping, Optional

from pybk_spark import errors
from pybk_spark.spark.option_values import ledger_integers

START_NAMES = ("startingTimestamp", "startingOffsetsByTimestamp")
END_NAMES = ("endingTimestamp", "endingOffsetsByTimestamp")


@dataclass(frozen=True)
class TimeBounds:
    start_ms: Optional[int] = None                     # every ledger
    starts_ms: Mapping[int, int] = field(default_factory=dict)    # ledger -> ms
    end_ms: Optional[int] = None
    ends_ms: Mapping[int, int] = field(default_factory=dict)

    @property
    def is_empty(self) -> bool:
        return self == TimeBounds()

    def start_for(self, ledger_id: int) -> Optional[int]:
        return self.starts_ms.get(ledger_id, self.start_ms)

    def end_for(self, ledger_id: int) -> Optional[int]:
        return self.ends_ms.get(ledger_id, self.end_ms)

    @property
    def named_ledgers(self) -> set:
        return set(self.starts_ms) | set(self.ends_ms)


def _ms(name: str, value: object) -> int:
    text = str(value).strip() if not isinstance(value, bool) else ""
    try:
        ms = int(text)
    except ValueError:
        ms = -1
    if ms < 0:
        raise errors.IncorrectParameter(
            f"option {name!r} must be milliseconds since the Unix epoch (an integer >= 0), "
            f"got {value!r}")
    return ms


def _by_ledger(name: str, text: str) -> dict[int, int]:
    try:
        parsed = json.loads(str(text))
    except ValueError:
        parsed = None
    if not isinstance(parsed, dict) or not parsed:
        raise errors.IncorrectParameter(
            f"option {name!r} must be JSON {{\"<ledgerId>\": msSinceEpoch, ...}}, got {text!r}")
    return {ledger_id: _ms(name, value) for ledger_id, value in ledger_integers(name, parsed, "time")}


def parse_time_bounds(get: Callable[[str], Optional[str]], *, multi: bool) -> TimeBounds:
    """``get(name)``: the option's value or None.  ``multi``: several logs
    are read (ledger ids are per log: no per-ledger JSON)."""
    values = {n: get(n) for n in START_NAMES + END_NAMES}
    for pair, offsets in ((START_NAMES, "startingOffsets"), (END_NAMES, "endingOffsets")):
        given = [n for n in pair if values[n] is not None]
        if get(offsets) is not None:
            given.insert(0, offsets)
        if len(given) > 1:
            raise errors.IncorrectParameter(
                f"options {given} all set where the read starts/ends: give one of them")
    if multi:
        for name in ("startingOffsetsByTimestamp", "endingOffsetsByTimestamp"):
            if values[name] is not None:
                raise errors.IncorrectParameter(
                    f"option {name!r} cannot be used with 'logs'/'logPattern' (ledger ids are "
                    "per log); use 'startingTimestamp'/'endingTimestamp'")
    start, end = values["startingTimestamp"], values["endingTimestamp"]
    starts, ends = values["startingOffsetsByTimestamp"], values["endingOffsetsByTimestamp"]
    return TimeBounds(
        start_ms=_ms("startingTimestamp", start) if start is not None else None,
        starts_ms=_by_ledger("startingOffsetsByTimestamp", starts) if starts is not None else {},
        end_ms=_ms("endingTimestamp", end) if end is not None else None,
        ends_ms=_by_ledger("endingOffsetsByTimestamp", ends) if ends is not None else {})
