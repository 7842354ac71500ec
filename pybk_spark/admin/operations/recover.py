"""Dead-writer recovery: find not-closed ledgers whose writer is gone, fence,
recover and close each one (``pybk recover`` and jobs/recover_ledgers.py).

Theory of operation
-------------------
1. Driver: list the ledgers (all, or the segments of one log), read each
   one's metadata and writer lease (``writers/<id>``), and keep those
   ``audit.select_for_recovery`` accepts.  A live writer's ledger is never
   chosen without ``force``.
2. Per ledger (a Spark task, or a loop in-process): ``open_ledger(id,
   recovery=True)`` - the client's fencing recovery (IN_RECOVERY CAS, fence,
   read forward, recovery adds, CLOSED CAS).  Every acknowledged entry
   survives; concurrent recoverers converge on the first CLOSED value, so
   running twice, or beside another recoverer, is safe; a ledger that got
   closed meanwhile is reported ``already-closed``.
3. Summary rows: ledger, state before, entries recovered (last entry minus
   the LAC seen before fencing), last entry, seconds, outcome, error.  Any
   ``failed`` row makes the exit status non-zero.

Passwords: ``--password`` or the ledger's custom metadata ``password``
(default empty).  An operator client (``operator = true``, an identity
in the bookies' ``tls_operator_identities``) needs neither: it learns each
ledger's master key from a bookie of the ledger (:func:`learn_key`, checked
against the metadata) and recovers with it; re-replication and damage
repair likewise (:func:`access_key`).
"""
from __future__ import annotations

import time
from typing import Callable, Iterable, Optional

from pybk_spark import errors
from pybk_spark.admin.decisions import audit
from pybk_spark.admin.report import Progress, table
from pybk_spark.ledger.client import BookKeeper
from pybk_spark.ledger.port import LedgerClient
from pybk_spark.ledger.lac_query import query_lac
from pybk_spark.logs.log import read_log
from pybk_spark.protocol import ledger_metadata as lm
from pybk_spark.protocol.access import OPERATOR_KEY
from pybk_spark.wire.digest import Digester

PASSWORD_CUSTOM_KEY = "password"
SUMMARY_COLUMNS = ["ledger", "state_before", "entries_recovered", "last_entry", "seconds",
                   "outcome", "error"]


def ledger_password(md: lm.LedgerMetadata, given: Optional[bytes]) -> bytes:
    if given is not None:
        return given
    return str(md.custom.get(PASSWORD_CUSTOM_KEY, "")).encode()


def access_key(bk: LedgerClient, md: lm.LedgerMetadata, given: Optional[bytes],
               check: bool = True) -> tuple[bytes, Digester]:
    """(master key, Digester) with which a tool copies, fills in or fences a
    ledger's entries.

    An operator client (``operator = true``, with an identity in the
    bookies' ``tls_operator_identities``) given no ``--password`` learns the
    key from a bookie of the ledger (a LAC read answered with the recorded
    key: protocol/access.py) and keeps it only if it matches the metadata's
    ``password_check``: copies then carry the writer's key and keyed (hmac)
    digests are verified.  When no bookie has it (every replica lost its
    state), it sends the empty key (the bookies' key-less path for
    operators) and verifies what it can without the key: ``crc32c`` digests
    are not keyed and are verified; ``hmac`` entries are copied verbatim,
    unverified, the writer's digests unchanged (readers verify them and skip
    a bad replica).

    Otherwise the ledger's password (``--password`` or its custom metadata
    ``password``), checked against the metadata when ``check``."""
    if getattr(bk.conf, "operator", False) and given is None:
        key = learn_key(bk, md)
        if key:
            return key, Digester.with_key(md.digest_type, key)
        return OPERATOR_KEY, Digester("none" if md.digest_type == "hmac" else md.digest_type)
    pw = ledger_password(md, given)
    if check:
        lm.check_password(md, pw)
    return lm.master_key(pw), Digester(md.digest_type, pw)


def learn_key(bk: LedgerClient, md: lm.LedgerMetadata) -> bytes:
    """The ledger's master key as a bookie of it recorded it, checked against
    the metadata; b"" when no registered bookie of the ledger answers one."""
    for bookie in sorted(md.all_bookies()):
        try:
            got = bk.transports.get(bookie).read_lac(
                md.ledger_id, master_key=OPERATOR_KEY, timeout=bk.conf.read_timeout_s).result()
        except errors.BKError:
            continue
        if got.master_key and (not md.password_check
                               or lm.key_check_of(got.master_key) == md.password_check):
            return got.master_key
    return b""


def ledgers_of_log(bk: LedgerClient, log_name: str) -> list[int]:
    md, _ = read_log(bk.metadata_store, log_name)
    return list(md.ledger_ids)


def list_candidates(bk: LedgerClient, *, log: str | None = None, ledgers: Iterable[int] | None = None,
                    min_idle_s: float = 0.0, force: bool = False, now_ms: int | None = None
                    ) -> tuple[list[int], list[dict]]:
    """(ledger ids to recover, [{ledger, reason}] skipped not-closed ones).
    ``log`` / ``ledgers`` narrow the scan (both: their intersection)."""
    now_ms = int(time.time() * 1000) if now_ms is None else now_ms
    ids = ledgers_of_log(bk, log) if log else bk.list_ledgers()
    if ledgers is not None:
        wanted = set(ledgers)
        ids = [i for i in ids if i in wanted]
    chosen, skipped = [], []
    for lid in ids:
        try:
            md = bk.get_ledger_metadata(lid)
        except errors.NoSuchLedger:
            continue
        choice = audit.select_for_recovery(md, bk.is_writer_alive(lid), now_ms, min_idle_s, force)
        if choice.recover:
            chosen.append(lid)
        elif not md.is_closed:
            skipped.append({"ledger": lid, "reason": choice.reason})
    return chosen, skipped


def recover_with(bk: LedgerClient, ledger_id: int, password: Optional[bytes] = None,
                 clock: Callable[[], float] = time.monotonic) -> dict:
    """Recover one ledger with an existing client; never raises."""
    t0 = clock()
    row = {"ledger": ledger_id, "state_before": None, "entries_recovered": None,
           "last_entry": None, "seconds": 0.0, "outcome": "failed", "error": ""}
    try:
        md = bk.get_ledger_metadata(ledger_id)
        row["state_before"] = md.state
        pw = ledger_password(md, password)
        if getattr(bk.conf, "operator", False) and password is None and not md.is_closed:
            key = learn_key(bk, md)            # an operator: no password needed
            if key:
                pw = lm.MasterKey(key)
        if md.is_closed:
            row.update(last_entry=md.last_entry_id, entries_recovered=0, outcome="already-closed")
            return row
        lac_before = _lac_before(bk, md, pw)
        rh = bk.open_ledger(ledger_id, password=pw, recovery=True)
        last = rh.metadata.last_entry_id
        row["last_entry"] = last
        row["entries_recovered"] = None if lac_before is None else max(0, last - lac_before)
        row["outcome"] = "recovered"
    except errors.NoSuchLedger:
        row.update(outcome="deleted", error="ledger deleted meanwhile")
    except errors.BKError as exc:
        row["error"] = f"{type(exc).__name__}: {exc}"
    except Exception as exc:  # noqa: BLE001 - a task reports, it does not crash the job
        row["error"] = f"unexpected {type(exc).__name__}: {exc}"
    finally:
        row["seconds"] = round(clock() - t0, 3)
    return row


def _lac_before(bk: LedgerClient, md: lm.LedgerMetadata, password: bytes) -> Optional[int]:
    lm.check_password(md, password)
    try:
        return query_lac(bk.context, md, lm.master_key(password), fence=False)
    except errors.BKError as exc:
        if isinstance(exc, errors.Unauthorized):
            raise
        return None


def recover_task(metadata_uri: str, ledger_id: int, password: Optional[bytes] = None) -> dict:
    """One Spark task: its own client (clients are not picklable)."""
    with BookKeeper(metadata_uri, background=False) as bk:
        return recover_with(bk, ledger_id, password)


def recover_in_process(bk: LedgerClient, ids: Iterable[int], password: Optional[bytes] = None,
                       progress: bool = True) -> list[dict]:
    ids = list(ids)
    rows: list[dict] = []
    with Progress("recover", len(ids), enabled=progress) as p:
        for lid in ids:
            rows.append(recover_with(bk, lid, password))
            p.step(f"ledger {lid}: {rows[-1]['outcome']}")
    return rows


def summary(rows: list[dict], skipped: list[dict]) -> tuple[str, int]:
    """(human text, exit status): 1 if any ledger failed."""
    failed = [r for r in rows if r["outcome"] == "failed"]
    parts = [table(rows, SUMMARY_COLUMNS, empty="nothing to recover")]
    if skipped:
        parts.append("skipped (not closed): " + ", ".join(
            f"{s['ledger']} ({s['reason']})" for s in skipped))
    counts: dict = {}
    for r in rows:
        counts[r["outcome"]] = counts.get(r["outcome"], 0) + 1
    parts.append("summary: " + (", ".join(f"{k}={v}" for k, v in sorted(counts.items()))
                                or "0 ledgers"))
    if failed:
        parts.append("FAILED: " + "; ".join(f"ledger {r['ledger']}: {r['error']}" for r in failed))
    return "\n".join(parts), (1 if failed else 0)


def report_json(rows: list[dict], skipped: list[dict]) -> dict:
    return {"ledgers": rows, "skipped": skipped,
            "failed": [r["ledger"] for r in rows if r["outcome"] == "failed"]}
