"""Non-fencing log reader: iterates a log across ledger boundaries and tails it.

Theory of operation
-------------------
The reader's cursor is (segment index, next entry id).  Segment indexes are
absolute (they count truncated segments too), so a cursor stays valid across
truncation until its own segment is truncated away (then: LogTruncated).

For the segment under the cursor:
  * CLOSED ledger: read up to its last entry, then step to the next segment
    at entry 0.  Nothing past a closed ledger's last entry is ever returned.
  * OPEN ledger: read up to its LAC only (everything up to the LAC is on Qa
    bookies, so every reader sees the same prefix).  At the LAC, long-poll the
    bookies for a higher LAC; when the long poll times out, re-read the
    ledger's metadata in case it was closed (roll or recovery).  The reader
    never fences and never writes.
  * no segment yet: wait for the log's metadata to change.
So the sequence a reader yields is always a prefix of the log's final
sequence: no gap, no duplicate, in log order.

A segment offloaded to Parquet files (``Segment.offload``, logs/offload.py)
is read from its files, with the same positions, and needs no bookie; a
ledger found deleted is re-checked against the log, whose record then
names its files.  Files that fail their checks (``OffloadCorrupt``) or
cannot be reached (``OffloadStoreError``) while the segment's ledger is
still on the bookies (state ``offloaded``, within the grace period) are
passed over for the ledger, with a warning naming the error; once the
ledger is deleted the files are the only copy and the error is raised.

Entries of ledgers a log writer tagged ``time-prefixed-v1`` lose their 8-byte
append-time header here (protocol/append_time.py): batches carry it as a
``timestamp`` column (null for entries of older ledgers), records as
``append_time_us``.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Iterable, Iterator, Mapping, Optional, Sequence, Union

import pyarrow as pa

from pybk_spark import errors
from pybk_spark.ledger.port import LedgerClient
from pybk_spark.ledger.read_handle import ReadHandle
from pybk_spark.logs.log import read_log
from pybk_spark.logs.offload_reads import OffloadedSegments
from pybk_spark.metadata.store import ledger_key, log_key
from pybk_spark.protocol import append_time
from pybk_spark.protocol.ledger_metadata import CLOSED, LedgerMetadata
from pybk_spark.protocol.log_metadata import SEGMENT_CLOSED, Position
from pybk_spark.protocol.offload_record import STATE_OFFLOADED
from pybk_spark.wire.entries import one_batch

_log = logging.getLogger("pybk_spark.logs.log_reader")

# where a reader starts: "earliest", "latest", a Position or (ledger id, entry id)
Start = Union[str, Position, tuple[int, int]]


@dataclass(frozen=True)
class LogRecord:
    position: Position
    payload: bytes
    append_time_us: Optional[int] = None     # None: written without a time (older ledgers)


class LogReader:
    def __init__(self, bk: LedgerClient, name: str, start: Start = "earliest", *,
                 password: bytes = b"", other_passwords: Sequence[bytes] = (),
                 poll_timeout_s: float = 1.0, max_batch_entries: int = 1000) -> None:
        """``other_passwords``: tried per segment after ``password``, for a
        log whose segments were written under different passwords."""
        self._bk, self.name, self._password = bk, name, password
        self._others = {"other_passwords": tuple(other_passwords)} if other_passwords else {}
        self._poll_timeout = poll_timeout_s
        self._max_batch = max_batch_entries
        self._handles: dict[int, ReadHandle] = {}
        self._offloaded = OffloadedSegments()
        self._bad_files: dict[int, errors.BKError] = {}     # ledger id -> why its files failed
        self._md, self._md_version = read_log(bk.metadata_store, name)
        self._segment, self._next = self._resolve_start(start)
        self._closed = False

    # -- cursor -----------------------------------------------------------------------
    def _resolve_start(self, start: Start) -> tuple[int, int]:
        md = self._md
        if start == "earliest":
            return md.truncated_ledgers, 0
        if start == "latest":
            if not md.segments:
                return md.truncated_ledgers, 0
            index = md.truncated_ledgers + len(md.segments) - 1
            meta = self._bk.get_ledger_metadata(md.segments[-1].ledger_id)
            if meta.state == CLOSED:
                return index + 1, 0
            return index, self._handle(md.segments[-1].ledger_id).read_last_add_confirmed() + 1
        if isinstance(start, Position):
            ledger_id, entry_id = start.ledger_id, start.entry_id
        elif isinstance(start, str):
            raise errors.IncorrectParameter(
                f"log reader start {start!r}: give 'earliest', 'latest', a Position or "
                "(ledger id, entry id)", log=self.name)
        else:
            ledger_id, entry_id = start
        return md.position(ledger_id, entry_id).ledger_index, entry_id

    @property
    def position(self) -> tuple[int, int]:
        """(segment index, next entry id) of the next record to be returned."""
        return self._segment, self._next

    def _handle(self, ledger_id: int) -> ReadHandle:
        rh = self._handles.get(ledger_id)
        if rh is None:
            rh = self._bk.open_ledger(ledger_id, password=self._password, recovery=False,
                                      **self._others)
            self._handles[ledger_id] = rh
        return rh

    def _drop_handle(self, ledger_id: int) -> None:
        rh = self._handles.pop(ledger_id, None)
        if rh is not None:
            rh.close()

    def _refresh(self) -> None:
        self._md, self._md_version = read_log(self._bk.metadata_store, self.name)

    def _wait_for_ledger_change(self, ledger_id: int, timeout_s: float) -> None:
        store = self._bk.metadata_store
        got = store.get(ledger_key(ledger_id))
        if got is not None and LedgerMetadata.from_json(got.value).state != CLOSED:
            store.wait_for_change(ledger_key(ledger_id), got.version, timeout_s)

    # -- reading --------------------------------------------------------------------------
    def read_batch(self, timeout_s: Optional[float] = None) -> tuple[int, int, Optional[pa.RecordBatch]]:
        """Next batch of available entries as (segment index, ledger id, batch of
        ledger_id/entry_id/payload/timestamp), waiting at most ``timeout_s`` (None = the
        poll timeout once; 0 = do not wait).  Returns batch None when nothing new."""
        waited = False
        budget = self._poll_timeout if timeout_s is None else timeout_s
        while not self._closed:
            rel = self._segment - self._md.truncated_ledgers
            if rel < 0:
                raise errors.LogTruncated("reader position was truncated away", log=self.name)
            if rel >= len(self._md.segments):
                if waited or budget <= 0:
                    return self._segment, -1, None
                self._bk.metadata_store.wait_for_change(log_key(self.name), self._md_version, budget)
                waited = True
                self._refresh()
                continue
            segment = self._md.segments[rel]
            ledger_id = segment.ledger_id
            if segment.state == SEGMENT_CLOSED and segment.entry_count == 0:
                self._segment, self._next = self._segment + 1, 0   # empty: nothing to open
                continue
            if segment.offload is not None and ledger_id not in self._bad_files:
                try:                             # its files (logs/offload_reads.py)
                    batch = self._offloaded.read(segment, self._next, self._max_batch)
                except (errors.OffloadCorrupt, errors.OffloadStoreError) as exc:
                    if segment.offload.state != STATE_OFFLOADED:
                        raise                    # the ledger is gone: the files are all there is
                    _log.warning("event=offloaded_files_unreadable log=%s ledger=%d error=%s "
                                 "reading='its ledger, still on the bookies'",
                                 self.name, ledger_id, exc)
                    self._bad_files[ledger_id] = exc
                    self._offloaded.forget()
                    continue
                if batch is not None and batch.num_rows:
                    self._next += batch.num_rows
                    return self._segment, ledger_id, batch
                self._offloaded.forget()
                self._segment, self._next = self._segment + 1, 0
                if rel + 1 >= len(self._md.segments):
                    self._refresh()
                continue
            try:
                rh = self._handle(ledger_id)
                meta = self._bk.get_ledger_metadata(ledger_id)
            except errors.NoSuchLedger:
                # deleted after its offload committed (the log now names its
                # files) or truncated away (LogTruncated above)
                self._drop_handle(ledger_id)
                self._refresh()
                now = self._segment - self._md.truncated_ledgers
                if 0 <= now < len(self._md.segments) and self._md.segments[now].offload is None:
                    raise
                if ledger_id in self._bad_files:      # deleted after its files failed
                    raise self._bad_files[ledger_id] from None
                continue
            last = meta.last_entry_id if meta.state == CLOSED else rh.read_last_add_confirmed()
            if self._next <= last:
                upto = min(last, self._next + self._max_batch - 1)
                batch = with_append_time(_concat(rh.read_batches(self._next, upto)),
                                         rh.metadata.custom)
                if batch.num_rows:
                    self._next += batch.num_rows
                    return self._segment, ledger_id, batch
            if meta.state == CLOSED:
                self._drop_handle(ledger_id)
                self._segment, self._next = self._segment + 1, 0
                if rel + 1 >= len(self._md.segments):
                    self._refresh()
                continue
            if waited or budget <= 0:
                return self._segment, ledger_id, None
            if rel + 1 < len(self._md.segments):
                # A later segment exists, so this ledger is being closed (by a
                # roll or by a new leader's recovery): wait for its metadata.
                self._wait_for_ledger_change(ledger_id, budget)
            else:
                rh.wait_for_lac(self._next - 1, budget)
            waited = True
            self._refresh()
        raise errors.ClientClosed("log reader closed")

    def read_available(self, max_entries: int = 100_000) -> list[LogRecord]:
        """Everything readable now, without waiting (up to max_entries)."""
        out: list[LogRecord] = []
        while len(out) < max_entries:
            index, ledger_id, batch = self.read_batch(timeout_s=0)
            if batch is None:
                break
            out.extend(records_of(index, batch))
        return out

    def __iter__(self) -> Iterator[LogRecord]:
        """Tail forever (until close())."""
        while not self._closed:
            index, ledger_id, batch = self.read_batch()
            if batch is not None:
                yield from records_of(index, batch)

    def close(self) -> None:
        self._closed = True
        for ledger_id in list(self._handles):
            self._drop_handle(ledger_id)

    def __enter__(self) -> LogReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _concat(batches: Iterable[pa.RecordBatch]) -> pa.RecordBatch:
    batches = list(batches)
    if len(batches) == 1:
        return batches[0]
    if not batches:
        return pa.RecordBatch.from_pydict({"ledger_id": pa.array([], pa.int64()),
                                           "entry_id": pa.array([], pa.int64()),
                                           "payload": pa.array([], pa.binary())})
    return one_batch(pa.Table.from_batches(batches))


TIMESTAMP_TYPE = pa.timestamp("us", tz="UTC")


def with_append_time(batch: pa.RecordBatch | pa.Table,
                     custom: Mapping[str, str]) -> pa.RecordBatch | pa.Table:
    """(ledger_id, entry_id, payload) read from a ledger with custom metadata
    ``custom`` -> (ledger_id, entry_id, payload, timestamp): the header
    stripped from a time-prefixed ledger's entries, else a null time."""
    if append_time.is_time_prefixed(custom):
        times, payload = append_time.unframe(batch.column("payload"))
    else:
        times, payload = pa.nulls(batch.num_rows, TIMESTAMP_TYPE), batch.column("payload")
    columns = [batch.column("ledger_id"), batch.column("entry_id"), payload, times]
    names = ["ledger_id", "entry_id", "payload", "timestamp"]
    if isinstance(batch, pa.Table):
        return pa.Table.from_arrays(columns, names=names)
    return pa.RecordBatch.from_arrays(columns, names=names)


def records_of(index: int, batch: pa.RecordBatch) -> list[LogRecord]:
    cols = batch.to_pydict()
    times = batch.column("timestamp").cast(pa.int64()).to_pylist() \
        if "timestamp" in batch.schema.names else [None] * batch.num_rows
    return [LogRecord(Position(index, lid, eid), payload, t)
            for lid, eid, payload, t in zip(cols["ledger_id"], cols["entry_id"],
                                            cols["payload"], times)]
