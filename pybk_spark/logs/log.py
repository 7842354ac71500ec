"""A named log's metadata in etcd: the ordered list of its ledgers, read,
created and changed by CAS (``update_log``), listed and deleted.

A long log's list is its head (``logs/<name>``) plus the chunks the head
names (protocol/log_metadata.py, "Chunks"); the functions here give and take
the whole list.  The writer that appends to a log is logs/log_writer.py,
the reader logs/log_reader.py, truncation and retention logs/truncation.py.
"""
from __future__ import annotations

import collections
import dataclasses
import logging
import random
import threading
import weakref
from typing import Callable, Optional

from pybk_spark import errors
from pybk_spark.metadata import keys
from pybk_spark.metadata.scope import require_bookies
from pybk_spark.metadata.store import MetadataStore, log_key, read_ledger_metadata
from pybk_spark.protocol import log_identity
from pybk_spark.protocol import log_metadata as logmd
from pybk_spark.protocol.ledger_metadata import key_check
from pybk_spark.protocol.log_metadata import LogMetadata

_log = logging.getLogger("pybk_spark.logs")
_LARGE_LOG_BYTES = 1 << 20     # 2/3 of etcd's default request limit
_TXN_DELETES = 64              # dropped chunks deleted in the head's transaction

_Chunks = list[tuple[logmd.ChunkRef, tuple[logmd.Segment, ...]]]
_ChunkCache = collections.OrderedDict[str, tuple[logmd.Segment, ...]]


_CHUNK_CACHE: "weakref.WeakKeyDictionary[MetadataStore, _ChunkCache]" = weakref.WeakKeyDictionary()
_CHUNK_CACHE_SIZE = 64            # chunks per store (~64,000 segments)
_CHUNK_CACHE_LOCK = threading.Lock()


def _chunk(store: MetadataStore, key: str) -> Optional[tuple[logmd.Segment, ...]]:
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


def _read(store: MetadataStore, name: str) -> Optional[tuple[LogMetadata, int, _Chunks]]:
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


def read_log(store: MetadataStore, name: str) -> tuple[LogMetadata, int]:
    got = _read(store, name)
    if got is None:
        require_bookies(store)            # EmptyScope: the wrong scope, not the name
        raise errors.LogNotFound(f"no log named {name!r}{_log_hint(store, name)}")
    return got[0], got[1]


def find_log(store: MetadataStore, name: str) -> Optional[LogMetadata]:
    """The log's metadata, or None when there is no such log (no check of
    the scope, no hint: for writers about to create it)."""
    got = _read(store, name)
    return None if got is None else got[0]


def _log_hint(store: MetadataStore, name: str) -> str:
    """``"; did you mean 'x'?"`` from the existing logs' names ("" when none
    is close, or when they cannot be listed: the error stays LogNotFound)."""
    try:
        hint = errors.did_you_mean(name, list_logs(store))
    except errors.BKError:
        return ""
    return f"; {hint}" if hint else ""


def read_or_create_log(store: MetadataStore, name: str, rng: random.Random,
                       password_check: str = "") -> tuple[LogMetadata, int]:
    md, version, _ = open_or_create_log(store, name, rng, password_check)
    return md, version


def open_or_create_log(store: MetadataStore, name: str, rng: random.Random,
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


def claim_log_password(store: MetadataStore, name: str, password: bytes,
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


def _check_newest_ledger(store: MetadataStore, md: LogMetadata, check: str) -> None:
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


def drop_created_log(store: MetadataStore, name: str, version: int) -> None:
    """Delete the log created at ``version`` if nothing changed it since (CAS):
    the undo of a failed write's ``open_or_create_log``.  A log another
    writer changed in the meantime is theirs and stays; best effort."""
    try:
        store.delete(log_key(name), expected_version=version)
    except errors.BKError:
        pass


def update_log(store: MetadataStore, name: str,
               transform: Callable[[LogMetadata], LogMetadata]) -> LogMetadata:
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


def delete_log_metadata(store: MetadataStore, name: str, version: int) -> None:
    """Delete the log's head (CAS on ``version``), then its chunks.  A crash
    in between leaves chunks no head names: never read, and never the name
    of a later chunk (their names hold the revision that wrote them)."""
    store.delete(log_key(name), expected_version=version)
    for key, _ in store.list_prefix(keys.log_chunks_prefix(name)):
        store.delete(key)


def list_logs(store: MetadataStore) -> list[str]:
    return [k.split("/", 1)[1] for k, _ in store.list_prefix(keys.LOGS_PREFIX)]
