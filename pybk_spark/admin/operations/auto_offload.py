"""The offload policy as part of an autorecovery round: every log's closed
segments that its own policy picks (``pybk offload LOG --set-policy``), or
the configured policy for a log that records none, go to Parquet files, and the
ledgers whose grace period is over leave the bookies (logs/offload.py does
each log).  A log that fails is counted, logged and retried next round;
what it committed before the failure stays.  A daemon given no password
that runs as an operator (``operator = true``, an identity in the bookies'
``tls_operator_identities``) learns the key of each ledger it offloads from
the ledger's bookies (recover.py, ``learn_key``), so logs written under
different passwords are offloaded alike.

``OffloadMetrics`` counts it for Prometheus (its own registry, served by
``pybk autorecovery --metrics-port``): segments and bytes offloaded,
ledgers deleted, failed logs, the wall-clock time of the last run, and the
lag: after each run, the segments the policies pick that are still only on
bookies (a failing log's, or those a run could not finish) and the age of
the oldest one's last entry.  A lag that grows from round to round is an
offloader that cannot keep up or keeps failing.
"""
from __future__ import annotations

import logging
import time
from typing import Callable, Optional

from prometheus_client import CollectorRegistry, Counter, Gauge

from pybk_spark import errors
from pybk_spark.admin.operations.recover import learn_key
from pybk_spark.ledger.port import LedgerClient
from pybk_spark.logs.log import list_logs, read_log
from pybk_spark.logs.offload import offload_log
from pybk_spark.logs.offload_conf import OffloadSettings
from pybk_spark.protocol import ledger_metadata as lm
from pybk_spark.protocol.offload import OffloadPolicy, candidates, policy_for, segment_of

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
        self.lag_segments = Gauge("pybk_offload_lag_segments",
                                  "segments the policies pick that are still only on "
                                  "bookies after the last run", registry=r)
        self.lag_seconds = Gauge("pybk_offload_lag_seconds",
                                 "age of the oldest such segment's last entry after the "
                                 "last run (0 when none)", registry=r)


def apply_offload(bk: LedgerClient, settings: OffloadSettings, metrics: OffloadMetrics, *,
                  password: Optional[bytes] = None,
                  wall_clock: Callable[[], float] = time.time) -> dict[str, int]:
    """One offload run over every log (each by its own policy when it records
    one, else ``settings``'); the round's counts."""
    out = {"offload_segments": 0, "offload_bytes": 0, "offload_ledgers_deleted": 0,
           "offload_failed": 0}
    policy = settings.policy()
    lag_segments, oldest_us = 0, None
    for name in list_logs(bk.metadata_store):
        try:
            keys = [password] if password is not None else _learned_keys(bk, name, policy,
                                                                         wall_clock)
            report = offload_log(bk, name, settings.location, policy,
                                 password=keys[0] if keys else b"", other_passwords=keys[1:],
                                 row_group_bytes=settings.row_group_bytes,
                                 wall_clock=wall_clock)
        except errors.BKError as exc:
            out["offload_failed"] += 1
            metrics.failures.inc()
            _log.warning("event=offload_failed log=%s location=%s error=%r "
                         "retry='in the next round'", name, settings.location, exc)
        else:
            out["offload_segments"] += len(report.offloaded)
            out["offload_bytes"] += report.bytes
            out["offload_ledgers_deleted"] += len(report.ledgers_deleted)
            metrics.segments.inc(len(report.offloaded))
            metrics.bytes.inc(report.bytes)
            metrics.ledgers_deleted.inc(len(report.ledgers_deleted))
        left, oldest = _lag(bk, name, policy, wall_clock)
        lag_segments += left
        if oldest is not None and (oldest_us is None or oldest < oldest_us):
            oldest_us = oldest
    now = wall_clock()
    metrics.last_run.set(now)
    metrics.lag_segments.set(lag_segments)
    metrics.lag_seconds.set(0.0 if oldest_us is None else max(0.0, now - oldest_us / 1e6))
    out["offload_lag_segments"] = lag_segments
    return out


def _learned_keys(bk: LedgerClient, name: str, policy: OffloadPolicy,
                  wall_clock: Callable[[], float]) -> list[bytes]:
    """An operator's keys for the ledgers of ``name`` its policy picks, as
    their bookies recorded them (none for a client that is no operator)."""
    if not getattr(bk.conf, "operator", False):
        return []
    md = read_log(bk.metadata_store, name)[0]
    keys: list[bytes] = []
    for ledger_id in candidates(md, policy_for(md, policy), int(wall_clock() * 1e6)):
        try:
            key = learn_key(bk, bk.get_ledger_metadata(ledger_id))
        except errors.NoSuchLedger:
            continue
        if key and key not in keys:
            keys.append(lm.MasterKey(key))
    return keys


def _lag(bk: LedgerClient, name: str, policy: OffloadPolicy,
         wall_clock: Callable[[], float]) -> tuple[int, Optional[int]]:
    """(segments of the log its policy picks now, the oldest one's last
    entry time in microseconds); (0, None) when the log is gone or its
    metadata cannot be read (the run's own failure is counted already)."""
    try:
        md = read_log(bk.metadata_store, name)[0]
        picked = candidates(md, policy_for(md, policy), int(wall_clock() * 1e6))
    except errors.BKError:
        return 0, None
    times = [seg.last_time_us for seg in (segment_of(md, lid) for lid in picked)
             if seg is not None and seg.last_time_us >= 0]
    return len(picked), (min(times) if times else None)
