"""The bookie's per-ledger states and the one lock they live under.

``states`` maps a ledger id to its ``ledger_state.LedgerState`` (an
immutable value: a change replaces it); a ledger without an entry is in its
empty state.  ``cond`` is the bookie's state lock: deciding and journaling
under it makes journal order equal decision order (bookie.py), and long
polls wait on it for the LAC to move.  A ledger is *known* when it has a
state or stored entries.
"""
from __future__ import annotations

import threading

from pybk_spark.protocol import ledger_state as ls
from bookie_server.storage.entry_store import EntryStore


class LedgerTable:
    def __init__(self, store: EntryStore) -> None:
        # ``lock`` is ``cond``'s own lock: entering it directly is one C call,
        # entering ``cond`` a Python one (the add path takes it twice per add)
        self.lock = threading.RLock()
        self.cond = threading.Condition(self.lock)
        self.states: dict[int, ls.LedgerState] = {}
        # threads waiting on ``cond`` (long polls), counted under ``lock``:
        # with none, making an add durable skips notify_all (Python code)
        self.waiters = 0
        self._store = store

    def get(self, ledger_id: int) -> ls.LedgerState:
        return self.states.get(ledger_id) or ls.empty(ledger_id)

    def known(self, ledger_id: int) -> bool:
        return ledger_id in self.states or self._store.has_ledger(ledger_id)
