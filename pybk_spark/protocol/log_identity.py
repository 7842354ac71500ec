"""A log's identity: which incarnation of a log name a position belongs to.

Theory of operation
-------------------
A log is found by its name, and a name can be reused: ``pybk deletelog L``
followed by a write to ``L`` makes a new log that starts again at segment
index 0.  A position (a stream offset, a registered read position, batch
offsets) recorded in the old log would then be read against the new one,
and a position past the new log's end reads nothing, forever, without an
error.  So a log records a *uid* when it is created (``LogMetadata.uid``,
random, drawn from the caller's rng), and every position records the uid
of the log it was taken in.

Comparison (:func:`recreated`): a position belongs to another log when
both sides have a uid and they differ.  A side without one cannot tell:

  * a position without a uid was recorded before logs had one (an older
    checkpoint, an older registered position): it is taken as before;
  * a log without a uid was created by an older version; an older version
    that rewrites a log's metadata also drops fields it does not know, so
    a log that lost its uid may still be the same log: its positions are
    taken as before too.

A log never gets a uid after its creation: a uid given later would differ
from one given by another process doing the same, and the two would then
take each other's log for a new one.

Pure: no I/O; the randomness is the caller's.
"""
from __future__ import annotations

from typing import Optional, Protocol

UID_BITS = 128


class RandomBits(Protocol):
    """The part of the caller's rng (a ``random.Random``) a uid needs."""

    def getrandbits(self, k: int, /) -> int: ...


def new_uid(rng: RandomBits) -> str:
    """A fresh log uid (32 hex digits)."""
    return f"{rng.getrandbits(UID_BITS):0{UID_BITS // 4}x}"


def recreated(recorded: Optional[str], current: Optional[str]) -> bool:
    """True: a position recorded in the log with uid ``recorded`` is read
    against another log of the same name (uid ``current``)."""
    return recorded is not None and current is not None and recorded != current


def comparable(recorded: Optional[str], current: Optional[str]) -> bool:
    """False: one side has no uid, so :func:`recreated` cannot tell (see the
    module docstring); callers log that at debug level."""
    return recorded is not None and current is not None


def describe(name: str, recorded: Optional[str], current: Optional[str]) -> str:
    """The one-line explanation every refusal uses."""
    return (f"log {name!r} was deleted and created again: the position was taken in the log "
            f"with uid {recorded}, the log of that name now has uid {current}")
