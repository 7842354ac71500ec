"""Pending Spark write attempts in etcd: how orphan ledgers are found.

Theory of operation
-------------------
Spark never reports the side effects of a task attempt that failed or was
retried (``abort`` gets ``None`` for it), so a write task records its ledger
BEFORE writing any entry, under

    spark/pending/<log>/<job>/<partition>-<attempt>-<ledger id>

``<job>`` is one batch write (a uuid chosen on the driver) or one streaming
sink (``sink-<hash of its sink id>``; micro-batches of one query run one after
another).  After the driver's commit CAS (or in ``abort``) :func:`clean_job`
deletes every pending ledger that is NOT in the log's ledger list, then the
pending keys.  Deciding by membership in the log (not by the commit messages)
keeps it safe after a driver crash between the CAS and the cleanup: a ledger
that made it into the log is never deleted.

Window left open: a task that dies between creating its ledger and putting its
pending key leaves an empty ledger tagged ``spark_job=<job>`` in its custom
metadata (no data was written to it yet).
"""
from __future__ import annotations

import hashlib
import json
from typing import TYPE_CHECKING, Iterable

from pybk_spark import errors
from pybk_spark.metadata.store import MetadataStore

if TYPE_CHECKING:
    from pybk_spark.ledger.port import LedgerClient

PREFIX = "spark/pending/"


def sink_job(sink_id: str) -> str:
    return "sink-" + hashlib.sha1(sink_id.encode()).hexdigest()[:16]


def job_prefix(log: str, job: str) -> str:
    return f"{PREFIX}{log}/{job}/"


def pending_key(log: str, job: str, partition: int, attempt: int, ledger_id: int) -> str:
    return f"{job_prefix(log, job)}{partition}-{attempt}-{ledger_id}"


def record(store: MetadataStore, log: str, job: str, partition: int, attempt: int, ledger_id: int) -> str:
    key = pending_key(log, job, partition, attempt, ledger_id)
    store.put_if_absent(key, json.dumps({"ledger_id": ledger_id, "partition": partition,
                                         "attempt": attempt}).encode())
    return key


def pending_ledgers(store: MetadataStore, log: str, job: str) -> dict[str, int]:
    """key -> ledger id of every pending attempt of the job."""
    out = {}
    for key, _ in store.list_prefix(job_prefix(log, job)):
        try:
            out[key] = int(key.rsplit("-", 1)[1])
        except ValueError:
            continue
    return out


def delete_ledgers(bk: LedgerClient, ledger_ids: Iterable[int]) -> None:
    for ledger_id in ledger_ids:
        try:
            bk.delete_ledger(ledger_id)
        except errors.NoSuchLedger:
            pass


def clean_job(bk: LedgerClient, log: str, job: str, in_log: Iterable[int],
              extra: Iterable[int] = ()) -> list[int]:
    """Delete the job's pending ledgers not in ``in_log`` (plus ``extra`` ids
    not in it), then its pending keys.  Returns the deleted ledger ids."""
    keep = set(in_log)
    store = bk.metadata_store
    pending = pending_ledgers(store, log, job)
    doomed = sorted({lid for lid in list(pending.values()) + list(extra) if lid not in keep})
    delete_ledgers(bk, doomed)
    store.delete_all(pending)     # exactly the keys listed: a later attempt's key stays
    return doomed
