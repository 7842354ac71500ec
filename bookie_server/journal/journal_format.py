"""The journal's file format: file names, the record header and framing,
record types and their bodies, and a position in the journal.

A journal file ``<seq as 16 hex digits>.jnl`` is a sequence of records, each
``HEADER`` (body length u32, CRC u32 of type + body, type u8) then the body
(``frame``); ``journal.Journal`` writes them, ``journal_replay`` reads them
back.  Pure: no I/O but listing a directory.
"""
from __future__ import annotations

import enum
import os
import struct
from typing import NamedTuple

from bookie_server.journal.journal_crc import Body, crc_of

HEADER = struct.Struct("<IIB")
MAX_RECORD = 1 << 31
MIN_BODY = 8            # every record body: a ledger u64 first, an Arrow stream (> 8 bytes) or a PAD


class RecordType(enum.IntEnum):
    ADD_BATCH = 1       # body: Arrow IPC stream bytes as received
    FENCE = 2           # body: ledger u64
    MASTER_KEY = 3      # body: ledger u64 + key bytes
    EXPLICIT_LAC = 4    # body: ledger u64 + lac i64
    LEDGER_DELETED = 5  # body: ledger u64 (written by GC)
    PAD = 6             # body: zeros, filling to an aligned offset (direct_write.py); applies nothing
    ADD_ENTRY = 7       # body: one entry record as received (wire/entries.py, ENTRY_RECORD)


LEDGER = struct.Struct("<Q")
LEDGER_LAC = struct.Struct("<Qq")


def frame(rtype: int, body: Body) -> list[Body]:
    return [HEADER.pack(len(body), crc_of(rtype, body), rtype), body]


class Position(NamedTuple):
    """A place in the journal: file ``seq``, byte ``offset``; ordered as
    written.  A tuple: one is made per journal group, where a frozen
    dataclass's ``__init__`` costs several times as much."""
    seq: int
    offset: int


def file_name(seq: int) -> str:
    return f"{seq:016x}.jnl"


def list_files(directory: str) -> list[int]:
    out = []
    for name in os.listdir(directory):
        if name.endswith(".jnl"):
            try:
                out.append(int(name[:-4], 16))
            except ValueError:
                continue
    return sorted(out)
