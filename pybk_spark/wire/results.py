"""The answers of a bookie's read and LAC requests, as records: what the
bookie core returns and what every client transport hands its callers
(decoded from the wire's ``ReadResponse`` / ``ReadLacResponse``)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pyarrow as pa


@dataclass(frozen=True)
class ReadResult:
    # ENTRY_SCHEMA rows, contiguous from the first id asked; in a bookie, a
    # large pull's answer is a table of its stored batches (``rows_parts``)
    batch: pa.RecordBatch | pa.Table
    end: str                  # "COMPLETE" | "LIMIT" | "MISSING"
    lac: int
    fenced: bool
    raw: Any = None           # the Arrow IPC bytes ``batch`` was parsed from, when kept


@dataclass(frozen=True)
class LacResult:
    lac: int
    last_entry_id: int
    fenced: bool
    master_key: bytes = b""   # only to an operator (protocol/access.may_learn_key)
