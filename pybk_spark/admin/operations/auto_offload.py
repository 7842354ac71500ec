"""The offload policy as part of an autorecovery round: every log's closed
segments that its own policy picks (``pybk offload LOG --set-policy``), or
the configured policy for a log that records none, go to Parquet files, and the
ledgers whose grace period is over leave the bookies (logs/offload.py does
each log).  A log that fails is counted, logged and retried next round;
what it committed before the failure stays.

``OffloadMetrics`` counts it for Prometheus (its own registry, served by
``pybk autorecovery --metrics-port``): segments and bytes offloaded,
ledgers deleted, failed logs, and the wall-clock time of the last run.
"""
from __future__ import annotations

import logging
import time
from typing import Callable, Optional

from prometheus_client import CollectorRegistry, Counter, Gauge

from pybk_spark import errors
from pybk_spark.ledger.port import LedgerClient
from pybk_spark.logs.log import list_logs
from pybk_spark.logs.offload import offload_log
from pybk_spark.logs.offload_conf import OffloadSettings

_log = logging.getLogger("pybk_spark.autorecovery")


class OffloadMetrics:
    def __init__(self, registry: Optional[CollectorRegistry] = None) -> None:
        r = self.registry = registry or CollectorRegistry()
        self.segments = Counter("pybk_offload_segments", "segments offloaded", registry=r)
        self.bytes = Counter("pybk_offload_bytes", "bytes of Parquet files committed",
                             registry=r)
        self.ledgers_deleted = Counter("pybk_offload_ledgers_deleted",
                                       "offloaded ledgers deleted from the bookies", registry=r)
        self.failures = Counter("pybk_offload_failures", "logs whose offload run failed",
                                registry=r)
        self.last_run = Gauge("pybk_offload_last_run_timestamp_seconds",
                              "wall-clock time the last offload run ended", registry=r)


def apply_offload(bk: LedgerClient, settings: OffloadSettings, metrics: OffloadMetrics, *,
                  password: Optional[bytes] = None,
                  wall_clock: Callable[[], float] = time.time) -> dict[str, int]:
    """One offload run over every log (each by its own policy when it records
    one, else ``settings``'); the round's counts."""
    out = {"offload_segments": 0, "offload_bytes": 0, "offload_ledgers_deleted": 0,
           "offload_failed": 0}
    policy = settings.policy()
    for name in list_logs(bk.metadata_store):
        try:
            report = offload_log(bk, name, settings.location, policy, password=password or b"",
                                 row_group_bytes=settings.row_group_bytes,
                                 wall_clock=wall_clock)
        except errors.BKError as exc:
            out["offload_failed"] += 1
            metrics.failures.inc()
            _log.warning("event=offload_failed log=%s location=%s error=%r "
                         "retry='in the next round'", name, settings.location, exc)
            continue
        out["offload_segments"] += len(report.offloaded)
        out["offload_bytes"] += report.bytes
        out["offload_ledgers_deleted"] += len(report.ledgers_deleted)
        metrics.segments.inc(len(report.offloaded))
        metrics.bytes.inc(report.bytes)
        metrics.ledgers_deleted.inc(len(report.ledgers_deleted))
    metrics.last_run.set(wall_clock())
    return out
