"""The scrubber: re-read stored batches in the background and check them.

Theory of operation
-------------------
Every ``scrub_interval_s`` seconds a pass walks every batch stored in a file
(segments and journal-resident batches, ``EntryStore.flushed_refs``) in file
order, reads its bytes from the file and checks that

  * it parses as one Arrow IPC batch of the entry schema whose rows all
    belong to its ledger, and
  * every row's digest matches (``pybk_spark.wire.digest``; the type is told by
    the digest's length: 4 bytes crc32c, 32 bytes hmac keyed by the ledger's
    master key, which the bookie recorded; 0 bytes none).

A damaged batch is handed to ``Bookie.quarantine_batch``: it leaves the
index, rows whose digests still match are kept (re-stored through the write
cache, so the next checkpoint writes them to a segment), and the ids of the
rest are reported lost exactly like journal damage (``event=entries_missing``,
``damage.py``), so the auditor copies them back from the other replicas.

Rate limit: the pass reads at most ``scrub_rate_bytes_per_s`` on average;
after each batch it waits (``wait``, the stop event's wait) until the bytes
read so far are due by the injected ``clock``.  A scrub never changes what a
read returns for an intact batch, and takes no lock while reading the file.
"""
from __future__ import annotations

import logging
import os
import threading
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, Optional

import numpy as np
import pyarrow as pa

from pybk_spark.wire.digest import Digester
from pybk_spark.wire.entries import ENTRY_SCHEMA

if TYPE_CHECKING:
    from bookie_server.bookie import Bookie

log = logging.getLogger("bookie.scrubber")

_DIGEST_TYPES = {0: "none", 4: "crc32c", 32: "hmac"}


@dataclass
class ScrubReport:
    batches: int = 0
    bytes: int = 0
    damaged: int = 0
    stopped: bool = False


def check_batch(data: bytes, ledger_id: int, key: Optional[bytes]
                ) -> tuple[Optional[pa.RecordBatch], Optional[np.ndarray]]:
    """(batch, digest-ok mask); (None, None) if the bytes do not parse as an
    entry batch of ``ledger_id``.  Without a key, hmac rows are not checked."""
    try:
        batch = pa.ipc.open_stream(pa.py_buffer(data)).read_next_batch()
        if batch.schema.names != ENTRY_SCHEMA.names or batch.num_rows == 0:
            return None, None
        lids = batch.column(0).to_numpy()
        if (lids != ledger_id).any() or batch.column(4).null_count:
            return None, None
        lengths = {len(d) for d in batch.column("digest").to_pylist()}
    except (pa.ArrowException, ValueError, OSError):
        return None, None
    dtype = _DIGEST_TYPES.get(next(iter(lengths))) if len(lengths) == 1 else None
    if dtype is None:           # not a digest this bookie knows: the structure is all it checks
        return batch, np.ones(batch.num_rows, bool)
    if dtype == "hmac" and key is None:
        return batch, np.ones(batch.num_rows, bool)
    return batch, Digester.with_key(dtype, key or b"").verify_batch(batch)


class Scrubber:
    def __init__(self, bookie: Bookie, interval_s: float, rate_bytes_per_s: float, *,
                 clock: Callable[[], float] = time.monotonic,
                 wait: Optional[Callable[[float], bool]] = None):
        self.bookie = bookie
        self.interval = interval_s
        self.rate = rate_bytes_per_s
        self.clock = clock
        self._stop = threading.Event()
        self.wait = wait or self._stop.wait
        self._thread = threading.Thread(target=self._loop, name="scrubber", daemon=True)
        self.passes = 0

    def start(self) -> None:
        if self.interval > 0:
            self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()

    def _loop(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                report = self.scrub_once()
                log.info("event=scrub_pass batches=%d bytes=%d damaged=%d", report.batches,
                         report.bytes, report.damaged)
            except Exception as exc:  # noqa: BLE001 - next pass retries
                log.error("event=scrub_failed error=%r", exc)

    def scrub_once(self) -> ScrubReport:
        report = ScrubReport()
        t0 = self.clock()
        metrics = self.bookie.metrics
        for ref_id, ref, path in self.bookie.store.flushed_refs():
            if self._stop.is_set():
                report.stopped = True
                break
            try:
                with open(path, "rb") as fh:
                    data = os.pread(fh.fileno(), ref.length, ref.offset)
            except FileNotFoundError:       # compacted / GC'd meanwhile
                continue
            report.batches += 1
            report.bytes += len(data)
            metrics.scrub_bytes.inc(len(data))
            state = self.bookie.states.get(ref.ledger)
            batch, ok = check_batch(data, ref.ledger, state.master_key if state else None)
            if batch is None or ok is None or not ok.all() or len(data) < ref.length:
                log.error("event=scrub_damage file=%s offset=%d bytes=%d ledger=%d reason=%s",
                          os.path.basename(path), ref.offset, ref.length, ref.ledger,
                          "unreadable batch" if batch is None else "digest mismatch")
                report.damaged += 1
                metrics.scrub_damaged.inc()
                good = (batch.filter(pa.array(ok))
                        if batch is not None and ok is not None and ok.any() else None)
                self.bookie.quarantine_batch(ref_id, ref.ledger, good)
            due = report.bytes / self.rate if self.rate > 0 else 0.0
            ahead = due - (self.clock() - t0)
            if ahead > 0 and self.wait(ahead):
                report.stopped = True
                break
        self.passes += 1
        return report
