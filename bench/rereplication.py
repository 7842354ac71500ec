"""Figure 8: re-replication MB/s while bringing a lost bookie's fragments back
to Qw copies (``pybk_spark.admin.operations.rereplicate``, run in-process).

Three groups of work items in the same run, each timed on its own, each
with its CPU-seconds per GB by process kind:

* *pull* (the figure, ``copy_mb_per_s``): the replacement bookie pulls the
  fragment from a surviving replica, bookie to bookie (``PullEntries``),
  ``orchestrate.DEFAULT_PARALLEL`` fragments at once through
  ``orchestrate.local_mapper``, as ``pybk rereplicate`` and ``pybk
  autorecovery`` run them (the Spark job runs its tasks at once too);
  ``rereplication_vs_disk`` divides it by the disk's overwrite probe;
* *pull, one at a time* (``pull_sequential_mb_per_s``): the same path, one
  fragment after another: what the concurrency buys;
* *client* (``client_copy_mb_per_s``): the fallback, this process reads,
  verifies and recovery-adds every entry, with the same concurrency.

Setup: on the 3-bookie cluster, the ledgers of the earlier figures are
deleted (metadata only: the audit then sees only this figure's data),
``ledgers`` CLOSED E=3 Qw=3 Qa=2 ledgers of 1 KiB entries are written (4
for the client path, 4 for the sequential pull, 12 for the timed pull; every
ledger's ensemble is bookie-0..2, so the lost slot holds every entry); a 4th
bookie is added as the replacement; then one ensemble bookie is SIGKILLed (a
lost disk).  Timed: ``run_audit`` with that bookie named lost (the planner
picks the 4th bookie) and ``copy_fragment`` of every work item: copy, digest
checks, journaling on the replacement (each batch fdatasync'd), CAS of the
fragment's ensemble.  Figures: MB of payload+row bytes copied per second of
copying, from the copier's own rows, and including the audit
(``total_mb_per_s``); afterwards ``verify_ledger`` must find every ledger
fully replicated.

If the re-replication module is not importable, the figure is null with the
reason (the harness still runs).
"""
from __future__ import annotations

import time
from typing import Callable, Optional

from bench.client_append import payloads
from bench.cpu import CpuMeter, cluster_pids
from pybk_spark.ledger.client import BookKeeper


def measure(cluster, quick: bool, floor: Optional[Callable[[str], object]] = None) -> dict:
    """``floor``: called with "setup" before the ledgers are written, then
    with "before" and "after" right around the timed pull group (its peer,
    the bare copy of bench/copy_floor.py, then reads bytes as old as the
    pull's and meets the disk and the machine as the pull does; a big copy
    slows whatever writes next here, so the peer is the mean of the two)."""
    try:
        from pybk_spark.admin.operations import rereplicate as rr
    except Exception as exc:  # noqa: BLE001 - missing component: figure is null
        return {"available": False, "reason": f"pybk_spark.admin.operations.rereplicate: {exc}"}
    from pybk_spark.admin.operations import orchestrate as orch
    # (path, pull?, fragments at once, ledgers): the timed pull copies 12
    # fragments (640 MB, about a second, as long as its floor's copy); at 4
    # (213 MB, a third of a second) the figure swung by half from run to run
    groups: list[tuple[str, bool, int, int]] = [
        ("client", False, orch.DEFAULT_PARALLEL, 4), ("pull_sequential", True, 1, 4),
        ("pull", True, orch.DEFAULT_PARALLEL, 12)]
    if quick:
        groups = [(path, pull, par, 1) for path, pull, par, _n in groups]
    per_ledger = 2_000 if quick else 50_000
    n_ledgers = sum(g[3] for g in groups)
    uri = cluster.metadata_uri
    if floor is not None:
        floor("setup")
    with BookKeeper(uri) as bk:
        for lid in bk.list_ledgers():        # only this figure's ledgers are audited
            bk.delete_ledger(lid)
        ids = []
        data = payloads(per_ledger)
        for _ in range(n_ledgers):
            lh = bk.create_ledger(3, 3, 2)
            lh.add_entries(data)
            lh.close()
            ids.append(lh.ledger_id)
        ensemble = bk.get_ledger_metadata(ids[0]).current_ensemble
    lost = ensemble[0]
    cluster.add_bookie()
    cluster.kill_bookie(lost)
    with BookKeeper(uri) as bk:
        t0 = time.perf_counter()
        res = rr.run_audit(bk, named=[lost])
        t_audit = time.perf_counter() - t0
        rows: list[dict] = []
        secs: dict[str, float] = {}
        cpu: dict[str, dict] = {}
        by_path: dict[str, int] = {}
        pids = cluster_pids(cluster)
        start = 0
        for path, pull, parallel, n in groups:      # each group its run of ``ids``
            mine, start = set(ids[start:start + n]), start + n
            work = [w for w in res.work if w.ledger_id in mine]
            mapper = orch.local_mapper(progress=False, parallel=parallel)
            if path == "pull" and floor is not None:
                floor("before")
            t1 = time.perf_counter()
            with CpuMeter(pids) as meter:
                got = mapper(lambda w, pull=pull: rr.copy_fragment(bk, w, pull=pull), work, path)
            secs[path] = time.perf_counter() - t1
            if path == "pull" and floor is not None:
                floor("after")
            cpu[path] = dict(meter.used)
            want = "pull" if pull else "client"
            for row in got:
                if row.get("path") not in (None, want):
                    row.update(outcome="failed", error=f"path {row.get('path')}, not {want}: "
                               f"{row.get('pull_error')}")
            by_path[path] = sum(r["bytes"] for r in got)
            rows += got
        total = time.perf_counter() - t0
        copy_s = total - t_audit
        summary = rr.copy_summary(rows, copy_s)
        failed = [r for r in rows if r["outcome"] != "replicated"]
        under = [u for lid in ids for u in rr.verify_ledger(bk, lid)]
    out = {"available": True, "lost_bookie": lost, "ledgers": n_ledgers,
           "entries_per_ledger": per_ledger, "fragments": len(rows),
           "bytes": summary["bytes"], "audit_s": t_audit, "copy_s": copy_s,
           "path": "pull",
           "parallel": orch.DEFAULT_PARALLEL,
           "copy_mb_per_s": _rate(by_path, secs, "pull"),
           "pull_sequential_mb_per_s": _rate(by_path, secs, "pull_sequential"),
           "client_copy_mb_per_s": _rate(by_path, secs, "client"),
           "seconds_by_path": secs, "bytes_by_path": by_path,
           # CPU-seconds per GB copied, by process kind (client = this process)
           "cpu_s_per_gb_by_path": {p: {k: v / (by_path[p] / 1e9) for k, v in c.items()}
                                    for p, c in cpu.items() if by_path[p]},
           "total_mb_per_s": summary["bytes"] / 1e6 / total if total > 0 else None,
           "failed": [f"{r['ledger']}:{r['fragment']} {r['error']}" for r in failed][:5],
           "under_replicated_after": len(under)}
    if failed or under or not rows:
        out["available"] = False
        out["reason"] = (f"{len(failed)} fragment copies failed, {len(under)} under-replicated "
                         f"after, {len(rows)} work items")
    return out


def _rate(nbytes: dict, secs: dict, path: str) -> float | None:
    return nbytes[path] / 1e6 / secs[path] if secs.get(path) else None
