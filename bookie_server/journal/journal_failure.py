"""The journal's failure: poisoned once, for good, and what that fails.

A write or fdatasync failure poisons the journal for good: after a failed
fdatasync the kernel may have dropped the dirty pages, so a retry that
succeeds proves nothing ("fsyncgate").  The failed group is not
acknowledged, nor any group written after it (the pipeline may already have
written more into the same file: the sync stage fails those), nor any later
submission; nothing is fsynced again, not at roll or close.  One
``event=journal_failed op= errno= path=`` line, one ``on_failure`` call;
only a restart (replay) re-establishes durability.
"""
from __future__ import annotations

import errno
import logging
from typing import Callable, Iterable, Optional

from bookie_server.journal.records import Submission
from pybk_spark import errors

log = logging.getLogger("bookie.journal")


class JournalFailure:
    """``error``: what poisoned the journal, or None.  Shared by the group
    commit (journal.py) and the sync stage (journal_sync.py)."""

    def __init__(self, path_of: Callable[[int], str],
                 on_failure: Optional[Callable[[BaseException], None]] = None) -> None:
        self.error: Optional[BaseException] = None
        self._path_of = path_of
        self._on_failure = on_failure        # called once, on the failing journal thread

    def poison(self, exc: BaseException, op: str, seq: int) -> None:
        """Fail the journal for good (never retried; see the docstring)."""
        if self.error is None:
            self.error = exc
            code = getattr(exc, "errno", None)
            log.error("event=journal_failed op=%s errno=%s path=%s error=%r "
                      "action=read_only_until_restart", op,
                      errno.errorcode.get(code, code) if code is not None else "-",
                      self._path_of(seq), exc)
            if self._on_failure is not None:
                try:
                    self._on_failure(exc)
                except Exception:  # noqa: BLE001 - the journal stays failed regardless
                    log.exception("event=journal_failure_hook_error")

    def why(self) -> str:
        return f"journal failed: {self.error}"


def fail(group: Iterable[Submission], why: str) -> None:
    """Fail submissions that are not durable: a queued one's future, an
    inline one's ``error`` (its leader raises it)."""
    for sub in group:
        if sub.future is None:
            if sub.error is None:
                sub.error = why
        elif not sub.future.done():
            sub.future.set_exception(errors.BookieIOError(why))
