"""Registered read positions in etcd (adapter of protocol/positions.py).

Keys ``positions/<log>/<name>``; every change by CAS (``store.update`` after a
put-if-absent), dropping by a versioned delete.
"""
from __future__ import annotations

from typing import Optional

from pybk_spark import errors
from pybk_spark.metadata.store import position_key, positions_prefix
from pybk_spark.protocol import positions as pos
from pybk_spark.protocol.positions import RegisteredPosition
from pybk_spark.metadata import keys


def record(store, new: RegisteredPosition) -> RegisteredPosition:
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


def list_positions(store, log: Optional[str] = None) -> list[RegisteredPosition]:
    prefix = positions_prefix(log) if log is not None else keys.POSITIONS_PREFIX
    out = []
    for _, versioned in store.list_prefix(prefix):
        out.append(RegisteredPosition.from_json(versioned.value))
    return sorted(out, key=lambda p: (p.log, p.index, p.entry, p.name))


def drop(store, log: str, name: str) -> RegisteredPosition:
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
