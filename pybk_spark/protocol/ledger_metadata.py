"""Ledger metadata: the immutable value stored (as JSON) under one etcd key.

Theory of operation
-------------------
A ledger's metadata is a frozen value.  Every change is a *transform*: a pure
function ``old -> new`` (or an exception saying the change no longer applies).
The metadata adapter applies a transform with compare-and-swap on the etcd
revision the old value was read at; on a conflict it re-reads and calls the
SAME transform again on the fresh value, which re-decides from scratch (the
seed's "reread the metadata ... if the state is no longer OPEN ...").

Ordering obligations:
  * state moves only OPEN -> IN_RECOVERY -> CLOSED or OPEN -> CLOSED;
    CLOSED metadata never changes again (except deletion);
  * fragments (ensembles) are keyed by first entry id, strictly ascending;
    a new fragment never starts before the last one (BookKeeper #2615);
  * ``last_entry_id`` is meaningful only when CLOSED (-1 = empty ledger).

This module imports no I/O, no clock and no threads.
"""
from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field, replace
from typing import Mapping, Sequence

from pybk_spark import errors

OPEN = "OPEN"
IN_RECOVERY = "IN_RECOVERY"
CLOSED = "CLOSED"
STATES = (OPEN, IN_RECOVERY, CLOSED)

DIGEST_TYPES = ("crc32c", "hmac", "none")
METADATA_FORMAT_VERSION = 1


def validate_quorums(ensemble: int, write_quorum: int, ack_quorum: int) -> None:
    """E >= Qw >= Qa >= 1, else IncorrectParameter (checked before any I/O)."""
    for name, value in (("ensemble", ensemble), ("write_quorum", write_quorum),
                        ("ack_quorum", ack_quorum)):
        if not isinstance(value, int) or isinstance(value, bool):
            raise errors.IncorrectParameter(f"{name} must be an integer, got {value!r}")
    if not ensemble >= write_quorum >= ack_quorum >= 1:
        raise errors.IncorrectParameter(
            "quorums must satisfy E >= Qw >= Qa >= 1",
            ensemble=ensemble, write_quorum=write_quorum, ack_quorum=ack_quorum)


class MasterKey(bytes):
    """A ledger's master key standing in for its password (an operator
    learned the key from a bookie, not the password): ``master_key`` returns
    it unchanged, so the password check, fencing, recovery adds and keyed
    digests all work with it."""


def master_key(password: bytes) -> bytes:
    """The key bookies check on adds and fences (BookKeeper: SHA-1 of 'ledger'+pw)."""
    if isinstance(password, MasterKey):
        return bytes(password)
    return hashlib.sha256(b"pybk-ledger:" + bytes(password)).digest()


def key_check(password: bytes) -> str:
    """What metadata stores to verify a password at open time (not the key itself)."""
    return key_check_of(master_key(password))


def key_check_of(key: bytes) -> str:
    """``key_check`` from the master key itself (what an operator learns from a bookie)."""
    return hashlib.sha256(b"pybk-check:" + bytes(key)).hexdigest()


@dataclass(frozen=True)
class LedgerMetadata:
    ledger_id: int
    ensemble_size: int
    write_quorum: int
    ack_quorum: int
    ensembles: tuple[tuple[int, tuple[str, ...]], ...]   # ((first_entry, (bookie ids)), ...)
    state: str = OPEN
    last_entry_id: int = -1          # valid when CLOSED
    length: int = 0                  # bytes, valid when CLOSED
    digest_type: str = "crc32c"
    password_check: str = ""
    custom: Mapping[str, str] = field(default_factory=dict)
    ctime_ms: int = 0
    format_version: int = METADATA_FORMAT_VERSION
    # the writer's last ensemble, recorded when recovery began (OPEN ->
    # IN_RECOVERY); None for a ledger never recovered.  Recovery may replace
    # bookies in a new fragment before it has re-written the entries beyond
    # the boundary; the writer's bookies still hold those entries, so a later
    # recovery reads them too (docs/testing.md, "Bugs the harness found").
    writer_ensemble: tuple[str, ...] | None = None

    # -- derived views ----------------------------------------------------------
    @property
    def is_closed(self) -> bool:
        return self.state == CLOSED

    @property
    def current_ensemble(self) -> tuple[str, ...]:
        return self.ensembles[-1][1]

    @property
    def last_fragment_first_entry(self) -> int:
        return self.ensembles[-1][0]

    def ensemble_for(self, entry_id: int) -> tuple[str, ...]:
        chosen = self.ensembles[0][1]
        for first, bookies in self.ensembles:
            if first <= entry_id:
                chosen = bookies
            else:
                break
        return chosen

    def fragments(self) -> list[tuple[int, int, tuple[str, ...]]]:
        """[(first, last, bookies)]; last = -1 sentinel for an open-ended fragment
        (the last fragment of a non-closed ledger).  Empty fragments are skipped."""
        out = []
        for i, (first, bookies) in enumerate(self.ensembles):
            if i + 1 < len(self.ensembles):
                last = self.ensembles[i + 1][0] - 1
            else:
                last = self.last_entry_id if self.is_closed else -1
                if not self.is_closed:
                    out.append((first, -1, bookies))
                    continue
            if last >= first:
                out.append((first, last, bookies))
        return out

    def all_bookies(self) -> set[str]:
        return {b for _, bs in self.ensembles for b in bs}

    # -- (de)serialisation ---------------------------------------------------------
    def to_json(self) -> bytes:
        return json.dumps({
            "format_version": self.format_version,
            "ledger_id": self.ledger_id,
            "ensemble_size": self.ensemble_size,
            "write_quorum": self.write_quorum,
            "ack_quorum": self.ack_quorum,
            "state": self.state,
            "last_entry_id": self.last_entry_id,
            "length": self.length,
            "digest_type": self.digest_type,
            "password_check": self.password_check,
            "custom": dict(self.custom),
            "ctime_ms": self.ctime_ms,
            "ensembles": [[first, list(bookies)] for first, bookies in self.ensembles],
            **({"writer_ensemble": list(self.writer_ensemble)}
               if self.writer_ensemble is not None else {}),
        }, sort_keys=True).encode()

    @classmethod
    def from_json(cls, data: bytes) -> "LedgerMetadata":
        try:
            d = json.loads(data)
            return cls(
                ledger_id=int(d["ledger_id"]),
                ensemble_size=int(d["ensemble_size"]),
                write_quorum=int(d["write_quorum"]),
                ack_quorum=int(d["ack_quorum"]),
                state=d["state"],
                last_entry_id=int(d["last_entry_id"]),
                length=int(d.get("length", 0)),
                digest_type=d.get("digest_type", "crc32c"),
                password_check=d.get("password_check", ""),
                custom=dict(d.get("custom", {})),
                ctime_ms=int(d.get("ctime_ms", 0)),
                format_version=int(d.get("format_version", 1)),
                ensembles=tuple((int(f), tuple(b)) for f, b in d["ensembles"]),
                writer_ensemble=(tuple(d["writer_ensemble"]) if d.get("writer_ensemble")
                                 is not None else None),
            )
        except (ValueError, KeyError, TypeError) as exc:
            raise errors.MetadataError(f"corrupt ledger metadata: {exc}") from None


# -- pure transforms ---------------------------------------------------------------------
def new_ledger(ledger_id: int, ensemble: tuple[str, ...], write_quorum: int, ack_quorum: int,
               digest_type: str = "crc32c", password: bytes = b"",
               custom: Mapping[str, str] | None = None, ctime_ms: int = 0) -> LedgerMetadata:
    validate_quorums(len(ensemble), write_quorum, ack_quorum)
    if digest_type not in DIGEST_TYPES:
        raise errors.IncorrectParameter(f"digest must be one of {DIGEST_TYPES}, got {digest_type!r}")
    if len(set(ensemble)) != len(ensemble):
        raise errors.IncorrectParameter(f"ensemble has duplicate bookies: {ensemble}")
    return LedgerMetadata(
        ledger_id=ledger_id, ensemble_size=len(ensemble), write_quorum=write_quorum,
        ack_quorum=ack_quorum, ensembles=((0, tuple(ensemble)),), digest_type=digest_type,
        password_check=key_check(password), custom=dict(custom or {}), ctime_ms=ctime_ms)


def check_password(md: LedgerMetadata, password: bytes) -> None:
    """``Unauthorized`` unless ``password`` is the ledger's; an empty one (none
    given) is told apart from a wrong one, as its fix differs."""
    if md.password_check and md.password_check != key_check(password):
        if not password:
            raise errors.Unauthorized(
                "no password given for a ledger that has one: set the 'password' option "
                "(pybk: --password)", ledger_id=md.ledger_id)
        raise errors.Unauthorized("wrong password for ledger: not the one it was created with",
                                  ledger_id=md.ledger_id)


def password_for(md: LedgerMetadata, candidates: Sequence[bytes]) -> bytes:
    """The first of ``candidates`` (non-empty) that opens the ledger: a reader
    given several passwords (a log whose segments were written under
    different ones) uses, per ledger, the one its metadata records.
    ``Unauthorized`` when none does."""
    if not md.password_check:
        return candidates[0]
    if len(candidates) == 1:
        check_password(md, candidates[0])
        return candidates[0]
    for password in candidates:
        if key_check(password) == md.password_check:
            return password
    raise errors.Unauthorized(f"none of the {len(candidates)} passwords given opens ledger",
                              ledger_id=md.ledger_id)


def to_in_recovery(md: LedgerMetadata) -> LedgerMetadata:
    """Recovery step 1.  Idempotent for IN_RECOVERY; CLOSED needs no recovery.
    The first transition records the writer's last ensemble: from here on
    only recovery changes ensembles."""
    if md.state != OPEN:
        return md
    return replace(md, state=IN_RECOVERY, writer_ensemble=md.current_ensemble)


def recovery_replaced_tail(md: LedgerMetadata) -> bool:
    """An earlier recovery replaced some of the writer's bookies in the last
    fragment (its entries may not all be on the replacements yet)."""
    return md.writer_ensemble is not None and md.current_ensemble != md.writer_ensemble


def recovery_read_bookies(md: LedgerMetadata, slot: int) -> tuple[str, ...]:
    """Who may hold an entry beyond the recovery start at ``slot`` of its
    write set: the current ensemble's bookie, and the writer's bookie if a
    recovery replaced it (its entries may not be re-written yet)."""
    current = md.current_ensemble[slot]
    writer = md.writer_ensemble[slot] if md.writer_ensemble is not None else current
    return (current,) if writer == current else (current, writer)


def close_by_writer(md: LedgerMetadata, last_acked: int, length: int) -> LedgerMetadata:
    """The protocol's writer-close rules, re-decided on every CAS attempt."""
    if md.state == OPEN:
        return replace(md, state=CLOSED, last_entry_id=last_acked, length=length)
    if md.state == IN_RECOVERY:
        raise errors.LedgerFenced("ledger is being recovered by another client",
                                  ledger_id=md.ledger_id)
    if md.last_entry_id == last_acked:
        return md  # already closed where we would close it: success, no write
    raise errors.LedgerClosed("ledger was closed with a different last entry",
                              ledger_id=md.ledger_id, closed_at=md.last_entry_id,
                              last_acked=last_acked)


def close_by_recovery(md: LedgerMetadata, last_entry: int, length: int,
                      wrote_through: tuple[tuple[int, tuple[str, ...]], ...] | None = None) -> LedgerMetadata:
    """Recovery's final CAS.  If someone else closed first, their answer stands
    (all recoverers converge on the first CLOSED value).  ``wrote_through``:
    the fragments this recovery re-wrote through; if a concurrent recovery
    changed them since, the re-writes may sit on bookies the metadata no
    longer names, so this one must not close (RecoveryRaced: recover again)."""
    if md.state == CLOSED:
        return md
    if wrote_through is not None and md.ensembles != tuple(wrote_through):
        raise errors.RecoveryRaced("the ensemble changed under this recovery",
                                   ledger_id=md.ledger_id)
    return replace(md, state=CLOSED, last_entry_id=last_entry, length=length)


def replace_bookies(md: LedgerMetadata, first_entry: int, replacements: Mapping[int, str],
                    *, by_writer: bool = True) -> LedgerMetadata:
    """Start a new fragment at ``first_entry`` with ensemble slots replaced.

    A writer may change the ensemble only while OPEN; recovery (by_writer=False)
    only while IN_RECOVERY.  The new fragment must not start before the last one
    (#2615); starting at the same entry replaces that (empty) fragment.
    """
    if by_writer and md.state != OPEN:
        raise errors.LedgerFenced("ledger no longer OPEN; ensemble change refused",
                                  ledger_id=md.ledger_id, state=md.state)
    if not by_writer and md.state != IN_RECOVERY:
        raise errors.IllegalOp("ensemble change during recovery needs IN_RECOVERY",
                               ledger_id=md.ledger_id, state=md.state)
    last_first, last_bookies = md.ensembles[-1]
    if first_entry < last_first:
        raise errors.IllegalOp("new fragment would start before the last fragment",
                               first_entry=first_entry, last_fragment=last_first)
    bookies = list(last_bookies)
    for slot, bookie in replacements.items():
        bookies[slot] = bookie
    if len(set(bookies)) != len(bookies):
        raise errors.IllegalOp(f"replacement creates duplicate bookies: {bookies}")
    ensembles = list(md.ensembles)
    if first_entry == last_first:
        ensembles[-1] = (first_entry, tuple(bookies))
    else:
        ensembles.append((first_entry, tuple(bookies)))
    return replace(md, ensembles=tuple(ensembles))


def replace_fragment_bookie(md: LedgerMetadata, fragment_first: int, old: str, new: str) -> LedgerMetadata:
    """Re-replication: swap ``old`` for ``new`` in the fragment starting at
    ``fragment_first``.  Only for fragments that are complete (closed ledger, or
    not the last fragment)."""
    ensembles = list(md.ensembles)
    for i, (first, bookies) in enumerate(ensembles):
        if first == fragment_first:
            if i == len(ensembles) - 1 and not md.is_closed:
                raise errors.IllegalOp("fragment still being written", ledger_id=md.ledger_id)
            if old not in bookies:
                return md  # already replaced by someone else: idempotent
            if new in bookies:
                raise errors.IllegalOp(f"{new} already in fragment ensemble")
            ensembles[i] = (first, tuple(new if b == old else b for b in bookies))
            return replace(md, ensembles=tuple(ensembles))
    raise errors.IllegalOp("no fragment starts at that entry", fragment_first=fragment_first)


def with_custom(md: LedgerMetadata, custom: Mapping[str, str]) -> LedgerMetadata:
    return replace(md, custom={**md.custom, **custom})
