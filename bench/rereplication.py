"""Figure 8: re-replication MB/s while bringing a lost bookie's fragments back
to Qw copies (``pybk_spark.admin.rereplicate``, run in-process).

Two paths, alternating work items in the same run (issue 31): *pull* (the
default: the replacement bookie pulls the fragment from a surviving replica,
bookie to bookie, ``PullEntries``) and *client* (the fallback: this process
reads, verifies and recovery-adds every entry).  ``copy_mb_per_s`` is the
pull path's figure (``rereplication_vs_disk`` divides it by the sustained
disk probe), ``client_copy_mb_per_s`` its peer.

Setup: on the 3-bookie cluster, the ledgers of the earlier figures are deleted
(metadata only: the audit then sees only this figure's data), ``ledgers`` CLOSED E=3 Qw=3 Qa=2 ledgers of
1 KiB entries are written (every ledger's ensemble is bookie-0..2, so the lost
slot holds every entry); a 4th bookie is added as the replacement; then one
ensemble bookie is SIGKILLed (a lost disk).  Timed: ``run_audit`` with that
bookie named lost (the planner picks the 4th bookie) and ``copy_fragment`` of
every work item, sequentially: reads from the surviving replicas, digest
checks, recovery adds to the replacement (each batch fdatasync'd), CAS of the
fragment's ensemble.  Figures: MB of payload+row bytes copied per second of
copying (``copy_mb_per_s``, from the copier's own rows) and including the
audit (``total_mb_per_s``); afterwards ``verify_ledger`` must find every
ledger fully replicated.

If the re-replication module is not importable, the figure is null with the
reason (the harness still runs).
"""
from __future__ import annotations

import time

from bench.client_append import payloads
from bench.cpu import CpuMeter, cluster_pids
from pybk_spark.ledger.client import BookKeeper


def measure(cluster, quick: bool) -> dict:
    try:
        from pybk_spark.admin import rereplicate as rr
    except Exception as exc:  # noqa: BLE001 - missing component: figure is null
        return {"available": False, "reason": f"pybk_spark.admin.rereplicate: {exc}"}
    n_ledgers, per_ledger = (2, 2_000) if quick else (4, 50_000)
    uri = cluster.metadata_uri
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
        rows, secs = [], {"pull": 0.0, "client": 0.0}
        cpu: dict[str, dict] = {"pull": {}, "client": {}}
        pids = cluster_pids(cluster)
        for i, w in enumerate(res.work):
            path = "client" if i % 2 == 0 else "pull"
            t1 = time.perf_counter()
            with CpuMeter(pids) as meter:
                rows.append(rr.copy_fragment(bk, w, pull=path == "pull"))
            secs[path] += time.perf_counter() - t1
            for kind, used in meter.used.items():
                cpu[path][kind] = cpu[path].get(kind, 0.0) + used
            if rows[-1].get("path") not in (None, path):
                rows[-1].update(outcome="failed", error=f"path {rows[-1].get('path')}, not {path}: "
                                f"{rows[-1].get('pull_error')}")
        total = time.perf_counter() - t0
        copy_s = total - t_audit
        summary = rr.copy_summary(rows, copy_s)
        by_path = {p: sum(r["bytes"] for r in rows if r.get("path") == p) for p in secs}
        failed = [r for r in rows if r["outcome"] != "replicated"]
        under = [u for lid in ids for u in rr.verify_ledger(bk, lid)]
    out = {"available": True, "lost_bookie": lost, "ledgers": n_ledgers,
           "entries_per_ledger": per_ledger, "fragments": len(rows),
           "bytes": summary["bytes"], "audit_s": t_audit, "copy_s": copy_s,
           "path": "pull",
           "copy_mb_per_s": by_path["pull"] / 1e6 / secs["pull"] if secs["pull"] > 0 else None,
           "client_copy_mb_per_s": (by_path["client"] / 1e6 / secs["client"]
                                    if secs["client"] > 0 else None),
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
