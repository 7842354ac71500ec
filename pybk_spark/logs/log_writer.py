"""``LogWriter``: the single leader of a named log (open as leader, append,
roll, close).

Theory of operation ("Ledgers to logs", in this order)
------------------------------------------------------
Leader open (``LogWriter.open``):
  1. read the ledger list (and check the writer's password against the
  log's before any ledger is fenced or created: ``claim_log_password``);
  2. fence AND recover the last two ledgers (the
  previous leader may be writing to the second-to-last while adding the last);
  3. create a new ledger;  4. append it;  5. CAS the list back.  On a CAS
  conflict (or the tail moved) start again at 1.  No append is served before
  step 5 succeeds.  Two would-be leaders: each one's open fences the other's
  ledger, so a deposed leader's adds fail with LedgerFenced (unknown outcome)
  and ``is_leader()`` tells it that it lost.
Roll: create ledger -> CAS-add -> close the previous ledger (after its
  in-flight adds settle; by fencing recovery if its adds were aborted), then
  a best-effort CAS recording its final size.  If that close fails the writer
  stops (``is_leader()`` is False): rolling on would push an unclosed ledger
  out of the two a leader open recovers.
Failed ledger: a ledger whose writer aborted for another reason than fencing
  (``NotEnoughBookies``: no replacement for a failed bookie; ``TooLarge``
  from a misconfigured bookie) does not mean lost leadership: the append
  fails with that error (outcome unknown) and the next append rolls to a new
  ledger, closing the failed one by fencing recovery.  Only ``LedgerFenced``
  marks the writer as deposed.
A CAS adding a new ledger (open step 5, roll) that is refused deletes that
  ledger; one whose outcome is unknown (etcd went away mid-CAS) never does:
  the list may name it, so it is only closed and the writer stops.  Step 2
  records a listed ledger that no longer exists (deleted by older code) as
  closed and empty.
Append time: every entry carries the wall-clock time it was appended (an
  8-byte header, protocol/append_time.py; the ledger is tagged
  ``entry_format=time-prefixed-v1``), stamped so that it never goes
  backwards; the first and last time of a ledger are recorded with its size
  when it is closed.  Readers strip the header (log_reader.py, Spark).
The list itself is read and CAS-written by logs/log.py; truncation and
retention by logs/truncation.py (the roll applies retention).
"""
from __future__ import annotations

import threading
import time
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Optional, cast

from pybk_spark import errors
from pybk_spark.ledger.add_future import AddFuture
from pybk_spark.ledger.ledger_handle import LedgerHandle
from pybk_spark.ledger.port import LedgerClient
from pybk_spark.logs.log import claim_log_password, drop_created_log, find_log, read_log, update_log
from pybk_spark.logs.truncation import retain
from pybk_spark.metadata.scope import require_bookies
from pybk_spark.protocol import append_time
from pybk_spark.protocol import log_metadata as logmd
from pybk_spark.protocol.ledger_metadata import CLOSED, key_check
from pybk_spark.protocol.log_metadata import LogMetadata, Position


@dataclass(frozen=True)
class RollPolicy:
    max_entries: int = 0          # 0 = no limit
    max_bytes: int = 0
    max_age_s: float = 0.0


def recover_tail(bk: LedgerClient, md: LogMetadata, password: bytes) -> dict[int, tuple[int, int]]:
    """Seed step 2: fence and recover the last two ledgers; their final sizes.
    A ledger already closed needs neither, and is not opened: in a log older
    writers left with segments under different passwords, it may be one this
    writer's password does not open."""
    closed: dict[int, tuple[int, int]] = {}
    for ledger_id in logmd.tail_ids(md):
        try:
            meta = bk.get_ledger_metadata(ledger_id)
            if not meta.is_closed:
                meta = bk.open_ledger(ledger_id, password=password, recovery=True).metadata
        except errors.NoSuchLedger:
            # listed but gone: a writer of an older version deleted a ledger
            # whose roll CAS had in fact landed (see LogWriter._abandon).  It
            # never took an add (a writer uses a ledger only after the CAS
            # succeeded), so it is recorded as closed and empty, which lets
            # readers step over it.
            closed[ledger_id] = (-1, 0)
            continue
        closed[ledger_id] = (meta.last_entry_id, append_time.payload_bytes(
            meta.length, meta.last_entry_id + 1, meta.custom))
    return closed


class LogWriter:
    """The single leader of a log.  Create with ``open_log_writer`` (or
    ``pybk_spark.BookKeeper.open_log_writer``)."""

    def __init__(self, bk: LedgerClient, name: str, *, ensemble: int = 3, write_quorum: int = 2,
                 ack_quorum: int = 2, password: bytes = b"", roll_policy: RollPolicy = RollPolicy(),
                 clock: Callable[[], float] = time.monotonic,
                 wall_clock: Callable[[], float] = time.time) -> None:
        self._bk, self.name, self._password = bk, name, password
        self._quorums = (ensemble, write_quorum, ack_quorum)
        self._policy, self._clock, self._wall_clock = roll_policy, clock, wall_clock
        self._last_stamp = 0                 # append times never go backwards
        self._times: dict[int, tuple[int, int]] = {}    # ledger -> (first, last) append µs
        self._lock = threading.RLock()
        self._handle: Optional[LedgerHandle] = None
        self._index = -1                 # absolute segment index of the current ledger
        self._entries = self._bytes = 0
        self._opened_at = 0.0
        self._lost = False

    # the leader open, steps 1-5 (module docstring)
    def open(self, max_attempts: int = 50) -> LogWriter:
        store = self._bk.metadata_store
        check = key_check(self._password)
        created: Optional[int] = None         # the log's version, if this open created it
        if find_log(store, self.name) is None:
            require_bookies(store)            # no log is made in the wrong scope: EmptyScope
        for _ in range(max_attempts):
            md, version = claim_log_password(store, self.name, self._password, self._bk.rng)  # 1
            created = version if version is not None else created
            fenced_tail = logmd.tail_ids(md)
            try:
                closed = recover_tail(self._bk, md, self._password)           # 2
                handle = self._create_ledger()                                # 3
            except BaseException:
                if created is not None:       # no bookies, wrong scope...: no empty log left
                    drop_created_log(store, self.name, created)
                raise
            try:
                new = update_log(store, self.name, lambda m: logmd.open_as_leader(   # 4 + 5
                    logmd.claim_password(m, check), fenced_tail, closed,  # noqa: B023 (called within this iteration)
                    handle.ledger_id))  # noqa: B023
            except logmd.LeaderConflict:
                self._discard(handle)
                continue
            except BaseException as exc:
                self._abandon(handle, exc)
                if created is not None and getattr(exc, "outcome_known", True):
                    drop_created_log(store, self.name, created)
                raise
            self._install(handle, new)
            return self
        raise errors.MetadataVersion(f"could not become leader of {self.name!r}: tail kept moving")

    def _create_ledger(self) -> LedgerHandle:
        e, w, a = self._quorums
        return self._bk.create_ledger(ensemble=e, write_quorum=w, ack_quorum=a,
                                      password=self._password,
                                      custom_metadata={
                                          "log": self.name,
                                          append_time.ENTRY_FORMAT_KEY: append_time.TIME_PREFIXED})

    def _discard(self, handle: LedgerHandle) -> None:
        try:
            handle.close()
        finally:
            self._bk.delete_ledger(handle.ledger_id)

    def _abandon(self, handle: LedgerHandle, exc: BaseException) -> None:
        """The log CAS meant to list ``handle``'s ledger failed.  Refused (a
        known outcome): the ledger is deleted.  Outcome unknown (etcd went
        away mid-CAS): the log may list it now, so it is only closed (empty)
        and never deleted; the next leader's ``recover_tail`` settles it, and
        an unlisted empty ledger is all that can be left over."""
        if getattr(exc, "outcome_known", True):
            self._discard(handle)
            return
        try:
            handle.close()
        except errors.BKError:
            pass            # still OPEN: recovery by the next leader closes it

    def _install(self, handle: LedgerHandle, md: LogMetadata) -> None:
        self._handle = handle
        self._index = md.truncated_ledgers + md.segment_index(handle.ledger_id)
        self._entries = self._bytes = 0
        self._opened_at = self._clock()

    @property
    def current_ledger_id(self) -> int:
        return self._open_handle().ledger_id

    def _position(self, index: int, ledger_id: int, entry_id: int) -> Position:
        return Position(index, ledger_id, entry_id)

    def _open_handle(self) -> LedgerHandle:
        if self._handle is None:
            raise errors.IllegalOp("log writer not open (call open())")
        return self._handle

    def _fenced(self, handle: LedgerHandle) -> bool:
        """Lost leadership: noted, or ``handle``'s writer fenced (its adds,
        appends among them, fail with that ``LedgerFenced``)."""
        if isinstance(handle.error, errors.LedgerFenced):
            self._lost = True
        return self._lost

    def _check_open(self) -> LedgerHandle:
        """The current ledger's handle, if this writer may still append."""
        handle = self._open_handle()
        if self._fenced(handle):
            raise errors.LedgerFenced("this writer lost leadership of the log, or stopped "
                                      "after a failed roll: open a new writer", log=self.name)
        return handle

    def append(self, payload: bytes) -> Position:
        return self.append_async(payload).result()

    def _stamp(self, ledger_id: int) -> int:
        """The append time of the next append (under the lock); kept per ledger."""
        now = self._last_stamp = append_time.stamp(self._last_stamp, self._wall_clock())
        first, _ = self._times.get(ledger_id, (now, now))
        self._times[ledger_id] = (first, now)
        return now

    def append_async(self, payload: bytes) -> "Future[Position]":
        """A pipelined append: its ``_Appended`` future is the ledger
        handle's queued add itself (``LedgerHandle.enqueue_add``), completed
        in bulk with the others, its position made when it is read."""
        with self._lock:
            self._maybe_roll(self._check_open())
            handle, index = self._check_open(), self._index
            head = append_time.header(self._stamp(handle.ledger_id))
            fut = handle.enqueue_add(_Appended(head + bytes(payload), index, handle.ledger_id))
            self._entries += 1
            self._bytes += len(payload)
        return cast("Future[Position]", fut)

    def append_batch(self, payloads: Iterable[bytes]) -> list[Position]:
        payloads = list(payloads)
        with self._lock:
            self._maybe_roll(self._check_open())
            handle, index = self._check_open(), self._index
            try:
                ids = handle.add_entries(append_time.frame(payloads,
                                                           self._stamp(handle.ledger_id)))
            except errors.LedgerFenced:
                self._lost = True
                raise
            self._entries += len(payloads)
            self._bytes += sum(map(len, payloads))
        return [self._position(index, handle.ledger_id, i) for i in ids]

    def _maybe_roll(self, handle: LedgerHandle) -> None:
        p = self._policy
        failed = handle.error
        if ((failed is not None and not isinstance(failed, errors.LedgerFenced))
                or (p.max_entries and self._entries >= p.max_entries)
                or (p.max_bytes and self._bytes >= p.max_bytes)
                or (p.max_age_s and self._clock() - self._opened_at >= p.max_age_s)):
            self.roll()

    def roll(self) -> int:
        """create -> CAS-add -> close previous.  Returns the new ledger id."""
        with self._lock:
            previous = self._check_open()
            handle = self._create_ledger()
            try:
                md = update_log(self._bk.metadata_store, self.name,
                                lambda m: logmd.roll(m, previous.ledger_id, handle.ledger_id))
            except errors.LedgerFenced:
                self._lost = True
                self._discard(handle)
                raise
            except BaseException as exc:
                if not getattr(exc, "outcome_known", True):
                    self._lost = True      # the log may now end in a ledger not ours to use
                self._abandon(handle, exc)
                raise
            self._install(handle, md)
        self._after_roll_cas(previous.ledger_id, handle.ledger_id)
        try:
            previous.close()                   # waits for its in-flight adds
        except BaseException:
            # the previous ledger is left OPEN / IN_RECOVERY in the middle of
            # the list; a leader open recovers the last two ledgers, so this
            # writer must not roll again: it stops, and a reopen recovers it
            self._lost = True
            raise
        self._fenced(previous)                 # its last appends may have been fenced
        self._record_closed(previous)
        self._retain()
        return handle.ledger_id

    def _retain(self) -> None:
        """After a roll: apply the log's retention (DistributedLog's writer
        purges expired segments as it rolls); the next roll retries."""
        retain(self._bk, self.name, self._wall_clock, retry="at the next roll")

    def _after_roll_cas(self, previous_ledger_id: int, new_ledger_id: int) -> None:
        """Extension point between the roll's CAS and the close of the previous
        ledger (the window the protocol makes safe; crash tests stop here)."""

    def _record_closed(self, handle: LedgerHandle) -> None:
        try:
            meta = self._bk.get_ledger_metadata(handle.ledger_id)
            if meta.state == CLOSED:
                times = {handle.ledger_id: self._times.pop(handle.ledger_id, (-1, -1))}
                update_log(self._bk.metadata_store, self.name, lambda m: logmd.record_closed(
                    m, {handle.ledger_id: (meta.last_entry_id, append_time.payload_bytes(
                        meta.length, meta.last_entry_id + 1, meta.custom))}, times))
        except errors.BKError:
            pass  # best effort: readers fall back to ledger metadata

    def is_leader(self) -> bool:
        """False once another writer has fenced us or taken the tail."""
        handle = self._handle
        if handle is None or self._fenced(handle):
            return False
        try:
            md, _ = read_log(self._bk.metadata_store, self.name)
            meta = self._bk.get_ledger_metadata(handle.ledger_id)
        except errors.BKError:
            return False
        still = md.ledger_ids[-1:] == [handle.ledger_id] and meta.state != CLOSED \
            and meta.state == "OPEN"
        self._lost = not still
        return still

    def close(self) -> None:
        with self._lock:
            if self._handle is None:
                return
            handle, self._handle = self._handle, None
        try:
            handle.close()
        finally:
            self._record_closed(handle)

    def __enter__(self) -> LogWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class _Appended(AddFuture):
    """A pipelined append's future: the handle's ``AddFuture`` of the entry
    (completed in bulk with its batch, module add_future), whose result is
    the entry's ``Position`` in the log, made when it is read (a callback
    per append completing a second future is twice the work at the
    completer).  Typed ``Future[Position]`` to callers."""

    __slots__ = ("_index", "_ledger_id")

    def __init__(self, payload: bytes, index: int, ledger_id: int) -> None:
        super().__init__(payload)
        self._index = index
        self._ledger_id = ledger_id

    def result(self, timeout: float | None = None) -> Position:  # type: ignore[override]
        return Position(self._index, self._ledger_id, AddFuture.result(self, timeout))


def open_log_writer(bk: LedgerClient, name: str, **options: Any) -> LogWriter:
    """Become the leader of log ``name`` (the fence-then-CAS open);
    ``options`` are ``LogWriter``'s."""
    return LogWriter(bk, name, **options).open()
