"""``jobs/offload.py``: a log's offload with one Spark task per segment.
Each task stages, verifies and publishes its segment (logs/offload.py,
steps 1-2) with its own client; the driver then commits them in log
order, one CAS each, and deletes the ledgers whose grace period is over.
The driver cleans orphan files first, as ``pybk offload`` does."""
from __future__ import annotations

import functools
import time
from typing import Any, Optional, Sequence

from pybk_spark.admin.operations.orchestrate import ClientTarget, Mapper, _client, client_target
from pybk_spark.ledger.port import LedgerClient
from pybk_spark.logs import offload
from pybk_spark.logs.log import list_logs, read_log
from pybk_spark.logs.offload_conf import OffloadSettings
from pybk_spark.protocol import offload as decide


def stage_task(target: ClientTarget, password: Optional[bytes], location: str, row_group_bytes: int,
               item: tuple[str, int]) -> Optional[offload.Staged]:
    """Steps 1-2 of one segment; None when another run committed it first."""
    name, ledger_id = item
    with _client(target) as bk:
        staged = offload.stage_segment(bk, name, ledger_id, location, password=password or b"",
                                       row_group_bytes=row_group_bytes)
        offload.verify_staged(staged)
        return staged if offload.publish_staged(bk, staged) else None


def run_offload(bk: LedgerClient, metadata_uri: str, mapper: Mapper, settings: OffloadSettings,
                logs: Sequence[str] = (), password: Optional[bytes] = None,
                log_policy_first: bool = True) -> tuple[dict[str, Any], str, int]:
    """(report, text, exit status) of offloading ``logs`` (default: every log),
    each by its own policy when it records one and ``log_policy_first``."""
    policy = settings.policy()
    names = list(logs) or list_logs(bk.metadata_store)
    reports = {n: offload.OffloadReport(n, settings.location) for n in names}
    items = []
    for name in names:
        reports[name].orphans_removed = offload.clean_orphans(
            bk, name, settings.location, policy.orphan_age_s)
        md = read_log(bk.metadata_store, name)[0]
        own = decide.log_policy(md, policy) if log_policy_first else None
        if own is not None:
            reports[name].policy = "log"
        items += [(name, i) for i in decide.candidates(md, own or policy, int(time.time() * 1e6))]
    staged = mapper(functools.partial(stage_task, client_target(bk, metadata_uri), password,
                                      settings.location, settings.row_group_bytes),
                    items, "offload segments")
    for (name, ledger_id), done in zip(items, staged):
        if done is None:
            reports[name].skipped.append(ledger_id)
            continue
        record = offload.commit_staged(bk, done)
        reports[name].offloaded.append(ledger_id)
        reports[name].bytes += record.size
        reports[name].rows += record.rows
    for name in names:
        reports[name].ledgers_deleted = offload.delete_offloaded_ledgers(bk, name, policy.grace_s)
    out = {"logs": [r.to_dict() for r in reports.values()]}
    text = "\n".join(f"log {r.log}: offloaded {len(r.offloaded)} segments ({r.rows} rows, "
                     f"{r.bytes} bytes); deleted {len(r.ledgers_deleted)} ledgers; removed "
                     f"{len(r.orphans_removed)} orphan files" for r in reports.values())
    return out, text or "(no logs)", 0
