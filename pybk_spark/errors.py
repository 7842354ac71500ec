"""One error vocabulary for client, bookie and tools.

Every failure that crosses a module boundary is one of these classes.  Each
class carries the integer ``code`` of its Apache BookKeeper counterpart
(``BKException.Code``), so logs and ``--json`` output line up with what a
BookKeeper operator already knows.

Translation happens in exactly two places:
  * gRPC status/response codes  <->  errors: ``pybk_spark.wire.codes``
  * etcd exceptions             ->   errors: ``pybk_spark.metadata.etcd_errors``

Outcome rule (Jepsen's ok / fail / info):  an error whose ``outcome_known`` is
False (timeouts, LedgerFenced on an add, lost connections) means the operation
MAY have taken effect.  Callers must treat it as "unknown", never as "failed".
"""
from __future__ import annotations

import difflib
from typing import Iterable, Mapping


class BKError(Exception):
    """Base class.  ``code`` mirrors BookKeeper's BKException.Code."""

    code = -1
    outcome_known = True

    def __init__(self, message: str = "", **context):
        self.context = context
        text = message or (self.__class__.__doc__ or self.__class__.__name__).splitlines()[0]
        if context:
            text = f"{text} ({', '.join(f'{k}={v}' for k, v in sorted(context.items()))})"
        super().__init__(text)


# -- request / parameter errors ------------------------------------------------
class IncorrectParameter(BKError):
    """Incorrect parameter."""
    code = -14


class MetadataTooLarge(IncorrectParameter):
    """A metadata value over what the store accepts (etcd: ``--max-request-bytes``,
    1.5 MiB by default); nothing was written."""

    @classmethod
    def refused(cls, detail: str) -> "MetadataTooLarge":
        """etcd's refusal (or the in-memory twin's, in the same words)."""
        return cls(f"etcd rejected request: {detail} (the limit is etcd's --max-request-bytes, "
                   f"1.5 MiB unless the etcd members set it)")


class BadRequest(BKError):
    """Malformed request."""
    code = -100


class TooLarge(BKError):
    """Entry or batch exceeds the configured size limit."""
    code = -29


class Unauthorized(BKError):
    """Wrong password / master key for this ledger."""
    code = -102


class IllegalOp(BKError):
    """Operation not allowed in the current state."""
    code = -100


# -- ledger / entry state --------------------------------------------------------
class NoSuchLedger(BKError):
    """No such ledger."""
    code = -7


class NoSuchEntry(BKError):
    """No such entry."""
    code = -13


class LedgerClosed(BKError):
    """Ledger is closed; no more adds."""
    code = -11


class LedgerExists(BKError):
    """Ledger already exists."""
    code = -20


class LedgerFenced(BKError):
    """Ledger is fenced.  For an add this means UNKNOWN outcome, like a timeout."""
    code = -101
    outcome_known = False


class LedgerRecoveryError(BKError):
    """Ledger recovery could not complete."""
    code = -10


class RecoveryRaced(LedgerRecoveryError):
    """A concurrent recovery changed the ensemble after this one had read it:
    this recovery's re-writes may not be where the metadata says; recover again."""


class DuplicateEntryId(BKError):
    """Entry id already written with different content."""
    code = -114


class BadDigest(BKError):
    """Entry digest mismatch (corrupt replica)."""
    code = -5


# -- bookie / cluster ----------------------------------------------------------------
class NotEnoughBookies(BKError):
    """Not enough writable bookies for the requested ensemble.

    Typed fields, for an operator to see what would fix it: ``ensemble`` the
    ensemble a replacement was sought for (empty for a new ensemble),
    ``needed`` / ``available`` the bookies a new ensemble needs and found,
    ``excluded`` each bookie that was not a candidate -> why (lost,
    read-only, being decommissioned, ...).  The message renders them once
    (``describe``); a caller that knows more reasons adds them with
    ``excluding``."""
    code = -6

    def __init__(self, message: str = "", *, ensemble: Iterable[str] = (),
                 excluded: Mapping[str, str] | None = None, needed: int | None = None,
                 available: int | None = None, **context):
        self.ensemble = tuple(ensemble)
        self.excluded = dict(sorted((excluded or {}).items()))
        self.needed, self.available = needed, available
        self.message = message
        super().__init__(self.describe(), **context)

    def describe(self) -> str:
        """``no bookie outside the ensemble {b1,b2,b3} is writable (b4: lost)``
        or ``needs 3 writable bookies, found 2 (...)``."""
        if self.message:
            text = self.message
        elif self.ensemble:
            text = f"no bookie outside the ensemble {{{','.join(self.ensemble)}}} is writable"
        elif self.needed is not None:
            text = f"needs {self.needed} writable bookies, found {self.available or 0}"
        else:
            text = (self.__class__.__doc__ or "").splitlines()[0]
        if self.excluded:
            text += " (" + "; ".join(f"{b}: {why}" for b, why in self.excluded.items()) + ")"
        return text

    def excluding(self, reasons: Mapping[str, str]) -> "NotEnoughBookies":
        """The same refusal with more excluded bookies named (a reason
        already recorded stands); bookies of the ensemble are not listed."""
        merged = {b: why for b, why in reasons.items() if b not in self.ensemble}
        merged.update(self.excluded)
        return NotEnoughBookies(self.message, ensemble=self.ensemble, excluded=merged,
                                needed=self.needed, available=self.available, **self.context)


class EmptyScope(IncorrectParameter):
    """The metadata scope holds no bookies and no ledgers: no bookie ever
    registered there, so the metadata URI most likely names the wrong scope."""


class BookieUnavailable(BKError):
    """Bookie handle not available (connection refused / closed)."""
    code = -8
    outcome_known = False


class TlsError(BookieUnavailable):
    """TLS between this client and a bookie failed (handshake, certificate, name)."""


class ReadOnly(BKError):
    """Write on a read-only bookie."""
    code = -104


class TooManyRequests(BKError):
    """Bookie is overloaded."""
    code = -105


class BookieIOError(BKError):
    """Bookie-side I/O error (disk full, EIO)."""
    code = -12


class InvalidCookie(BKError):
    """Bookie identity cookie mismatch (wiped or foreign data dir)."""
    code = -21


class DataDirInUse(BKError):
    """Directory locked by another live process (a second bookie or standalone on it)."""
    code = -12


class BookieIdInUse(BKError):
    """Bookie id registered by another live bookie."""
    code = -9


class PortInUse(BKError):
    """A port the process must listen on is already in use."""
    code = -12


class WriteError(BKError):
    """Write could not reach the ack quorum."""
    code = -12


class ReadError(BKError):
    """Read failed on every replica."""
    code = -1


class Timeout(BKError):
    """Operation timed out: outcome UNKNOWN."""
    code = -23
    outcome_known = False


# -- metadata store --------------------------------------------------------------------
class MetadataError(BKError):
    """Metadata store error."""
    code = -9


class MetadataVersion(MetadataError):
    """Compare-and-swap conflict: the metadata changed since it was read."""
    code = -17


class MetadataUnavailable(MetadataError):
    """Metadata store unreachable: outcome of a pending write UNKNOWN."""
    code = -9
    outcome_known = False


class MetadataUnauthorized(MetadataError):
    """The metadata store refused this client (TLS handshake, credentials or
    permission): not transient; the message names the setting to fix."""
    code = -102


class ClientClosed(BKError):
    """Client already closed."""
    code = -19


# -- logs ---------------------------------------------------------------------------------
class LogNotFound(BKError):
    """No such log."""
    code = -7


class LogTruncated(BKError):
    """Requested position was truncated away."""
    code = -25


class LogRecreated(LogTruncated):
    """The position was taken in a log that was deleted; a new log has its name
    (protocol/log_identity.py).  A LogTruncated: what it named is gone."""


class SchemaMismatch(BKError):
    """DataFrame schema incompatible with the log's recorded schema."""
    code = -14


# -- tiered storage ----------------------------------------------------------------------
class OffloadStoreError(BKError):
    """The offload location (a filesystem or object store) failed or is unreachable."""
    code = -12


class OffloadCorrupt(BadDigest):
    """An offloaded file differs from its record (size, checksum, rows or entry digests)."""


def close_matches(word: str, candidates: Iterable[str], n: int = 3) -> list[str]:
    """The ``candidates`` closest to ``word`` (compared case-insensitively,
    difflib's ratio >= 0.6), best first, each in its own spelling: the
    names a "did you mean" hint offers (option names, client settings, logs)."""
    spelled: dict[str, str] = {}
    for name in candidates:
        spelled.setdefault(str(name).lower(), str(name))
    return [spelled[m] for m in difflib.get_close_matches(str(word).lower(), sorted(spelled),
                                                          n=n, cutoff=0.6)]


def did_you_mean(word: str, candidates: Iterable[str], n: int = 3) -> str:
    """``"did you mean 'a' or 'b'?"`` for the closest candidates; "" when none is close."""
    close = close_matches(word, candidates, n)
    return f"did you mean {' or '.join(repr(c) for c in close)}?" if close else ""


def unknown_outcome(exc: BKError) -> BKError:
    """Mark this one error as an UNKNOWN outcome (``outcome_known`` False),
    e.g. a ``NotEnoughBookies`` or ``TooLarge`` that aborted adds already
    sent: some bookies may have stored them.  Returns ``exc``."""
    exc.outcome_known = False
    return exc


ALL_ERRORS = [c for c in list(globals().values())
              if isinstance(c, type) and issubclass(c, BKError)]
