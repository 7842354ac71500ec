"""Helpers for hand-scripted fault scenarios against a real LocalCluster
(tests/chaos/test_regressions.py, test_fault_flags.py): a recorded writer, a
raw-wire writer that sends an entry to chosen bookies only, process control
and the final check.  Every wait is bounded (hang guards, not thresholds)."""
from __future__ import annotations

import os
import signal
from pathlib import Path

from pybk_spark import errors
from pybk_spark.ledger.client import BookKeeper
from pybk_spark.wire.digest import Digester
from pybk_spark.protocol import ledger_metadata as lm
from pybk_spark.wire.entries import batch_to_bytes, make_batch

from . import checker as chk
from .history import History, digest, load_histories, pair_ops

HANG_GUARD_S = 120.0


def client(cluster, **conf) -> BookKeeper:
    base = {"explicit_lac_interval_ms": 0}
    base.update(conf)
    return BookKeeper(cluster.metadata_uri, conf=base)


def ensure_bookies(cluster, n: int) -> None:
    while len(cluster.bookie_ids) < n:
        cluster.add_bookie()


class RecordedWriter:
    """A LedgerHandle whose adds are recorded in a history file."""

    def __init__(self, hist: History, lh):
        self.hist, self.lh = hist, lh
        self.seq = 0

    def add_async(self, payload: bytes | None = None):
        payload = payload or f"{self.hist.proc}:{self.seq}:x".encode()
        self.seq += 1
        op = self.hist.invoke("add", ledger=self.lh.ledger_id, digests=[digest(payload)])
        fut = self.lh.add_entry_async(payload)

        def done(f):
            if f.exception() is None:
                self.hist.ok(op, "add", ledger=self.lh.ledger_id, entry=f.result())
            else:
                self.hist.error(op, "add", f.exception(), ledger=self.lh.ledger_id)
        fut.add_done_callback(done)
        return fut

    def add(self, payload: bytes | None = None):
        """Returns the outcome: "ok" or the error (never raises)."""
        fut = self.add_async(payload)
        try:
            fut.result(HANG_GUARD_S)
            return "ok"
        except errors.BKError as exc:
            return exc


class RawWriter:
    """The original writer at the wire level: sends one entry to the bookies
    we choose, when we choose (to script message loss and delay), and records
    the add as ok once ``ack_quorum`` bookies acknowledged it.  Entries carry
    the cumulative length a writer would give them: ``base_length`` bytes
    before ``first_entry``, then the payloads of the ids from there (the
    default payload for an id never sent)."""

    def __init__(self, bk: BookKeeper, hist: History, md: lm.LedgerMetadata, password=b"",
                 *, first_entry: int = 0, base_length: int = 0):
        self.bk, self.hist, self.md = bk, hist, md
        self.key = lm.master_key(password)
        self.digester = Digester(md.digest_type, password)
        self.acks: dict[int, set] = {}
        self.ops: dict[int, int] = {}
        self.first_entry, self.base_length = first_entry, base_length
        self.payloads: dict[int, bytes] = {}

    @staticmethod
    def default_payload(entry_id: int) -> bytes:
        return f"raw:{entry_id}:x".encode()

    def length_of(self, entry_id: int) -> int:
        return self.base_length + sum(len(self.payloads.get(i) or self.default_payload(i))
                                      for i in range(self.first_entry, entry_id + 1))

    def send(self, entry_id: int, lac: int, bookie: str, payload: bytes | None = None,
             record: bool = True):
        """``record=False``: replay an add the history already holds (a late
        landing of another writer's in-flight add), without a new operation."""
        payload = payload or self.default_payload(entry_id)
        self.payloads[entry_id] = payload
        if not record:
            return self._add(entry_id, lac, bookie, payload)
        if entry_id not in self.ops:
            self.ops[entry_id] = self.hist.invoke("add", ledger=self.md.ledger_id,
                                                  digests=[digest(payload)])
            self.acks[entry_id] = set()
        result = self._add(entry_id, lac, bookie, payload)
        if result != "ok":
            return result
        self.acks[entry_id].add(bookie)
        if len(self.acks[entry_id]) == self.md.ack_quorum:
            self.hist.ok(self.ops[entry_id], "add", ledger=self.md.ledger_id, entry=entry_id)
        return "ok"

    def _add(self, entry_id: int, lac: int, bookie: str, payload: bytes):
        lid = self.md.ledger_id
        length = self.length_of(entry_id)
        digests = self.digester.compute(lid, [entry_id], [lac], [length], [payload])
        data = batch_to_bytes(make_batch(lid, [entry_id], [lac], [length], [payload], digests))
        try:
            self.bk.transports.get(bookie).add(lid, self.key, data).result(HANG_GUARD_S)
        except errors.BKError as exc:
            return exc
        return "ok"

    def finish(self) -> None:
        """Adds that never reached Qa end unknown (as a writer would see them)."""
        for e, op in self.ops.items():
            if len(self.acks[e]) < self.md.ack_quorum:
                self.hist.complete(op, "add", "unknown", ledger=self.md.ledger_id,
                                   error="no ack quorum")


def sigstop_etcd(cluster) -> None:
    os.kill(cluster.etcd.pid, signal.SIGSTOP)


def sigcont_etcd(cluster) -> None:
    if cluster.etcd.pid is not None:
        try:
            os.kill(cluster.etcd.pid, signal.SIGCONT)
        except ProcessLookupError:
            pass


def restart_bookie(cluster, bk_clients, bookie: str) -> None:
    """SIGKILL + start (whatever it had queued is lost); fresh channels."""
    cluster.kill_bookie(bookie, signal.SIGKILL)
    cluster.start_bookie(bookie)
    for bk in bk_clients:
        bk.transports.invalidate(bookie)


def final_check(cluster, hist_dir: Path, ledger_ids=None, **conf) -> list:
    """Recover (if needed), read and judge the given ledgers (default all)."""
    bk = client(cluster, **conf)
    try:
        final = chk.collect_final_state(bk, ledger_ids=ledger_ids, log=print)
    finally:
        bk.close()
    ops = pair_ops(load_histories(str(hist_dir)))
    ops = [op for op in ops if ledger_ids is None or op.get("ledger") in set(ledger_ids)]
    violations = chk.check(ops, final)
    for v in violations:
        print(v)
        for op in chk.minimal_history(ops, v):
            print("    ", chk.format_op(op))
    return violations
