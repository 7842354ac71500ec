"""The bookie's read-only mode, and the storage failure that pins it.

Three inputs decide the mode: the disk checker's (``set_read_only``), the
operator's switch (``set_admin_read_only``: kept until cleared; nothing
else makes the bookie writable while it is set) and a storage failure
(``storage_failed``: a journal or checkpoint write/fsync failed; read-only
until restart, see bookie.py).  Listeners (the registrar, readiness) hear
every change.  The mode is read and written under the bookie's state lock
(``cond``), so an add decided under it sees one mode.
"""
from __future__ import annotations

import logging
import threading
from typing import Callable, Optional

from bookie_server.serving.metrics import BookieMetrics
from pybk_spark import errors

log = logging.getLogger("bookie.core")


class BookieMode:
    def __init__(self, cond: threading.Condition, metrics: BookieMetrics) -> None:
        self._cond = cond
        self._metrics = metrics
        self.read_only = False
        self.admin_read_only = False     # set by the operator (admin HTTP API): kept until cleared
        self.io_error: Optional[str] = None     # set once storage failed (pinned read-only)
        self._listeners: list[Callable[[bool], None]] = []

    def set_read_only(self, value: bool) -> bool:
        """Returns True if the mode changed.  After a journal failure the
        bookie stays read-only until it is restarted (and its journal
        replayed): nothing may be acknowledged that was not made durable."""
        with self._cond:
            if not value and (self.io_error is not None or self.admin_read_only):
                value = True
            changed = self.read_only != value
            self.read_only = value
        if changed:
            self._metrics.read_only.set(1 if value else 0)
            log.warning("event=bookie_mode read_only=%s storage_failed=%s", value,
                        self.io_error is not None)
            for listener in list(self._listeners):
                try:
                    listener(value)
                except Exception:  # noqa: BLE001 - e.g. etcd down: the registrar retries
                    log.exception("event=mode_listener_error")
        return changed

    def set_admin_read_only(self, value: bool, disk_full: bool = False) -> bool:
        """The operator's read-only switch (``PUT /api/v1/bookie/state/readonly``):
        while set, nothing (not the disk checker) makes the bookie writable.
        Clearing it leaves the bookie read-only if ``disk_full`` or storage failed."""
        with self._cond:
            self.admin_read_only = value
        self.set_read_only(value or disk_full)
        return self.read_only

    def add_listener(self, listener: Callable[[bool], None]) -> None:
        """``listener(read_only)`` after every mode change (the registrar)."""
        self._listeners.append(listener)

    def check_storage(self) -> None:
        """Refuse what needs the journal once storage has failed."""
        if self.io_error is not None:
            raise errors.ReadOnly(f"bookie is read-only until restarted: storage failed "
                                  f"({self.io_error})")

    def storage_failed(self, exc: BaseException, where: str) -> None:
        """Pin the bookie read-only until restart (see bookie.py's docstring).
        ``io_error`` is set at once, so the very next operation is refused;
        the switch itself runs on its own thread: a journal thread must not
        wait for the bookie lock, nor for the registrar's etcd round trip."""
        if self.io_error is None:
            self.io_error = f"{where}: {exc!r}"
        threading.Thread(target=self.set_read_only, args=(True,), name="storage-failed",
                         daemon=True).start()
