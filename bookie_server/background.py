"""Background duties: disk-usage checker (read-only mode), ledger GC and the
damage marker's publication.

Decisions are pure functions (``next_read_only``, ``gc_candidates``); the
threads only measure, ask the metadata store and act.  GC double-checks every
candidate with a direct ``get`` of ``ledgers/<id:020d>`` before deleting
(BookKeeper #870: a metadata listing that skipped ranges deleted live data).

Stopping is bounded for the duties that wait on the metadata store
(``join_bounded``): a partitioned etcd must not turn a clean shutdown into a
SIGKILL.  A duty left waiting touches no stored data once stopped: GC
deletes nothing more, the damage marker's state has its own lock.

The disk checker never lifts a read-only mode that a storage failure pinned
(``pinned``: a failed journal or checkpoint write/fsync, ``Bookie.io_error``):
free space proves nothing about the pages a failed fsync dropped; only a
restart (journal replay) makes the bookie writable again.
"""
from __future__ import annotations

import logging
import shutil
import threading
import time
from typing import TYPE_CHECKING, Any, Callable, Iterable, Optional

from pybk_spark.metadata.store import ledger_key
from pybk_spark.metadata import keys

if TYPE_CHECKING:
    from bookie_server.bookie import Bookie
    from bookie_server.config import BookieConfig
    from pybk_spark.metadata.store import MetadataStore

log = logging.getLogger("bookie.background")


def join_bounded(thread: threading.Thread, timeout: Optional[float], what: str) -> bool:
    """Join a duty's thread for at most ``timeout`` seconds (None: no bound).
    A thread still running then is blocked on the metadata store (a
    partitioned etcd holds each RPC until its timeout): it is a daemon, and it
    touches no stored data once its stop is set, so shutdown goes on."""
    if thread.is_alive():
        thread.join(timeout)
    if thread.is_alive():
        log.warning("event=%s_abandoned after_s=%.1f (blocked on the metadata store)",
                    what, timeout or 0.0)
        return False
    return True


def next_read_only(read_only: bool, usage: float, threshold: float, lwm: float,
                   pinned: bool = False) -> bool:
    if pinned:
        return True
    if not read_only and usage >= threshold:
        return True
    if read_only and usage < lwm:
        return False
    return read_only


def gc_candidates(local: Iterable[int], listed_keys: Iterable[str]) -> list[int]:
    present = set()
    for key in listed_keys:
        try:
            present.add(int(key.rstrip("/").rsplit("/", 1)[1]))
        except (ValueError, IndexError):
            continue
    return sorted(set(local) - present)


class DiskChecker:
    def __init__(self, bookie: Bookie, cfg: BookieConfig, on_change: Callable[[bool], None],
                 usage_fn: Optional[Callable[[], float]] = None) -> None:
        self.bookie = bookie
        self.threshold = cfg.disk_usage_threshold
        self.lwm = cfg.disk_usage_lwm
        self.interval = cfg.disk_check_interval_s
        self.on_change = on_change
        self.usage_fn = usage_fn or (lambda: _usage(bookie.data_dir))
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="disk-checker", daemon=True)

    def set_thresholds(self, threshold: float, lwm: float) -> None:
        self.threshold, self.lwm = threshold, lwm

    def check_once(self) -> bool:
        usage = self.usage_fn()
        self.bookie.metrics.disk_usage.set(usage)
        ro = next_read_only(self.bookie.read_only, usage, self.threshold, self.lwm,
                            pinned=self.bookie.io_error is not None)
        if self.bookie.set_read_only(ro):
            ro = self.bookie.read_only      # the bookie has the last word (pinned)
            log.warning("event=disk_mode_change usage=%.4f threshold=%.4f lwm=%.4f read_only=%s",
                        usage, self.threshold, self.lwm, ro)
            self.on_change(ro)
        return ro

    def start(self) -> None:
        self.check_once()
        self._thread.start()

    def _loop(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                self.check_once()
            except Exception as exc:  # noqa: BLE001 - the disk checker thread must not die
                log.error("event=disk_check_failed error=%r", exc)

    def stop(self, timeout: Optional[float] = None) -> None:
        self._stop.set()
        join_bounded(self._thread, timeout, "disk_checker")


def _usage(path: str) -> float:
    du = shutil.disk_usage(path)
    return (du.total - du.free) / du.total if du.total else 1.0


def gc_once(bookie: Bookie, store: MetadataStore, stopping: Callable[[], bool] = lambda: False) -> list[int]:
    """Delete the local ledgers the metadata no longer has.  Once
    ``stopping()`` (the bookie shuts down, and may be closing its storage
    while this round waits on the store) nothing more is deleted."""
    if bookie.io_error is not None:     # storage failed: nothing is journaled until restart
        return []
    local = bookie.ledger_ids()
    if not local:
        return []
    listed = [k for k, _ in store.list_prefix(keys.LEDGERS_PREFIX)]
    deleted = []
    for ledger_id in gc_candidates(local, listed):
        if store.get(ledger_key(ledger_id)) is not None:   # confirm absence directly
            continue
        if stopping():
            break
        bookie.delete_ledger(ledger_id)
        deleted.append(ledger_id)
    if deleted and not stopping():
        bookie.checkpoint()      # reclaim: drop references, delete dead segments
    return deleted


class GarbageCollector:
    """GC every ``interval_s``, or at once after ``trigger()`` (the admin HTTP
    API's ``PUT /api/v1/bookie/gc``); ``status()`` describes the runs."""

    def __init__(self, bookie: Bookie, store: MetadataStore, interval_s: float,
                 clock: Callable[[], float] = time.time) -> None:
        self.bookie, self.store, self.interval = bookie, store, interval_s
        self.clock = clock
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._lock = threading.Lock()
        self._status: dict[str, Any] = {"running": False, "forced_pending": False, "runs": 0,
                        "last_start": None, "last_end": None, "last_deleted": [],
                        "last_error": None, "deleted_total": 0}
        self._thread = threading.Thread(target=self._loop, name="gc", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def trigger(self) -> None:
        with self._lock:
            self._status["forced_pending"] = True
        self._wake.set()

    def status(self) -> dict[str, Any]:
        with self._lock:
            return {**self._status, "last_deleted": list(self._status["last_deleted"]),
                    "interval_s": self.interval}

    def _loop(self) -> None:
        while True:
            self._wake.wait(self.interval)
            self._wake.clear()
            if self._stop.is_set():
                return
            with self._lock:
                self._status.update(running=True, forced_pending=False,
                                    last_start=self.clock())
            deleted, error = [], None
            try:
                deleted = gc_once(self.bookie, self.store, self._stop.is_set)
            except Exception as exc:  # noqa: BLE001 - never delete on doubt; try later
                error = f"{type(exc).__name__}: {exc}"
                log.warning("event=gc_failed error=%r", exc)
            with self._lock:
                st = self._status
                st.update(running=False, runs=st["runs"] + 1, last_end=self.clock(),
                          last_deleted=deleted, last_error=error,
                          deleted_total=st["deleted_total"] + len(deleted))

    def stop(self, timeout: Optional[float] = None) -> None:
        self._stop.set()
        self._wake.set()
        join_bounded(self._thread, timeout, "gc")


class DamagePublisher:
    """Every ``interval_s``: ``bookie.lost.sync_marker`` (damage.py) - new
    damage goes into ``bookies/damaged/<bookie_id>``, ranges the auditor
    repaired leave the bookie's lost set.  An unreachable store is retried."""

    def __init__(self, bookie: Bookie, store: MetadataStore, bookie_id: str,
                 interval_s: float) -> None:
        self.bookie, self.store, self.bookie_id = bookie, store, bookie_id
        self.interval = interval_s
        self._synced = False
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="damage-publisher", daemon=True)

    def start(self) -> None:
        self.sync_once()
        self._thread.start()

    def sync_once(self) -> None:
        """At start always (a marker published before a crash comes back);
        later only while the bookie has lost something (no etcd read else)."""
        if self._synced and not self.bookie.lost:
            return
        try:
            before = len(self.bookie.lost.ranges())
            self.bookie.lost.sync_marker(self.store, self.bookie_id)
            self._synced = True
            after = len(self.bookie.lost.ranges())
            self.bookie.metrics.damaged_ranges.set(after)
            if after < before:
                log.warning("event=damage_repaired ranges_left=%d unattributed=%s",
                            after, self.bookie.lost.unattributed)
        except Exception as exc:  # noqa: BLE001 - store away: next round
            log.warning("event=damage_publish_failed error=%r", exc)

    def _loop(self) -> None:
        while not self._stop.wait(self.interval):
            self.sync_once()

    def stop(self, timeout: Optional[float] = None) -> None:
        self._stop.set()
        join_bounded(self._thread, timeout, "damage_publisher")
