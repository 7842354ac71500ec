"""Registered positions in etcd (adapter of protocol/positions.py): streaming
queries' read positions, and exactly-once sinks' committed positions.

Keys ``positions/<log>/<name>``; every change by CAS (``store.update`` after a
put-if-absent), dropping by a versioned delete.
"""
from __future__ import annotations

from typing import Optional, Sequence

from pybk_spark import errors
from pybk_spark.metadata.store import MetadataStore, position_key, positions_prefix
from pybk_spark.protocol import positions as pos
from pybk_spark.protocol.log_identity import recreated
from pybk_spark.protocol.log_metadata import LogMetadata
from pybk_spark.protocol.positions import RegisteredPosition
from pybk_spark.metadata import keys


def record(store: MetadataStore, new: RegisteredPosition) -> RegisteredPosition:
    """Store ``new`` unless the registered position is already further."""
    pos.check_name(new.name)
    key = position_key(new.log, new.name)
    while True:
        if store.get(key) is None:
            try:
                store.put_if_absent(key, new.to_json())
                return new
            except errors.MetadataVersion:
                continue
        try:
            value, _ = store.update(key, lambda raw: pos.advance(
                RegisteredPosition.from_json(raw), new).to_json())
            return RegisteredPosition.from_json(value)
        except errors.NoSuchLedger:        # dropped meanwhile: create it again
            continue


def list_positions(store: MetadataStore, log: Optional[str] = None) -> list[RegisteredPosition]:
    prefix = positions_prefix(log) if log is not None else keys.POSITIONS_PREFIX
    out: list[RegisteredPosition] = []
    for _, versioned in store.list_prefix(prefix):
        out.append(RegisteredPosition.from_json(versioned.value))
    return sorted(out, key=lambda p: (p.log, p.index, p.entry, p.name))


def drop(store: MetadataStore, log: str, name: str) -> RegisteredPosition:
    """Remove one registered position (CAS on the version read); NoSuchPosition
    is reported as IncorrectParameter naming what exists."""
    key = position_key(log, pos.check_name(name))
    got = store.get(key)
    if got is None:
        known = [p.name for p in list_positions(store, log)]
        raise errors.IncorrectParameter(
            f"log {log!r} has no registered position {name!r}; registered: {known or 'none'} "
            "(pybk positions LOG lists them)")
    store.delete(key, expected_version=got.version)
    return RegisteredPosition.from_json(got.value)


def drop_all(store: MetadataStore, log: str, uid: Optional[str]) -> list[RegisteredPosition]:
    """Remove the positions registered in the deleted log ``log`` with uid
    ``uid``, so that a log created later under its name starts with none;
    a position of that later log (another uid) is kept."""
    gone: list[RegisteredPosition] = []
    for key, versioned in store.list_prefix(positions_prefix(log)):
        if recreated(RegisteredPosition.from_json(versioned.value).uid, uid):
            continue
        try:
            store.delete(key, expected_version=versioned.version)
        except errors.MetadataVersion:
            continue        # moved meanwhile: a query still committing; its uid tells
        gone.append(RegisteredPosition.from_json(versioned.value))
    return gone


def record_sink(store: MetadataStore, md: LogMetadata, written: Sequence[int], name: str,
                sink_id: str, batch_id: int, now: float) -> Optional[RegisteredPosition]:
    """After a sink's commit CAS: its position in ``md`` (the log as committed)
    just past the ledgers ``written`` by micro-batch ``batch_id``, kind
    ``sink`` (informational: it never holds back truncation).  An empty
    batch keeps the place and moves the batch id; a replayed one records
    nothing."""
    at = pos.after_written(md.ledger_ids, md.truncated_ledgers, written)
    if at is None:
        if list(written):
            return None                        # replayed: its ledgers were deleted
        got = store.get(position_key(md.name, name))
        at = ((RegisteredPosition.from_json(got.value).index, 0) if got is not None
              else (md.truncated_ledgers + len(md.segments), 0))
    return record(store, RegisteredPosition(md.name, name, at[0], at[1], pos.SINK, now,
                                            batch_id=int(batch_id), detail=sink_id,
                                            uid=md.uid))
