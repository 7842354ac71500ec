"""Jepsen-style operation histories, one JSON-lines file per worker process.

Every client operation is recorded twice: an ``invoke`` line when it starts
and a completion line when it ends, ``ok`` / ``fail`` / ``unknown``.  The
completion rule is Jepsen's: an error whose ``outcome_known`` is False
(Timeout, LedgerFenced, BookieUnavailable, MetadataUnavailable) and any
unexpected exception are ``unknown`` (the operation MAY have happened);
only a typed error with a known outcome is ``fail``.

A line is a flat JSON object:
    t        wall time (time.time())
    proc     worker name ("lw-3", "log-a-2", "tail-1", "rec-0", "checker")
    id       per-process operation number (invoke and completion share it)
    type     invoke | ok | fail | unknown
    op       add | append | read | recover | close | create
    ledger   ledger id (if known)        log     log name (appends, log reads)
    entry    first entry id (ok adds, reads)  pos  [segment, ledger, entry] list
    digests  payload digests, in entry order (adds, appends, reads)
    last     last entry id (recover / close ok)   error  error class name
    start, found  a recovery's own decision (``note`` lines, op ``recovery``):
             ids up to ``start`` known acknowledged, ``start``+1..``found``
             found and re-written; recorded before the re-writes by every
             fencing recovery a worker's client runs (``History.recovery``).
Payloads are never stored, only ``digest(payload)``; every payload a writer
produces is unique (``make_payload``), so a digest names one operation.
``note`` lines (facts, not operations) pass through ``pair_ops`` unpaired,
with outcome ``note``.
"""
from __future__ import annotations

import glob
import hashlib
import itertools
import json
import os
import threading
import time
from typing import Iterable, Iterator

from pybk_spark import errors

INVOKE, OK, FAIL, UNKNOWN, NOTE = "invoke", "ok", "fail", "unknown", "note"


def digest(payload: bytes) -> str:
    return hashlib.blake2b(payload, digest_size=10).hexdigest()


def make_payload(proc: str, seq: int, rng) -> bytes:
    """Unique, self-describing payload: "<proc>:<seq>:" + seeded filler."""
    head = f"{proc}:{seq}:".encode()
    return head + rng.randbytes(rng.randrange(8, 200))


def payload_origin(payload: bytes) -> tuple[str, int]:
    proc, seq, _ = payload.split(b":", 2)
    return proc.decode(), int(seq)


def outcome_of(exc: BaseException) -> str:
    if isinstance(exc, errors.BKError):
        return FAIL if exc.outcome_known else UNKNOWN
    return UNKNOWN


class History:
    """Thread-safe appender of one process's history (line-buffered file)."""

    def __init__(self, path: str, proc: str, clock=time.time):
        self.path = path
        self.proc = proc
        self._clock = clock
        self._ids = itertools.count(1)
        self._lock = threading.Lock()
        os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
        self._fh = open(path, "a", buffering=1, encoding="utf-8")

    def _write(self, rec: dict) -> None:
        rec = {k: v for k, v in rec.items() if v is not None}
        line = json.dumps(rec, separators=(",", ":"))
        with self._lock:
            if not self._fh.closed:
                self._fh.write(line + "\n")

    def invoke(self, op: str, **fields) -> int:
        op_id = next(self._ids)
        self._write({"t": self._clock(), "proc": self.proc, "id": op_id, "type": INVOKE,
                     "op": op, **fields})
        return op_id

    def complete(self, op_id: int, op: str, outcome: str, **fields) -> None:
        self._write({"t": self._clock(), "proc": self.proc, "id": op_id, "type": outcome,
                     "op": op, **fields})

    def ok(self, op_id: int, op: str, **fields) -> None:
        self.complete(op_id, op, OK, **fields)

    def error(self, op_id: int, op: str, exc: BaseException, **fields) -> str:
        outcome = outcome_of(exc)
        self.complete(op_id, op, outcome, error=type(exc).__name__, **fields)
        return outcome

    def note(self, op: str, **fields) -> None:
        """A fact without invoke/complete (e.g. a writer's ledger assignment)."""
        self._write({"t": self._clock(), "proc": self.proc, "id": 0, "type": NOTE,
                     "op": op, **fields})

    def recovery(self, decision) -> None:
        """A client's ``recovery_listener``: one fencing recovery's own
        decision (``protocol.recovery.RecoveryDecision``), written before it
        re-writes anything, so a process killed mid-re-write still explains
        the copies it left."""
        self.note("recovery", ledger=decision.ledger_id, start=decision.start,
                  found=decision.last)

    def close(self) -> None:
        with self._lock:
            self._fh.close()


def read_history(path: str) -> Iterator[dict]:
    """Lines of one file; a torn last line (SIGKILLed writer) is skipped."""
    with open(path, encoding="utf-8") as fh:
        for line in fh:
            line = line.strip()
            if not line:
                continue
            try:
                yield json.loads(line)
            except ValueError:
                continue


def load_histories(directory: str) -> list[dict]:
    """Merge every ``*.jsonl`` of ``directory`` ordered by wall time."""
    ops: list[dict] = []
    for path in sorted(glob.glob(os.path.join(directory, "*.jsonl"))):
        ops.extend(read_history(path))
    ops.sort(key=lambda r: r.get("t", 0.0))
    return ops


def pair_ops(ops: Iterable[dict]) -> list[dict]:
    """Join invoke + completion into one record per operation.  An invoke
    without a completion (the process was killed) becomes ``unknown``.
    Notes stay single records with outcome ``note``."""
    open_ops: dict[tuple, dict] = {}
    done: list[dict] = []
    for rec in ops:
        kind = rec.get("type")
        if kind == NOTE:
            done.append(dict({k: v for k, v in rec.items() if k != "type"}, outcome=NOTE,
                             invoke_t=rec["t"]))
            continue
        key = (rec["proc"], rec["id"])
        if kind == INVOKE:
            open_ops[key] = dict(rec, outcome=None, invoke_t=rec["t"])
            continue
        inv = open_ops.pop(key, None)
        merged = dict(inv or {}, **{k: v for k, v in rec.items() if k != "type"})
        merged["outcome"] = kind
        if inv is not None:
            merged["invoke_t"] = inv["t"]
            if "digests" in inv and "digests" not in rec:
                merged["digests"] = inv["digests"]
        done.append(merged)
    for inv in open_ops.values():
        done.append(dict(inv, outcome=UNKNOWN, error="no completion (process died)"))
    done.sort(key=lambda r: r.get("invoke_t", r.get("t", 0.0)))
    return done
