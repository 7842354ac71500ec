"""The two operator jobs end to end, independent of where tasks run.

``run_recover`` / ``run_rereplicate`` take a *mapper*: ``mapper(task, items,
label) -> results`` applies a picklable top-level ``task(item)`` to every
item.  ``one_per_task=False`` lets a distributed mapper group many small items per
task.  ``local_mapper`` runs them in this process with a progress line,
``parallel`` of them at once (threads: a copy mostly waits on bookies, which
do the work of a pull; the Spark job runs its tasks at once the same way);
``spark_mapper`` (jobs/) runs one Spark task per item.  Tasks open their own
client from the metadata URI (clients are not picklable) and never raise:
each returns one summary row.
"""
from __future__ import annotations

import dataclasses
import functools
import time
from concurrent.futures import ThreadPoolExecutor, as_completed
from typing import Any, Callable, Iterable, Optional, Union

import numpy as np

from pybk_spark.admin.decisions import audit
from pybk_spark.admin.operations import damage_repair
from pybk_spark.admin.decisions import entry_sets as es
from pybk_spark.admin.operations import recover as rec
from pybk_spark.admin.operations import rereplicate as rr
from pybk_spark.admin.report import Progress, table
from pybk_spark.ledger.client import BookKeeper
from pybk_spark.ledger.port import LedgerClient

Mapper = Callable[..., list]      # (task, items, label, one_per_task=True) -> results
# what a task opens its client from: the metadata URI, or it and the driver's
# client settings (``client_target``)
ClientTarget = Union[str, tuple[str, Optional[dict[str, Any]]]]


DEFAULT_PARALLEL = 4     # work items at once in this process (shell --parallel, autorecovery)


def local_mapper(progress: bool = True, parallel: int = 1) -> Mapper:
    """Items in this process, ``parallel`` at a time; results in item order.
    Tasks of the same ledger may run at once: each fragment's ensemble change
    is its own CAS, re-read and re-decided on a conflict (rereplicate.py)."""
    if parallel < 1:
        raise ValueError(f"parallel must be >= 1, not {parallel}")

    def mapper(task: Callable[[Any], Any], items: Iterable[Any], label: str,
               one_per_task: bool = True) -> list:
        items = list(items)
        with Progress(label, len(items), enabled=progress) as p:
            if parallel == 1 or len(items) <= 1:
                out: list = []
                for item in items:
                    out.append(task(item))
                    p.step(_row_label(out[-1]))
                return out
            with ThreadPoolExecutor(min(parallel, len(items)),
                                    thread_name_prefix=f"pybk-{label}") as pool:
                futures = [pool.submit(task, item) for item in items]
                for done in as_completed(futures):
                    p.step(_row_label(done.result()))
                return [f.result() for f in futures]
    return mapper


def _row_label(row: object) -> str:
    if isinstance(row, dict):
        return f"ledger {row.get('ledger')}: {row.get('outcome', '')}"
    return ""


# -- picklable tasks -------------------------------------------------------------------------------
def client_target(bk: LedgerClient, metadata_uri: str) -> ClientTarget:
    """What a task needs to open its own client like ``bk``: the metadata URI
    and the driver's client settings (TLS files, ``operator``), so executors
    reach TLS bookies as the same identity (the file paths must exist on
    every executor)."""
    return (metadata_uri, dataclasses.asdict(bk.conf))


def _client(target: ClientTarget) -> BookKeeper:
    uri, conf = target if isinstance(target, tuple) else (target, None)
    return BookKeeper(uri, conf=conf, background=False)


def recover_task(metadata_uri: ClientTarget, password: Optional[bytes], ledger_id: int) -> dict:
    with _client(metadata_uri) as bk:
        return rec.recover_with(bk, ledger_id, password)


def copy_task(metadata_uri: ClientTarget, password: Optional[bytes],
              work: audit.FragmentWork) -> dict:
    with _client(metadata_uri) as bk:
        return rr.copy_fragment(bk, work, password)


def verify_task(metadata_uri: ClientTarget, password: Optional[bytes], ledger_id: int) -> dict:
    """One ledger's replicas check: ``under`` (what is still missing) and
    ``copied`` (ids filled in on live bookies that lacked them)."""
    with _client(metadata_uri) as bk:
        copied: list[np.ndarray] = []
        under = rr.verify_ledger(bk, ledger_id, password, repair=True, copied=copied)
    n = int(sum(len(ids) for ids in copied))
    return {"ledger": ledger_id, "outcome": "under-replicated" if under else "ok",
            "under": under, "copied": n,
            "entries": es.ranges_text(np.sort(np.concatenate(copied))) if n else ""}


# -- recover ----------------------------------------------------------------------------------------
def run_recover(bk: LedgerClient, metadata_uri: str, mapper: Mapper, *, log: str | None = None,
                ledgers: Optional[Iterable[int]] = None, min_idle_s: float = 0.0,
                force: bool = False, password: Optional[bytes] = None) -> tuple[dict, str, int]:
    """(json report, human text, exit status)."""
    ids, skipped = rec.list_candidates(bk, log=log, ledgers=ledgers, min_idle_s=min_idle_s,
                                       force=force)
    rows = mapper(functools.partial(recover_task, client_target(bk, metadata_uri), password), ids,
                  "recover") if ids else []
    text, status = rec.summary(rows, skipped)
    return rec.report_json(rows, skipped), text, status


# -- rereplicate --------------------------------------------------------------------------------------
def run_rereplicate(bk: LedgerClient, metadata_uri: str, mapper: Mapper, *, bookies: Iterable[str] = (),
                    delay_s: float = 0.0, grace_s: float = 30.0, verify: bool = False,
                    password: Optional[bytes] = None,
                    clock: Callable[[], float] = time.monotonic) -> tuple[dict, str, int]:
    named = list(bookies)
    first = rr.run_audit(bk, delay_s=delay_s, grace_s=grace_s, named=named, plan=False)
    fenced = []
    if first.fence:
        fenced = mapper(functools.partial(recover_task, client_target(bk, metadata_uri), password), first.fence,
                        "fence")
    result = rr.run_audit(bk, delay_s=delay_s, grace_s=grace_s, named=named)
    if result.work and hasattr(mapper, "warm_up"):
        mapper.warm_up()           # keep Spark start-up out of the copy rate
    t0 = clock()
    copies = mapper(functools.partial(copy_task, client_target(bk, metadata_uri), password), result.work,
                    "rereplicate") if result.work else []
    copies = copies + result.unplaced
    summary = rr.copy_summary(copies, clock() - t0)
    damaged = damage_repair.repair_damaged(bk, password)   # bookies/damaged/ markers
    under: list[dict] = []
    filled: list[dict] = []        # ids --verify copied onto live bookies that lacked them
    if verify:
        ids = bk.list_ledgers()
        for got in mapper(functools.partial(verify_task, client_target(bk, metadata_uri), password), ids,
                          "verify", one_per_task=False):
            under.extend(got["under"])
            if got["copied"]:
                filled.append({"ledger": got["ledger"], "copied": got["copied"],
                               "entries": got["entries"]})
    totals = {"fragments": summary["entries"], "damaged": sum(r["copied"] for r in damaged),
              "verify": sum(r["copied"] for r in filled)}
    report: dict = {"lost": sorted(result.lost), "fenced": fenced,
                    "deferred": result.deferred, "copies": copies, "summary": summary,
                    "ledgers": result.ledgers, "damaged": damaged, "entries_copied": totals}
    if verify:
        report["under_replicated"] = under
        report["verify_copied"] = filled
    failed = [r for r in copies if r["outcome"] == "failed"] + \
             [r for r in fenced if r["outcome"] == "failed"] + \
             [r for r in damaged if r["outcome"] == "failed"]
    lines = [f"lost bookies: {', '.join(sorted(result.lost)) or '(none)'}  "
             f"(ledgers audited: {result.ledgers})"]
    if fenced:
        lines.append("fenced open ledgers:\n" + table(fenced, rec.SUMMARY_COLUMNS))
    if result.deferred:
        lines.append("deferred (still being written): " + ", ".join(
            f"{d['ledger']} ({d['reason']})" for d in result.deferred))
    lines.append(table(copies, rr.COPY_COLUMNS, empty="no fragments to re-replicate"))
    lines.append(f"re-replicated fragments: copied {summary['entries']} entries, "
                 f"{summary['bytes'] / 1e6:.2f} MB in "
                 f"{summary['seconds']:.2f}s ({summary['mb_per_s']:.2f} MB/s), "
                 f"{summary['fragments']} fragments, {summary['failed']} failed")
    if damaged:
        lines.append("damaged bookies (bookies/damaged/), entries copied back:\n" +
                     table(damaged, damage_repair.COLUMNS))
    if verify:
        if filled:
            lines.append("verify: entries filled in on bookies that lacked them:\n" +
                         table(filled, ["ledger", "copied", "entries"]))
        lines.append("verify: " + ("every entry has its Qw replicas" if not under else
                                   "UNDER-REPLICATED:\n" + table(under, rr.VERIFY_COLUMNS)))
    lines.append(f"entries copied in all: {sum(totals.values())} (re-replicated fragments "
                 f"{totals['fragments']}, damage repair {totals['damaged']}, "
                 f"verify fill-ins {totals['verify']})")
    if failed:
        lines.append("FAILED: " + "; ".join(
            f"ledger {r['ledger']}: {r['error']}" for r in failed))
    status = 1 if (failed or under) else 0
    return report, "\n".join(lines), status
