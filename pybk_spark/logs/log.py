"""Named logs built from ledgers: a fenced single leader, rolling, truncation,
and non-fencing tailing readers.

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
Truncate and retention: logs/truncation.py (the roll applies retention).
Reader: non-fencing; reads each closed segment to its last entry (stepping
  over closed empty ones without opening them) and the open tail up to its
  LAC, long-polling the LAC (no busy polling); when the tail
  ledger is closed it moves to the next segment, so there is no gap and no
  duplicate across ledger boundaries.
"""
from __future__ import annotations

import collections
import dataclasses
import logging
import random
import threading
import time
import weakref
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any, Callable, Optional, Union

from pybk_spark import errors
from pybk_spark.metadata.scope import require_bookies
from pybk_spark.metadata.store import log_key, read_ledger_metadata
from pybk_spark.protocol import append_time, log_identity
from pybk_spark.protocol import log_metadata as logmd
from pybk_spark.protocol.ledger_metadata import CLOSED, key_check
from pybk_spark.protocol.log_metadata import LogMetadata, Position
from pybk_spark.metadata import keys

Start = Union[str, Position, tuple]
_log = logging.getLogger("pybk_spark.logs")
_LARGE_LOG_BYTES = 1 << 20     # 2/3 of etcd's default request limit
_TXN_DELETES = 64              # dropped chunks deleted in the head's transaction


@dataclass(frozen=True)
class RollPolicy:
    max_entries: int = 0          # 0 = no limit
    max_bytes: int = 0
    max_age_s: float = 0.0


@dataclass(frozen=True)
class LogRecord:
    position: Position
    payload: bytes
    append_time_us: Optional[int] = None     # None: written without a time (older ledgers)


# -- metadata access ------------------------------------------------------------------
# A long log's list is its head (logs/<name>) plus the chunks the head names
# (protocol/log_metadata.py, "Chunks"); these functions give and take the
# whole list.
_Chunks = list[tuple[logmd.ChunkRef, tuple[logmd.Segment, ...]]]


_CHUNK_CACHE: "weakref.WeakKeyDictionary[Any, collections.OrderedDict]" = weakref.WeakKeyDictionary()
_CHUNK_CACHE_SIZE = 64            # chunks per store (~64,000 segments)
_CHUNK_CACHE_LOCK = threading.Lock()


def _chunk(store, key: str) -> Optional[tuple[logmd.Segment, ...]]:
    """A chunk's segments (None: it is gone).  A chunk is never changed once
    written and its name is never reused, so what was read once is kept
    (per store, the most recent ``_CHUNK_CACHE_SIZE``)."""
    with _CHUNK_CACHE_LOCK:
        cache = _CHUNK_CACHE.setdefault(store, collections.OrderedDict())
        segs = cache.get(key)
        if segs is not None:
            cache.move_to_end(key)
            return segs
    got = store.get(key)
    if got is None:
        return None
    segs = logmd.chunk_from_json(got.value)
    with _CHUNK_CACHE_LOCK:
        cache[key] = segs
        while len(cache) > _CHUNK_CACHE_SIZE:
            cache.popitem(last=False)
    return segs


def _read(store, name: str) -> Optional[tuple[LogMetadata, int, _Chunks]]:
    """(the whole metadata, the head's version, the chunks with their
    segments); None if there is no such log.  A chunk is deleted only in the
    same transaction that changes the head, so a chunk found missing means
    the head moved on: read it again."""
    for _ in range(100):
        got = store.get(log_key(name))
        if got is None:
            return None
        head, refs = logmd.head_from_json(got.value)
        chunks: _Chunks = []
        for ref in refs:
            segs = _chunk(store, ref.key)
            if segs is None:
                break
            chunks.append((ref, segs))
        else:
            if not chunks:
                return head, got.version, chunks
            segments = tuple(s for _, segs in chunks for s in segs) + head.segments
            return dataclasses.replace(head, segments=segments), got.version, chunks
        again = store.get(log_key(name))
        if again is not None and again.version == got.version:
            raise errors.MetadataError(f"log {name!r}: its metadata names a chunk that is gone",
                                       log=name, chunk=refs[len(chunks)].key)
    raise errors.MetadataVersion(f"log {name!r} changed on every one of 100 reads")


def read_log(store, name: str) -> tuple[LogMetadata, int]:
    got = _read(store, name)
    if got is None:
        require_bookies(store)            # EmptyScope: the wrong scope, not the name
        raise errors.LogNotFound(f"no log named {name!r}{_log_hint(store, name)}")
    return got[0], got[1]


def find_log(store, name: str) -> Optional[LogMetadata]:
    """The log's metadata, or None when there is no such log (no check of
    the scope, no hint: for writers about to create it)."""
    got = _read(store, name)
    return None if got is None else got[0]


def _log_hint(store, name: str) -> str:
    """``"; did you mean 'x'?"`` from the existing logs' names ("" when none
    is close, or when they cannot be listed: the error stays LogNotFound)."""
    try:
        hint = errors.did_you_mean(name, list_logs(store))
    except errors.BKError:
        return ""
    return f"; {hint}" if hint else ""


def read_or_create_log(store, name: str, rng: random.Random,
                       password_check: str = "") -> tuple[LogMetadata, int]:
    md, version, _ = open_or_create_log(store, name, rng, password_check)
    return md, version


def open_or_create_log(store, name: str, rng: random.Random,
                       password_check: str = "") -> tuple[LogMetadata, int, bool]:
    """(metadata, version, True when this call created the log).  A new log's
    uid is drawn from ``rng`` (protocol/log_identity.py), and it records
    ``password_check``, the creating writer's.  A writer that fails before
    its first change removes the log it created (:func:`drop_created_log`),
    so a failed write leaves no empty log."""
    while True:
        got = _read(store, name)
        if got is not None:
            return got[0], got[1], False
        md = logmd.new_log(name, log_identity.new_uid(rng), password_check)
        try:
            return md, store.put_if_absent(log_key(name), md.to_json()), True
        except errors.MetadataVersion:
            continue


def claim_log_password(store, name: str, password: bytes,
                       rng: random.Random) -> tuple[LogMetadata, Optional[int]]:
    """Before a writer creates any ledger: the log (created if absent) with
    ``password``'s check recorded, and the log's version when this call
    created it (else None); or ``Unauthorized`` naming the log when it
    records another password.  A log that records none (written before
    it was recorded) adopts this one only if it opens the log's newest
    ledger, checked against that ledger's metadata; the claim is a CAS that
    re-decides if another writer claimed first, and checks again if the
    list changed since that ledger was checked."""
    check = key_check(password)
    for _ in range(100):
        md, version, created = open_or_create_log(store, name, rng, check)
        if created:
            return md, version
        logmd.check_writer_password(md, check)
        if md.password_check:
            return md, None
        _check_newest_ledger(store, md, check)
        checked = md.ledger_ids
        new = update_log(store, name, lambda m: logmd.claim_password(m, check)  # noqa: B023
                         if m.password_check or m.ledger_ids == checked else m)  # noqa: B023
        if new.password_check:
            return new, None
    raise errors.MetadataVersion(f"log {name!r}: its list kept changing while its password "
                                 "was checked", log=name)


def _check_newest_ledger(store, md: LogMetadata, check: str) -> None:
    """``Unauthorized`` unless the password of ``check`` opens the log's newest
    ledger that records one (a deleted ledger is stepped over)."""
    for segment in reversed(md.segments):
        try:
            ledger = read_ledger_metadata(store, segment.ledger_id)
        except errors.NoSuchLedger:
            continue
        if not ledger.password_check:
            continue
        if ledger.password_check != check:
            raise errors.Unauthorized(
                f"wrong password for log {md.name!r}: it does not open the log's newest ledger "
                f"{segment.ledger_id}; a log has one password, the one its ledgers were "
                "written with", log=md.name, ledger_id=segment.ledger_id)
        return


def drop_created_log(store, name: str, version: int) -> None:
    """Delete the log created at ``version`` if nothing changed it since (CAS):
    the undo of a failed write's ``open_or_create_log``.  A log another
    writer changed in the meantime is theirs and stays; best effort."""
    try:
        store.delete(log_key(name), expected_version=version)
    except errors.BKError:
        pass


def update_log(store, name: str, transform: Callable[[LogMetadata], LogMetadata]) -> LogMetadata:
    """Read the whole list, ``transform`` it, write it back as one CAS on the
    head's version; on a conflict read again and re-decide.  New chunks, the
    head and the deletion of chunks it no longer names go in one transaction
    (``swap_with``).  The head stays small however long the log grows; one
    that passes ``_LARGE_LOG_BYTES`` anyway (a huge schema or property) logs
    a warning, and etcd's refusal names the log."""
    key = log_key(name)
    for _ in range(100):
        got = _read(store, name)
        if got is None:
            raise errors.NoSuchLedger(f"no metadata at {key}")
        md, version, chunks = got
        new = transform(md)
        if new == md:
            return md
        plan = logmd.plan_chunks(new.segments, chunks)
        creates: dict[str, bytes] = {}
        refs: list[logmd.ChunkRef] = []
        for i, chunk in enumerate(plan.chunks):
            if not isinstance(chunk, logmd.ChunkRef):
                ref = logmd.ChunkRef(keys.log_chunk_key(name, version, i), len(chunk),
                                     chunk[0].ledger_id, chunk[-1].ledger_id)
                creates[ref.key] = logmd.chunk_to_json(chunk)
                chunk = ref
            refs.append(chunk)
        head = logmd.head_to_json(new, plan.tail, refs)
        dropped = [r.key for r in plan.dropped]
        try:
            if plan.changed:      # etcd caps a transaction's operations (--max-txn-ops, 128)
                store.swap_with(key, head, version, creates, dropped[:_TXN_DELETES])
            else:
                store.compare_and_swap(key, head, version)
        except errors.MetadataVersion:
            continue
        except errors.MetadataTooLarge as exc:
            raise errors.MetadataTooLarge(
                f"log {name!r}: its head would be {len(head)} bytes ({len(plan.tail)} of its "
                f"{len(new.segments)} segments, its schema and properties), more than etcd "
                f"accepts in one request; raise etcd's --max-request-bytes (docs/operations.md, "
                f"\"Log size\")", log=name, value_bytes=len(head)) from exc
        for chunk_key in dropped[_TXN_DELETES:]:    # named by no head any more
            store.delete(chunk_key)
        if len(head) > _LARGE_LOG_BYTES:
            _log.warning("event=log_metadata_large log=%s bytes=%d segments=%d limit=etcd "
                         "--max-request-bytes (1.5 MiB by default)", name, len(head),
                         len(new.segments))
        return new
    raise errors.MetadataVersion(f"gave up after 100 CAS conflicts on {key}")


def delete_log_metadata(store, name: str, version: int) -> None:
    """Delete the log's head (CAS on ``version``), then its chunks.  A crash
    in between leaves chunks no head names: never read, and never the name
    of a later chunk (their names hold the revision that wrote them)."""
    store.delete(log_key(name), expected_version=version)
    for key, _ in store.list_prefix(keys.log_chunks_prefix(name)):
        store.delete(key)


def list_logs(store) -> list[str]:
    return [k.split("/", 1)[1] for k, _ in store.list_prefix(keys.LOGS_PREFIX)]


def recover_tail(bk, md: LogMetadata, password: bytes) -> dict[int, tuple[int, int]]:
    """Seed step 2: fence and recover the last two ledgers; their final sizes.
    A ledger already closed needs neither, and is not opened: in a log older
    writers left with segments under different passwords, it may be one this
    writer's password does not open."""
    closed = {}
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


# -- writer ---------------------------------------------------------------------------------
class LogWriter:
    """The single leader of a log.  Create with ``BookKeeper.open_log_writer``."""

    def __init__(self, bk, name: str, *, ensemble: int = 3, write_quorum: int = 2,
                 ack_quorum: int = 2, password: bytes = b"", roll_policy: RollPolicy = RollPolicy(),
                 clock: Callable[[], float] = time.monotonic,
                 wall_clock: Callable[[], float] = time.time):
        self._bk, self.name, self._password = bk, name, password
        self._quorums = (ensemble, write_quorum, ack_quorum)
        self._policy, self._clock, self._wall_clock = roll_policy, clock, wall_clock
        self._last_stamp = 0                 # append times never go backwards
        self._times: dict[int, tuple[int, int]] = {}    # ledger -> (first, last) append µs
        self._lock = threading.RLock()
        self._handle: Any = None
        self._index = -1                 # absolute segment index of the current ledger
        self._entries = self._bytes = 0
        self._opened_at = 0.0
        self._lost = False

    # the leader open, steps 1-5 (module docstring)
    def open(self, max_attempts: int = 50) -> "LogWriter":
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

    def _create_ledger(self):
        e, w, a = self._quorums
        return self._bk.create_ledger(ensemble=e, write_quorum=w, ack_quorum=a,
                                      password=self._password,
                                      custom_metadata={
                                          "log": self.name,
                                          append_time.ENTRY_FORMAT_KEY: append_time.TIME_PREFIXED})

    def _discard(self, handle) -> None:
        try:
            handle.close()
        finally:
            self._bk.delete_ledger(handle.ledger_id)

    def _abandon(self, handle, exc: BaseException) -> None:
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

    def _install(self, handle, md: LogMetadata) -> None:
        self._handle = handle
        self._index = md.truncated_ledgers + md.segment_index(handle.ledger_id)
        self._entries = self._bytes = 0
        self._opened_at = self._clock()

    @property
    def current_ledger_id(self) -> int:
        return self._handle.ledger_id

    def _position(self, index: int, ledger_id: int, entry_id: int) -> Position:
        return Position(index, ledger_id, entry_id)

    def _check_open(self):
        if self._handle is None:
            raise errors.IllegalOp("log writer not open (call open())")
        if self._lost:
            raise errors.LedgerFenced("this writer lost leadership of the log, or stopped "
                                      "after a failed roll: open a new writer", log=self.name)

    def append(self, payload: bytes) -> Position:
        return self.append_async(payload).result()

    def _stamp(self, ledger_id: int) -> int:
        """The append time of the next append (under the lock); kept per ledger."""
        now = self._last_stamp = append_time.stamp(self._last_stamp, self._wall_clock())
        first, _ = self._times.get(ledger_id, (now, now))
        self._times[ledger_id] = (first, now)
        return now

    def append_async(self, payload: bytes) -> "Future[Position]":
        with self._lock:
            self._check_open()
            self._maybe_roll()
            handle, index = self._handle, self._index
            head = append_time.header(self._stamp(handle.ledger_id))
            inner = handle.add_entry_async(head + bytes(payload))
            self._entries += 1
            self._bytes += len(payload)
        outer: Future = Future()

        def done(f):
            try:
                outer.set_result(self._position(index, handle.ledger_id, f.result()))
            except errors.LedgerFenced as exc:
                self._lost = True
                outer.set_exception(exc)
            except BaseException as exc:  # noqa: BLE001 - propagate to the caller's future
                outer.set_exception(exc)
        inner.add_done_callback(done)
        return outer

    def append_batch(self, payloads) -> list[Position]:
        payloads = list(payloads)
        with self._lock:
            self._check_open()
            self._maybe_roll()
            handle, index = self._handle, self._index
            try:
                ids = handle.add_entries(append_time.frame(payloads,
                                                           self._stamp(handle.ledger_id)))
            except errors.LedgerFenced:
                self._lost = True
                raise
            self._entries += len(payloads)
            self._bytes += sum(map(len, payloads))
        return [self._position(index, handle.ledger_id, i) for i in ids]

    def _maybe_roll(self) -> None:
        p = self._policy
        failed = self._handle.error
        if ((failed is not None and not isinstance(failed, errors.LedgerFenced))
                or (p.max_entries and self._entries >= p.max_entries)
                or (p.max_bytes and self._bytes >= p.max_bytes)
                or (p.max_age_s and self._clock() - self._opened_at >= p.max_age_s)):
            self.roll()

    def roll(self) -> int:
        """create -> CAS-add -> close previous.  Returns the new ledger id."""
        with self._lock:
            self._check_open()
            previous = self._handle
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
        self._record_closed(previous)
        self._retain()
        return handle.ledger_id

    def _retain(self) -> None:
        """After a roll: apply the log's retention (DistributedLog's writer
        purges expired segments as it rolls); the next roll retries."""
        from pybk_spark.logs.truncation import retain
        retain(self._bk, self.name, self._wall_clock, retry="at the next roll")

    def _after_roll_cas(self, previous_ledger_id: int, new_ledger_id: int) -> None:
        """Extension point between the roll's CAS and the close of the previous
        ledger (the window the protocol makes safe; crash tests stop here)."""

    def _record_closed(self, handle) -> None:
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
        if self._lost or self._handle is None:
            return False
        try:
            md, _ = read_log(self._bk.metadata_store, self.name)
            meta = self._bk.get_ledger_metadata(self._handle.ledger_id)
        except errors.BKError:
            return False
        still = md.ledger_ids[-1:] == [self._handle.ledger_id] and meta.state != CLOSED \
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

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
