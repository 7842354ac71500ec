"""Bookie-to-bookie re-replication: this bookie pulls entries from a peer.

Theory of operation
-------------------
The re-replication driver (pybk_spark/admin/operations/rereplicate.py) asks the
replacement bookie, with ``PullEntries``, for the ids a lost replica must
hold and names a surviving peer.  This bookie then, with no client in the
data path:

1. reads the span of the wanted ids from the peer with sparse reads
   (``ReadRequest.sparse``: every stored id, gaps skipped), over the peer's
   read lane when it registered one and the bookies talk plaintext
   (serving/peer_lane.py: the entries leave the peer from where they are
   stored and arrive where this bookie's journal writes them from, a
   ``RecordSpace``; the reads are pipelined on one
   connection and answered on this thread), else its gRPC ``ReadEntries``
   (serving/peer_client.py: futures), up to
   ``window`` reads in flight, each up to ``COPY_BATCH_ENTRIES`` ids and
   ``COPY_BATCH_BYTES`` bytes; a LIMIT answer resumes after its last row
   (the plan is ``protocol.sparse_reads.SparseReadWindow``, shared with the
   client's re-replication reads);
2. keeps the rows that are wanted (one ``searchsorted`` per batch) and whose
   digest is correct (``Digester.verify_batch``: one call per batch);
3. journals each kept batch as a RECOVERY add under the given key, the
   stored Arrow rows byte for byte (lac, length and digest unchanged; the
   peer's IPC bytes as received when every row of an answer is kept, framed
   where they were received, their journal record's CRC made from the
   digest check's CRC over the payloads and the bytes around them:
   ``Digester.check_batch``, ``crc_combine.around``), up to
   ``MAX_ADDS_IN_FLIGHT`` adds outstanding (an add refused by admission
   waits for the older ones and is retried);
4. answers, once every add it made is durable, the number of entries and
   bytes copied and the wanted ids it did not copy (absent or corrupt on the
   peer, or the peer failed midway: the message says which).

Nothing here changes metadata: the driver CASes the fragment's ensemble
only after a pull (or several, from several peers) copied every id.  A
crash at any step leaves durable copies of some ids and no metadata change;
the next run pulls again, and a recovery add of an id already stored is
harmless (the bookie keeps one copy).  A peer that predates sparse reads
(a contiguous answer) makes the pull fail with ``BadRequest``: the driver
then copies through a client.
"""
from __future__ import annotations

import concurrent.futures as cf
import time
from collections import deque
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, Iterator, Optional, Union, cast

import numpy as np
import pyarrow as pa

from pybk_spark import errors
from pybk_spark.wire import crc_combine
from pybk_spark.wire.digest import BatchCheck, Digester
from pybk_spark.protocol.sparse_reads import SparseReadWindow
from pybk_spark.wire.entries import batch_to_buffer
from bookie_server.journal.direct_write import RecordSpace
from bookie_server.serving.peer_client import PeerReader
from bookie_server.serving.peer_lane import LanePeerReader, PeerAnswer

if TYPE_CHECKING:
    from bookie_server.bookie import Bookie
    from bookie_server.journal.journal_format import Position
    from pybk_spark.wire.results import ReadResult

# reads in flight per pull and adds outstanding: every one holds a 5 MB
# answer buffer, and a deeper pipeline fills more of them for the first
# time; 4 pulls at once copied fastest at 3 and 2 (docs/performance.md, (8))
DEFAULT_WINDOW = 3
MAX_WINDOW = 16
# one read answer = one journaled batch = one stored batch: the size the
# client path writes (admin/operations/rereplicate.py) and replica checks read
# (5000-id sparse reads); copies stored as 10,000-row batches made every
# later 5000-id read of them load twice what it returned (measured: the
# replicas check after a pull took 2x as long)
COPY_BATCH_ENTRIES = 5000
COPY_BATCH_BYTES = 8 << 20
MAX_ADDS_IN_FLIGHT = 2
_WAKE_EVERY_S = 0.5


Handle = Union[int, "cf.Future[ReadResult]"]
Answer = tuple[Handle, Optional["ReadResult"], Optional[BaseException]]


@dataclass
class PullOutcome:
    entries: int
    bytes: int
    missing: np.ndarray          # wanted ids not copied, ascending
    message: str = ""            # why some were not copied (peer error)


def ids_from_bytes(data: bytes) -> np.ndarray:
    ids = np.frombuffer(data, dtype="<i8").astype(np.int64)
    if len(ids) > 1 and not bool((np.diff(ids) > 0).all()):
        raise errors.BadRequest("wanted_ids must be strictly ascending")
    if len(ids) and ids[0] < 0:
        raise errors.BadRequest("wanted_ids must be >= 0")
    return ids


def ids_to_bytes(ids: np.ndarray) -> bytes:
    return np.asarray(ids, dtype="<i8").tobytes()


class _Adds:
    """Recovery adds to this bookie, a bounded number outstanding."""

    def __init__(self, bookie: Bookie, ledger_id: int, key: bytes, keyless: bool) -> None:
        self.bookie, self.ledger_id, self.key, self.keyless = bookie, ledger_id, key, keyless
        # (future, ids, payload bytes)
        self.inflight: deque[tuple[cf.Future[Position], np.ndarray, int]] = deque()
        self.entries = self.bytes = 0
        self.copied: list[np.ndarray] = []

    def submit(self, data: Union[bytes, pa.Buffer], ids: np.ndarray, nbytes: int,
               data_crc: Optional[int] = None, space: Optional[RecordSpace] = None) -> None:
        """``data``: one Arrow IPC entry batch (bytes or a pyarrow Buffer);
        ``data_crc``: its crc32c, where known; ``space``: the journal
        record space ``data`` lies in, where it does."""
        while True:
            while len(self.inflight) >= MAX_ADDS_IN_FLIGHT:
                self._settle_oldest()
            try:
                fut, _first, _last = self.bookie.add_async(self.ledger_id, self.key, data,
                                                           recovery=True, keyless=self.keyless,
                                                           body_crc=data_crc, space=space)
                break
            except errors.TooManyRequests:
                if self.inflight:
                    self._settle_oldest()
                else:
                    time.sleep(0.05)
        self.inflight.append((fut, ids, nbytes))

    def _settle_oldest(self) -> None:
        fut, ids, nbytes = self.inflight.popleft()
        fut.result()                 # a failed journal write fails the whole pull
        self.entries += len(ids)
        self.bytes += nbytes
        self.copied.append(ids)

    def drain(self) -> None:
        while self.inflight:
            self._settle_oldest()


def pull(bookie: Bookie, peer: Union[PeerReader, LanePeerReader], ledger_id: int, key: bytes,
         wanted: np.ndarray, digest_type: str, *, keyless: bool = False, window: int = 0,
         timeout: float = 30.0) -> PullOutcome:
    """Copy ``wanted`` ids of ``ledger_id`` from ``peer`` (its sparse
    ``read`` futures: serving/peer_lane.py's ``LanePeerReader`` or
    serving/peer_client.py's ``PeerReader``) into
    ``bookie``'s journal; see the module docstring."""
    digester = Digester.with_key(digest_type, key)
    adds = _Adds(bookie, ledger_id, key, keyless)
    if len(wanted) == 0:
        return PullOutcome(0, 0, wanted)
    cfg = bookie.cfg
    max_entries = min(COPY_BATCH_ENTRIES, cfg.max_read_entries)
    max_bytes = min(COPY_BATCH_BYTES, cfg.max_read_bytes)
    window = min(window or DEFAULT_WINDOW, MAX_WINDOW)      # a request cannot ask for more
    win: SparseReadWindow[Handle] = SparseReadWindow(wanted, max_entries, window)
    problem = ""
    ask = _Ask(ledger_id, max_entries, max_bytes, timeout)
    reads: Union[_PipelinedReads, _FutureReads] = (
        _PipelinedReads(peer, ask) if isinstance(peer, LanePeerReader) else _FutureReads(peer, ask))
    try:
        while win.busy and not problem:
            win.fill(reads.send)
            for handle, res, exc in reads.answers(win.inflight):
                span = win.finished(handle)
                if isinstance(exc, errors.NoSuchLedger):
                    continue         # the peer holds none of them
                if exc is not None:
                    problem = f"peer read failed: {type(exc).__name__}: {exc}"
                    break
                assert res is not None
                if res.end == "MISSING":
                    raise errors.BadRequest("the peer answered a sparse read with a contiguous "
                                            "run: it predates sparse reads")
                batch = res.batch
                if batch.num_rows:
                    # a copy: the ids outlive the answer (``_Adds.copied``),
                    # whose buffer goes back to the pool once journaled
                    eids = batch.column("entry_id").to_numpy().copy()
                    keep = win.answered(span, eids, res.end)
                    _copy(adds, digester, batch, eids, keep, res.raw,
                          res.space if isinstance(res, PeerAnswer) else None)
                elif res.end == "LIMIT":
                    problem = "peer answered LIMIT with no rows"
    finally:
        reads.abandon(win.abandon())
        adds.drain()
    copied = np.concatenate(adds.copied) if adds.copied else np.empty(0, np.int64)
    missing = np.setdiff1d(wanted, copied, assume_unique=True)
    if len(missing) and not problem:
        problem = f"{len(missing)} wanted entries absent or corrupt on the peer"
    return PullOutcome(adds.entries, adds.bytes, missing, problem)


@dataclass(frozen=True)
class _Ask:
    """What each sparse read of one pull asks for."""
    ledger_id: int
    max_entries: int
    max_bytes: int
    timeout: float


class _Reads:
    """A pull's reads of its peer through ``request`` (the reader's
    ``send`` or ``read``): ``send`` one, then take the ``answers``."""

    def __init__(self, request: Callable[..., Handle], ask: _Ask) -> None:
        self.request, self.ask = request, ask

    def send(self, a: int, b: int) -> Handle:
        q = self.ask
        return self.request(q.ledger_id, a, b, max_entries=q.max_entries,
                            max_bytes=q.max_bytes, timeout=q.timeout, sparse=True)


class _PipelinedReads(_Reads):
    """A lane reader's reads: sent ahead on its connection, answered in the
    order sent, received on this thread (serving/peer_lane.py)."""

    def __init__(self, peer: LanePeerReader, ask: _Ask) -> None:
        super().__init__(peer.send, ask)
        self.peer = peer

    def answers(self, inflight: dict[Handle, tuple[int, int]]) -> Iterator[Answer]:
        oldest = next(iter(inflight))          # sent first, answered first
        try:
            res = self.peer.receive()
        except errors.BKError as exc:
            yield oldest, None, exc
        else:
            yield oldest, res, None

    def abandon(self, handles: list[Handle]) -> None:
        self.peer.discard()


class _FutureReads(_Reads):
    """A gRPC reader's reads: each a future, taken as they complete, in
    span order among those completed together."""

    def __init__(self, peer: PeerReader, ask: _Ask) -> None:
        super().__init__(peer.read, ask)

    def answers(self, inflight: dict[Handle, tuple[int, int]]) -> Iterator[Answer]:
        done, _ = cf.wait(cast("list[cf.Future[ReadResult]]", list(inflight)),
                          timeout=_WAKE_EVERY_S, return_when=cf.FIRST_COMPLETED)
        for f in sorted(done, key=lambda x: inflight[x][0]):
            exc = f.exception()
            yield f, (None if exc is not None else f.result()), exc

    def abandon(self, handles: list[Handle]) -> None:
        for f in handles:
            cast("cf.Future[ReadResult]", f).cancel()


def _copy(adds: _Adds, digester: Digester, batch: pa.RecordBatch, eids: np.ndarray,
          keep: np.ndarray, raw: Optional[pa.Buffer] = None,
          space: Optional[RecordSpace] = None) -> None:
    """Journal the wanted rows of ``batch`` (``keep``) whose digests are
    correct: the peer's own Arrow IPC bytes (``raw``, framed where they
    were received when that is a journal record ``space``) when every row
    is kept, else the kept rows re-encoded."""
    if not keep.all():
        if not keep.any():
            return
        batch, eids, raw = batch.filter(pa.array(keep)), eids[keep], None
    check = digester.check_batch(batch)
    ok = check.ok
    if not ok.all():
        if not ok.any():
            return
        batch, eids, raw = batch.filter(pa.array(ok)), eids[ok], None
    if raw is None or not len(raw):
        adds.submit(batch_to_buffer(batch), eids, int(batch.nbytes))
    else:
        adds.submit(raw, eids, int(batch.nbytes), _raw_crc(raw, check), space)


def _raw_crc(raw: pa.Buffer, check: BatchCheck) -> Optional[int]:
    """The crc32c of the answer's bytes from the digest check's CRC over
    the payloads within them (``crc_combine.around``: only the bytes around
    the payloads are read); None where the check took none, or its
    payloads do not lie within ``raw``."""
    if check.payloads_crc is None:
        return None
    start = check.payloads_at - raw.address
    if start < 0 or start + check.payloads_len > raw.size:
        return None
    return crc_combine.around(raw, start, check.payloads_len, check.payloads_crc)
