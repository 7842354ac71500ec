"""``pybk autorecovery``: the periodic auditor + replication worker daemon.

Theory of operation
-------------------
BookKeeper runs an Auditor (elected among the AutoRecovery processes) that
notices lost bookies and has ReplicationWorkers copy their fragments.  Here
one loop does both, and any number of copies may run for availability:

* Election: a round runs only in the process holding ``audit/leader`` (a key
  created with put-if-absent under a TTL lease, refreshed every round).  A
  round whose refresh etcd does not answer is skipped with the lease kept
  (unknown is not lost); a lease found gone is revoked before a new one is
  asked for, so no keep-alive holds a stale key.  If
  the leader dies, its lease expires and another process takes over; two
  leaders can only coexist for less than one TTL, and that is harmless because
  every step below is itself CAS-guarded (a re-replication CAS re-checks the
  fragment, a recovery fences first).
* A round = ``orchestrate.run_rereplicate`` with ``lost_bookie_delay``
  (lostBookieRecoveryDelay) and ``grace`` (openLedgerRereplicationGracePeriod),
  and the repair of bookies' damage markers (``damage_repair``: entries a
  bookie lost to media damage are copied back onto it), optionally followed
  by ``run_recover`` of ledgers whose writer lease is gone
  and that were idle ``recover_idle`` seconds (``--recover-abandoned``).
  Every ``verify_every``-th round also reads which ids each bookie holds in
  every complete fragment and fills in copies live bookies lack (BookKeeper's
  periodic ledger check).  A round's row counts the fragments copied and
  failed, the failures by reason too (``failed_by_reason``: error class
  name -> copies, ``rereplicate.failure_reasons``), and each ledger it could
  not repair with why (``failed_ledgers``: its error names the ensemble and
  the bookies that could not take a copy, each with its reason;
  ``rereplicate.failed_ledgers``).
* Operator switches (``metadata/audit_control.py``) are read every round: a
  round while ``audit/config`` says disabled only keeps the leadership and
  reports ``disabled``; a ``lost_bookie_recovery_delay_s`` stored there
  overrides ``lost_bookie_delay``.  Between rounds the wait is cut into
  ``trigger_poll_s`` slices; a new version of ``audit/trigger`` (``pybk
  triggeraudit``) starts the next round at once.
* Log retention (``protocol/log_retention.py``): every enabled round also
  applies the retention of every log that has limits, so a log nobody
  writes to any more still loses its expired segments (its writers apply
  retention too, as they roll or commit).  Kafka's log cleaner does this
  for a topic; here each log is one CAS that re-decides, then the ledger
  deletion (``logs/truncation.py``).  A log that fails is counted in
  the row (``retention_failed``) and retried next round.
* Offload (admin/operations/auto_offload.py): with offload settings
  (``offload``, ``pybk autorecovery --offload-conf``), every enabled round
  also applies the offload policy to every log, after retention: the
  segments it picks go to Parquet files at the settings' location, and the
  ledgers whose grace period is over leave the bookies.  The row counts
  them (``offload_segments``, ``offload_bytes``,
  ``offload_ledgers_deleted``, ``offload_failed``), and so do the
  Prometheus metrics in ``offload_metrics``.
* A failed round is logged and retried next round; the loop never dies of a
  metadata or bookie error.  ``stop`` (SIGTERM/SIGINT) ends it between rounds
  and releases the leadership.

Time is injected (``clock``, ``wait``, and ``wall_clock`` for retention) so
tests drive rounds directly.
"""
from __future__ import annotations

import json
import logging
import os
import socket
import time
from dataclasses import dataclass
from typing import Callable, Optional

from pybk_spark import errors
from pybk_spark.admin.operations import orchestrate as orch
from pybk_spark.admin.operations.auto_offload import OffloadMetrics, apply_offload
from pybk_spark.admin.operations import rereplicate as rr
from pybk_spark.ledger.port import LedgerClient
from pybk_spark.logs.log import list_logs, read_log
from pybk_spark.logs.offload_conf import OffloadSettings
from pybk_spark.logs.truncation import retain
from pybk_spark.metadata import audit_control as ctl
from pybk_spark.metadata.store import Lease

LEADER_KEY = ctl.LEADER_KEY
LEADER, STANDBY, UNKNOWN = "leader", "standby", "unknown"
_log = logging.getLogger("pybk_spark.autorecovery")


@dataclass
class AutoRecoveryConfig:
    interval_s: float = 60.0
    lost_bookie_delay_s: float = 0.0
    grace_s: float = 30.0
    leader_ttl_s: int = 15
    recover_abandoned: bool = False
    recover_idle_s: float = 300.0
    verify_every: int = 0          # every Nth round also checks all ledgers (0: never)
    password: Optional[bytes] = None
    trigger_poll_s: float = 1.0    # how often a waiting leader looks at audit/trigger
    parallel: int = orch.DEFAULT_PARALLEL   # fragments copied (ledgers recovered) at once
    offload: Optional[OffloadSettings] = None   # set: each round applies the offload policy


class AutoRecovery:
    def __init__(self, bk: LedgerClient, metadata_uri: str, conf: AutoRecoveryConfig, *,
                 mapper: orch.Mapper | None = None, identity: str | None = None,
                 clock: Callable[[], float] = time.monotonic,
                 wall_clock: Callable[[], float] = time.time) -> None:
        self.bk = bk
        self.wall_clock = wall_clock
        self.uri = metadata_uri
        self.conf = conf
        self.mapper = mapper or orch.local_mapper(progress=False, parallel=conf.parallel)
        self.identity = identity or f"{socket.gethostname()}:{os.getpid()}"
        self.clock = clock
        self._lease: Optional[Lease] = None
        self._rounds = 0
        self._trigger_seen: Optional[int] = None
        self.offload_metrics = OffloadMetrics()

    # -- leadership -------------------------------------------------------------------
    def is_leader(self) -> bool:
        """Take or keep the leadership; False if another process holds it, or
        if etcd did not answer whether we still do."""
        return self._leadership()[0] == LEADER

    def _leadership(self) -> tuple[str, str]:
        """(LEADER | STANDBY | UNKNOWN, why).  UNKNOWN: etcd did not answer
        the refresh; the lease is kept, as it may well be alive, and the next
        round's refresh tells.  A lease given up is revoked, or at least no
        longer kept alive: its keep-alive thread would otherwise hold
        ``audit/leader`` for this process for good, which would then stand by
        behind its own key, and so would every other process (no round at
        all until a restart)."""
        store = self.bk.metadata_store
        if self._lease is not None:
            try:
                self._lease.refresh()
                cur = store.get(LEADER_KEY)
            except errors.MetadataUnavailable as exc:
                _log.warning("event=leadership_unknown error=%r (not leading this round; "
                             "the lease is kept and checked again next round)", exc)
                return UNKNOWN, f"{type(exc).__name__}: {exc}"
            except errors.BKError:
                cur = None                     # the lease expired
            if cur is not None and json.loads(cur.value).get("id") == self.identity:
                return LEADER, ""
            self.resign()                      # lost it: let the lease go
        lease = store.grant_lease(self.conf.leader_ttl_s)
        try:
            store.put_if_absent(LEADER_KEY, json.dumps({"id": self.identity}).encode(), lease)
        except errors.MetadataVersion:
            lease.revoke()
            return STANDBY, ""
        self._lease = lease
        return LEADER, ""

    def resign(self) -> None:
        """Give the leadership up: revoke the lease (its keep-alive stops even
        when etcd does not answer the revoke; the lease then ends by ttl)."""
        lease, self._lease = self._lease, None
        if lease is not None:
            try:
                lease.revoke()
            except errors.BKError:
                pass

    # -- rounds -------------------------------------------------------------------------
    def run_round(self) -> dict:
        """One audit + repair round if leader.  Never raises a BKError."""
        t0 = self.clock()
        try:
            state, why = self._leadership()
            if state != LEADER:
                self._trigger_seen = None
                return ({"leader": False, "leadership": UNKNOWN, "error": why, "status": 1}
                        if state == UNKNOWN else {"leader": False})
            self._trigger_seen = ctl.trigger_version(self.bk.metadata_store)
            switches = ctl.read_config(self.bk.metadata_store)
            if not switches["enabled"]:
                return {"leader": True, "disabled": True, "status": 0,
                        "seconds": round(self.clock() - t0, 3)}
            delay = switches["lost_bookie_recovery_delay_s"]
            delay = self.conf.lost_bookie_delay_s if delay is None else float(delay)
            self._rounds += 1
            verify = bool(self.conf.verify_every) and self._rounds % self.conf.verify_every == 0
            report, _text, status = orch.run_rereplicate(
                self.bk, self.uri, self.mapper, delay_s=delay,
                grace_s=self.conf.grace_s, verify=verify, password=self.conf.password,
                clock=self.clock)
            out = {"leader": True, "lost": report["lost"],
                   "fragments_copied": sum(1 for c in report["copies"]
                                           if c["outcome"] == "replicated"),
                   "fragments_failed": sum(1 for c in report["copies"] if c["outcome"] == "failed"),
                   "failed_by_reason": rr.failure_reasons(report["copies"]),
                   "failed_ledgers": rr.failed_ledgers(report["copies"]),
                   "open_ledgers_fenced": len(report["fenced"]),
                   "deferred": len(report["deferred"]),
                   "damaged_repaired": sum(1 for r in report["damaged"]
                                           if r["outcome"] == "repaired"),
                   "lost_bookie_delay_s": delay, "status": status}
            out["damaged_entries_copied"] = report["entries_copied"]["damaged"]
            if verify:
                out["under_replicated"] = len(report["under_replicated"])
                out["verify_entries_copied"] = report["entries_copied"]["verify"]
            out["retention_dropped_ledgers"], out["retention_failed"] = self._apply_retention()
            if self.conf.offload is not None:
                out.update(apply_offload(self.bk, self.conf.offload, self.offload_metrics,
                                         password=self.conf.password,
                                         wall_clock=self.wall_clock))
            if self.conf.recover_abandoned:
                rec_report, _t, rec_status = orch.run_recover(
                    self.bk, self.uri, self.mapper, min_idle_s=self.conf.recover_idle_s,
                    password=self.conf.password)
                out["recovered"] = [r["ledger"] for r in rec_report["ledgers"]
                                    if r["outcome"] == "recovered"]
                out["status"] = max(status, rec_status)
        except errors.BKError as exc:
            out = {"leader": self._lease is not None, "error": f"{type(exc).__name__}: {exc}",
                   "status": 1}
        out["seconds"] = round(self.clock() - t0, 3)
        return out

    def _apply_retention(self) -> tuple[int, int]:
        """(ledgers dropped, logs that failed) over every log with limits."""
        store = self.bk.metadata_store
        dropped = failed = 0
        for name in list_logs(store):
            try:
                md = read_log(store, name)[0]
            except errors.BKError as exc:
                failed += 1
                _log.warning("event=log_retention_failed log=%s error=%r retry='in the next round'",
                             name, exc)
                continue
            got = retain(self.bk, name, self.wall_clock, md, retry="in the next round")
            if got is None:
                failed += 1
            else:
                dropped += len(got)
        return dropped, failed

    def run_forever(self, wait: Callable[[float], bool], emit: Callable[[dict], None],
                    rounds: int | None = None) -> None:
        """Rounds every ``interval_s`` until ``wait(timeout)`` returns True
        (the stop event) or ``rounds`` were run."""
        done = 0
        try:
            while rounds is None or done < rounds:
                emit(self.run_round())
                done += 1
                if rounds is not None and done >= rounds:
                    break
                if self._wait_round(wait):
                    break
        finally:
            self.resign()

    def _wait_round(self, wait: Callable[[float], bool]) -> bool:
        """Wait ``interval_s``, cut short by a ``triggeraudit``; True = stop."""
        deadline = self.clock() + self.conf.interval_s
        while True:
            remaining = deadline - self.clock()
            if remaining <= 0:
                return False
            if wait(min(remaining, self.conf.trigger_poll_s)):
                return True
            if self._triggered():
                return False

    def _triggered(self) -> bool:
        if self._trigger_seen is None:        # not the leader: wait the interval
            return False
        try:
            return ctl.trigger_version(self.bk.metadata_store) != self._trigger_seen
        except errors.BKError:
            return False
