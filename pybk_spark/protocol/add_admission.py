"""Add-path decisions: how big an add may be, what a bookie's add error
means, and how long to back off from an overloaded bookie.  No I/O.

Theory of operation
-------------------
Size limits (``limits``).  A bookie refuses an entry whose payload is over
its ``max_entry_bytes`` and an add request whose Arrow IPC batch is over its
``max_batch_bytes`` (``validate_batch``); its gRPC server and its add lane
accept messages / frames up to ``max_batch_bytes + 4 MiB``, so the batch
check is the binding one on both paths.  The client's own gRPC channel sends
at most ``max_message_bytes``.  A client must refuse an oversized entry
BEFORE it assigns the entry an id (BookKeeper's ``addEntry`` throws
``ArgumentException`` up front): once an id is assigned, the ledger cannot
release any later id until that one is stored on a quorum.  The limits are
the smallest of the client's ``max_entry_size_bytes`` and what each bookie
of the ensemble advertises in its registration (``limits``:
``max_entry_bytes``, ``max_batch_bytes``); a bookie that advertises nothing (older version) does
not bound them.  ``batch_overhead`` is a conservative estimate of the IPC
bytes a batch adds to its payloads (schema, headers, four int64 columns,
offsets, digests), so a request cut to ``request_payload_budget`` always
passes the bookie's batch check.

Add failures (``classify_add_failure``).  Every error a bookie (or the way
to it) returns for an add is exactly one of:
  * ``ABORT``: the ledger cannot be written by this handle any more
    (fenced, wrong password, closed): every pending add fails, outcome
    unknown.
  * ``ENTRY_REJECTED``: the request itself is refused (``TooLarge``: a
    bookie whose limit is below what the client learned, i.e. a
    misconfigured bookie).  The bookie is healthy: replacing it would be
    wrong, and another bookie with the same limit would refuse it too.  The
    ids are already assigned, and no later id may be released before this
    one, so the handle aborts with ``TooLarge`` (pending adds: outcome
    unknown, other bookies may have stored them); close recovers the tail.
  * ``OVERLOAD``: ``TooManyRequests``: the bookie shed the add before
    journaling it; the same request is sent again to the same bookie after
    ``backoff_delay`` (not a failure, no ensemble change) until
    ``overload_retry_s`` has passed since the first refusal, after which the
    bookie counts as failed (an ensemble change, as for a timeout).
  * ``BOOKIE_FAILURE``: anything else (timeout, unavailable, I/O error,
    read-only): the bookie is replaced by an ensemble change.

Backoff (``backoff_delay``): exponential with "full jitter"
(delay = u * min(cap, base * 2**attempt), u in [0, 1) from the caller's
injected rng), never above ``cap``.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable, Mapping

from pybk_spark import errors

ABORT = "abort"
ENTRY_REJECTED = "entry_rejected"
OVERLOAD = "overload"
BOOKIE_FAILURE = "bookie_failure"

# IPC bytes of a batch beyond its payloads: schema + message headers + buffer
# padding (a few KiB at most), and per entry 4 int64 columns, 2 binary
# offsets and a digest of up to 64 bytes, rounded up generously.
BATCH_FIXED_OVERHEAD = 16 << 10
BATCH_PER_ENTRY_OVERHEAD = 128
# the AddRequest around the batch: ledger id, key, request id, flags
REQUEST_OVERHEAD = 4 << 10


@dataclass(frozen=True)
class AddLimits:
    max_entry_bytes: int        # largest payload of one entry
    max_request_bytes: int      # largest serialized batch of one add request

    def entry_fits(self, size: int) -> bool:
        return size <= self.max_entry_bytes

    def request_payload_budget(self, entries: int) -> int:
        """Payload bytes ``entries`` entries may total in one request."""
        return self.max_request_bytes - batch_overhead(entries)


def batch_overhead(entries: int) -> int:
    return BATCH_FIXED_OVERHEAD + BATCH_PER_ENTRY_OVERHEAD * entries


def limits(client_max_entry: int, client_max_message: int,
           registrations: Iterable[Mapping[str, Any]]) -> AddLimits:
    """The limits for a ledger whose ensemble registered ``registrations``
    (the JSON dicts of ``bookies/writable/<id>``; their ``limits`` field)."""
    entry = client_max_entry
    request = client_max_message - REQUEST_OVERHEAD
    for reg in registrations:
        adv = reg.get("limits") if isinstance(reg, Mapping) else None
        adv = adv if isinstance(adv, Mapping) else {}
        b_entry = _positive(adv.get("max_entry_bytes"))
        b_batch = _positive(adv.get("max_batch_bytes"))
        if b_entry is not None:
            entry = min(entry, b_entry)
        if b_batch is not None:
            request = min(request, b_batch)
    # one entry alone must also pass the request check
    entry = min(entry, request - batch_overhead(1))
    return AddLimits(max(0, entry), max(0, request))


def _positive(value: Any) -> int | None:
    try:
        v = int(value)
    except (TypeError, ValueError):
        return None
    return v if v > 0 else None


def too_large(size: int, lim: AddLimits, **context: Any) -> errors.TooLarge:
    """The error for a payload over ``lim`` (names the settings to change)."""
    return errors.TooLarge(
        f"entry of {size} bytes is over the largest entry this ledger accepts, "
        f"{lim.max_entry_bytes} bytes (client config max_entry_size_bytes, bounded by the "
        f"ensemble bookies' max_entry_bytes / max_batch_bytes)", **context)


def classify_add_failure(exc: BaseException) -> str:
    """One of ABORT, ENTRY_REJECTED, OVERLOAD, BOOKIE_FAILURE (module doc)."""
    if isinstance(exc, (errors.LedgerFenced, errors.Unauthorized, errors.LedgerClosed)):
        return ABORT
    if isinstance(exc, errors.TooLarge):
        return ENTRY_REJECTED
    if isinstance(exc, errors.TooManyRequests):
        return OVERLOAD
    return BOOKIE_FAILURE


def backoff_delay(attempt: int, u: float, base_s: float, cap_s: float) -> float:
    """Delay before retry number ``attempt`` (0 = first) of an overloaded
    add; ``u`` uniform in [0, 1) from the caller's rng."""
    if base_s <= 0 or cap_s <= 0:
        return 0.0
    ceiling = min(cap_s, base_s * (2.0 ** min(attempt, 62)))
    return max(0.0, min(cap_s, u * ceiling))


def keep_retrying(first_refused_at: float, now: float, retry_s: float) -> bool:
    """Whether an add refused as overloaded is retried once more on the same
    bookie (True) or that bookie now counts as failed (False)."""
    return now - first_refused_at < retry_s
