"""Per-ledger state on one bookie and the decisions taken from it.  Pure: no I/O.

Theory of operation
-------------------
A bookie knows, per ledger: the master key (recorded by the first add or
fence), whether it is fenced, the highest LAC carried by any stored entry,
the highest explicitly written LAC and the highest entry id stored.

Decisions (called under the bookie's state lock, in journal-submission order,
so that a fence submitted before an add is also before it on disk):
  * ``check_key``: a recorded key must match exactly -> else Unauthorized.
    An empty key on a ledger with a recorded key is also Unauthorized,
    except on the operator's key-less path (``keyless``: protocol/access.py
    decided the peer is an operator sending the empty key on a recovery add
    or a fence): no check, and no key is recorded.
  * ``decide_add``: read-only bookie -> ReadOnly (recovery adds are allowed,
    like BookKeeper's high-priority writes); fenced ledger + plain add ->
    LedgerFenced; recovery adds bypass the fence.
  * ``admit_add``: ``decide_add`` that says "nothing changes" (None)
    instead of making a ``Plan`` (the lone add's hot path).
  * ``decide_fence``: key check only; fencing twice is a no-op.
The returned ``Plan`` says which journal records must precede the operation
(MASTER_KEY when the key is new, FENCE when the ledger was not yet fenced).
LAC = max(entry lacs, explicit lac).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, NamedTuple

from pybk_spark import errors


class LedgerState(NamedTuple):
    """Immutable (a change replaces it).  A named tuple, not a frozen
    dataclass: a durable add makes one (``apply_entries``), and a tuple is
    made in a third of the time of a frozen dataclass's ``__init__``."""
    ledger_id: int
    master_key: bytes | None = None
    fenced: bool = False
    entry_lac: int = -1
    explicit_lac: int = -1
    last_entry_id: int = -1

    @property
    def lac(self) -> int:
        return max(self.entry_lac, self.explicit_lac)

    def to_json(self) -> dict[str, Any]:
        return {"ledger_id": self.ledger_id,
                "master_key": self.master_key.hex() if self.master_key is not None else None,
                "fenced": self.fenced, "entry_lac": self.entry_lac,
                "explicit_lac": self.explicit_lac, "last_entry_id": self.last_entry_id}

    @staticmethod
    def from_json(d: dict[str, Any]) -> "LedgerState":
        key = d.get("master_key")
        return LedgerState(int(d["ledger_id"]), bytes.fromhex(key) if key is not None else None,
                           bool(d["fenced"]), int(d["entry_lac"]), int(d["explicit_lac"]),
                           int(d["last_entry_id"]))


@dataclass(frozen=True)
class Plan:
    """What to journal before the operation itself, and the new state."""
    state: LedgerState
    record_key: bool = False
    record_fence: bool = False


def empty(ledger_id: int) -> LedgerState:
    return LedgerState(ledger_id)


def check_key(state: LedgerState, key: bytes, keyless: bool = False) -> bool:
    """Raise Unauthorized on mismatch; True if the key must be recorded now."""
    if keyless:
        return False
    if state.master_key is None:
        return True
    if bytes(key) != state.master_key:
        raise errors.Unauthorized("wrong master key", ledger_id=state.ledger_id)
    return False


def decide_add(state: LedgerState, key: bytes, *, recovery: bool, read_only: bool,
               keyless: bool = False) -> Plan:
    plan = admit_add(state, key, recovery, read_only, keyless)
    return Plan(state) if plan is None else plan


def admit_add(state: LedgerState, key: bytes, recovery: bool, read_only: bool,
              keyless: bool = False) -> Plan | None:
    """``decide_add``, with None for the add that changes nothing (no record
    before it, ``state`` stays, and ``state`` has its key recorded): every
    add of a ledger after its first, with no ``Plan`` made."""
    if read_only and not recovery:
        raise errors.ReadOnly("bookie is read-only", ledger_id=state.ledger_id)
    new_key = check_key(state, key, keyless)
    if state.fenced and not recovery:
        raise errors.LedgerFenced("ledger is fenced", ledger_id=state.ledger_id)
    if new_key:
        return Plan(state._replace(master_key=bytes(key)), record_key=True)
    return None if state.master_key is not None else Plan(state)


def decide_fence(state: LedgerState, key: bytes, keyless: bool = False) -> Plan:
    new_key = check_key(state, key, keyless)
    new_state = state._replace(master_key=bytes(key)) if new_key else state
    if state.fenced:
        return Plan(new_state, record_key=new_key)
    return Plan(new_state._replace(fenced=True), record_key=new_key, record_fence=True)


def decide_write_lac(state: LedgerState, key: bytes, lac: int) -> Plan:
    new_key = check_key(state, key)
    s = state._replace(master_key=bytes(key)) if new_key else state
    return Plan(s._replace(explicit_lac=max(s.explicit_lac, lac)), record_key=new_key)


# -- applying durable facts (journal replay and live path share these) ----------
def apply_key(state: LedgerState, key: bytes) -> LedgerState:
    return state if state.master_key is not None else state._replace(master_key=bytes(key))


def apply_fence(state: LedgerState) -> LedgerState:
    return state if state.fenced else state._replace(fenced=True)


def apply_explicit_lac(state: LedgerState, lac: int) -> LedgerState:
    return state if lac <= state.explicit_lac else state._replace(explicit_lac=lac)


def apply_entries(state: LedgerState, max_lac: int, max_entry_id: int) -> LedgerState:
    if max_lac <= state.entry_lac and max_entry_id <= state.last_entry_id:
        return state
    # the constructor, not ``_replace`` (keyword handling): once per durable add
    return LedgerState(state.ledger_id, state.master_key, state.fenced,
                       max(state.entry_lac, max_lac), state.explicit_lac,
                       max(state.last_entry_id, max_entry_id))
