"""Streaming offsets over several logs: a per-log map, fair admission control.

Theory of operation
-------------------
A stream over several logs (options ``logs`` / ``logPattern``) has as its
offset one stream_offsets.Offset per log, the next entry to read in that
log: ``{"logs": {"<log>": {"index": I, "entry": E}, ...}}`` (names sorted, so
that equal offsets serialise equally: Spark compares offsets by their JSON).
A single-log stream keeps the single-log form ``{"index": I, "entry": E}``,
so checkpoints written before this module existed stay readable; the two
forms never mix in one query (:func:`parse` refuses a single-log offset
where a map is expected, naming the option that changed).

Which logs a trigger covers (:func:`reconcile`): the logs listed now (the
``logs`` option, or every log matching ``logPattern``, re-listed each
trigger).  A log listed now but not in the start offset is new and starts at
its first entry still present (Kafka: new partitions start at earliest).
A log in the start offset but no longer listed was deleted: the caller
reports data loss (failOnDataLoss) and it is dropped from the offset.

Each log's entry names the log it was taken in (``"uid"``, as a single-log
offset does; :func:`uids`).  A log listed now whose uid differs from the
one recorded (:func:`recreated_logs`) was deleted and created again: the
caller reports data loss (``LogRecreated``) and it starts again, as a new
log, at its first entry.

Fairness (:func:`plan_ends`): the admission budgets (``maxEntriesPerTrigger``,
``maxBytesPerTrigger``) are shared max-min fairly (:func:`fair_shares`):
every log with entries waiting gets an equal share, a log needing less
than its share leaves the rest to the others.  Whole entries cannot be
split, so an entry budget's remainder goes to the logs with the most
waiting (ties: name order), one entry each; a log that got nothing this
trigger has the most waiting in the next one, so no log starves.  Each log
then advances as a single-log stream does, within its shares
(stream_offsets.advance: never past an open segment, at least one entry
from a log whose byte share is smaller than its next entry - so a byte
budget is soft by at most one entry per log).  Bytes waiting that are not
known (an open tail of a log with no closed segment) count as the whole
budget.

Pure: no I/O, no clock.
"""
from __future__ import annotations

import json
from typing import Any, Mapping, Optional, Sequence

from pybk_spark import errors
from pybk_spark.protocol.log_identity import recreated
from pybk_spark.spark.stream_offsets import Extent, Offset, advance, lag, uid_of, with_uid

LOGS_KEY = "logs"


def to_dict(offsets: Mapping[str, Offset],
            uids: Mapping[str, Optional[str]] = {}) -> dict:
    """The offset dict; ``uids``: the uid of each log, recorded with its position."""
    return {LOGS_KEY: {name: with_uid(offsets[name].to_dict(), uids.get(name))
                       for name in sorted(offsets)}}


def uids(d: Any) -> dict[str, Optional[str]]:
    """The uid recorded for each log of an offset dict (None: not recorded)."""
    logs = d.get(LOGS_KEY) if isinstance(d, dict) else None
    return {str(n): uid_of(o) for n, o in logs.items()} if isinstance(logs, dict) else {}


def recreated_logs(recorded: Mapping[str, Optional[str]],
                   current: Mapping[str, Optional[str]]) -> list[str]:
    """The logs listed now (``current``: name -> uid) that are another log
    than the one of that name an offset was taken in (``recorded``)."""
    return sorted(n for n, uid in current.items()
                  if n in recorded and recreated(recorded[n], uid))


def parse(d: Any) -> dict[str, Offset]:
    """The per-log map of an offset dict (IncorrectParameter otherwise)."""
    if not isinstance(d, dict) or not isinstance(d.get(LOGS_KEY), dict):
        if isinstance(d, dict) and "index" in d:
            raise errors.IncorrectParameter(
                "this checkpoint holds a single-log offset (option 'log'); a query reading "
                "'logs'/'logPattern' needs a new checkpointLocation")
        raise errors.IncorrectParameter(f"not a bookkeeper multi-log stream offset: {d!r}")
    return {str(name): Offset.from_dict(o) for name, o in d[LOGS_KEY].items()}


def parse_starting(text: str) -> dict[str, Offset]:
    """``startingOffsets`` JSON of a multi-log stream: ``{"<log>": {"index": I,
    "entry": E}, ...}`` (logs not named start at earliest)."""
    try:
        parsed = json.loads(text)
    except ValueError:
        parsed = None
    if not isinstance(parsed, dict) or not parsed:
        raise errors.IncorrectParameter(
            "option 'startingOffsets' of a stream over 'logs'/'logPattern' must be 'earliest', "
            f"'latest' or JSON {{\"<log>\": {{\"index\": I, \"entry\": E}}, ...}}, got {text!r}")
    out = {}
    for name, o in parsed.items():
        if not isinstance(o, dict):
            raise errors.IncorrectParameter(
                "option 'startingOffsets' of a stream over 'logs'/'logPattern' names each "
                f"log's position, {{\"<log>\": {{\"index\": I, \"entry\": E}}, ...}}; the "
                f"value for {name!r} is {o!r}")
        out[str(name)] = Offset.from_dict(o)
    return out


def reconcile(start: Mapping[str, Offset], listed: Sequence[str],
              firsts: Mapping[str, Offset]) -> tuple[dict[str, Offset], list[str]]:
    """-> (the start offset of every listed log, the logs of ``start`` that are
    gone).  ``firsts``: the first position still present of each listed log."""
    begins = {}
    for name in listed:
        begins[name] = start[name] if name in start else firsts[name]
    gone = sorted(n for n in start if n not in set(listed))
    return begins, gone


def fair_shares(demands: Mapping[str, float], budget: Optional[float],
                integral: bool = False) -> dict[str, Any]:
    """Max-min fair split of ``budget`` over ``demands`` (None budget: no limit).
    A log's share is at most its demand; with ``integral`` shares are whole,
    the remainder going one each to the largest demands (ties: name order)."""
    if budget is None:
        return {name: None for name in demands}
    shares: dict[str, Any] = {name: 0 for name in demands}
    left: Any = budget
    open_ = sorted((n for n, d in demands.items() if d > 0), key=lambda n: (demands[n], n))
    while open_ and left > 0:
        each = left / len(open_)
        if integral:
            each = int(each)
            if each == 0:
                break
        smallest = open_[0]
        if demands[smallest] - shares[smallest] <= each:      # satisfied: frees the rest
            give = demands[smallest] - shares[smallest]
            shares[smallest] += give
            left -= give
            open_.pop(0)
            continue
        for n in open_:
            shares[n] += each
        left -= each * len(open_)
        if not integral:
            break
    if integral and left > 0 and open_:
        for n in sorted(open_, key=lambda n: (-(demands[n] - shares[n]), n))[:int(left)]:
            shares[n] += 1
    return shares


def plan_ends(begins: Mapping[str, Offset], extents: Mapping[str, Sequence[Extent]],
              averages: Mapping[str, Optional[float]], max_entries: Optional[int] = None,
              max_bytes: Optional[int] = None) -> dict[str, Offset]:
    """The end offset of every log for one trigger, within the fair shares."""
    waiting = {n: lag(begins[n], extents[n], averages.get(n)) for n in begins}
    entry_shares = fair_shares({n: w[0] for n, w in waiting.items()}, max_entries,
                               integral=True)
    byte_demands = {n: (w[1] if w[1] >= 0 else (max_bytes or 0)) if w[0] else 0
                    for n, w in waiting.items()}
    byte_shares = fair_shares(byte_demands, max_bytes)
    ends = {}
    for name, begin in begins.items():
        most, nbytes = entry_shares[name], byte_shares[name]
        if not waiting[name][0]:
            ends[name] = advance(begin, extents[name])       # normalise past read segments
        elif most == 0:
            ends[name] = begin                               # its turn comes next trigger
        else:
            ends[name] = advance(begin, extents[name], most,
                                 None if nbytes is None else max(1, int(nbytes)),
                                 averages.get(name))
    return ends
