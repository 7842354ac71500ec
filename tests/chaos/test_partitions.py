"""Network partitions in the chaos harness (tests/chaos/link_nemesis.py), on
separate test hosts: 3 etcd members, 5 bookies and every worker on its own
network namespace (host_topology.py).  Skips, naming what is missing, where
test hosts or iptables are unavailable.

* A short seeded run with only link faults (partitions of every shape,
  one-way drops, loss, a writer stalled past its lease; netem where the
  kernel has it) finds no violation.
* A planted bug only a partition exposes: the recoverer runs with
  ``faulty_client``'s ``unfenced_recovery`` (its recovery reads go out
  without the fence flag) and recovers only ledgers whose writer's lease is
  gone (``--fence-live 0``: no false suspicions); the two ledger writers
  (no log writers) keep a ledger open for seconds with a 3 s lease
  (``--add-pause``, ``--lease-ttl``).
  The nemesis cuts writers
  off from etcd while they still reach their bookies (zombie writers); the
  recoverer closes their ledgers unfenced, the zombies keep getting acks, and
  the checker must report acknowledged entries beyond the close (I1).  The
  control: the same plant under process faults only (bookie kill/pause,
  writer kill, etcd restart) stays clean, since a writer that is dead or
  holds its lease is never recovered by that recoverer.

Replay: PYBK_CHAOS_SEED / CHAOS_SECONDS, or ``make chaos TOPOLOGY=hosts
FAULTS=partition,one_way,loss,stall SEED=<seed>``.
"""
from __future__ import annotations

import os
import random

import pytest

from pybk_spark.testing.fixtures import bookie_server_available

from .runner import run

pytestmark = pytest.mark.slow

LINK_KINDS = ["partition", "one_way", "loss", "stall", "netem"]
# The recoverer carries the plant and recovers only ledgers whose writer lease
# is gone; ledger writers hold a ledger open for seconds (a pause after each
# add) with a 3 s lease, so a writer cut off from etcd outlives its lease while
# it is still adding: the zombie.
PLANTED = {"recoverer": ["--plant", "unfenced_recovery", "--fence-live", "0"],
           "ledger-writer": ["--add-pause", "0.2", "--lease-ttl", "3"]}
PLANT_RUN = {"ledger_writers": 2, "logs": 0, "rereplicate": False}   # every writer a zombie-to-be
PLANT_SEED = 11
PLANT_SECONDS = 60.0


def _need_hosts() -> None:
    if not bookie_server_available():
        pytest.skip("bookie_server not available")
    from .host_topology import unavailable_reason
    reason = unavailable_reason()
    if reason:
        pytest.skip(f"test hosts unavailable: {reason}")


def _run(tmp_path, duration, seed, kinds, **kw):
    lines: list[str] = []
    summary = run(duration, seed, workdir=str(tmp_path / "chaos"), kinds=kinds,
                  topology="hosts", out=lambda m: (lines.append(m), print(m)), **kw)
    assert summary["topology"] == "hosts" and summary["operations"] > 0
    return summary, lines


def test_short_partition_run_finds_no_violation(tmp_path):
    _need_hosts()
    seed = int(os.environ.get("PYBK_CHAOS_SEED", random.SystemRandom().randrange(1 << 31)))
    duration = float(os.environ.get("CHAOS_SECONDS", "60"))
    summary, lines = _run(tmp_path, duration, seed, LINK_KINDS)
    assert summary["faults_total"] > 0 and set(summary["faults"]) <= set(LINK_KINDS)
    assert not summary["violations"], (
        f"seed {seed}: {len(summary['violations'])} violation(s); replay with "
        f"PYBK_CHAOS_SEED={seed} CHAOS_SECONDS={duration:g} or make chaos TOPOLOGY=hosts "
        f"FAULTS={','.join(LINK_KINDS)} DURATION={duration:g} SEED={seed}\n"
        + "\n".join(lines[-60:]))


def test_partition_nemesis_catches_unfenced_recovery(tmp_path):
    _need_hosts()
    summary, lines = _run(tmp_path, PLANT_SECONDS, PLANT_SEED, ["partition:writer-etcd"],
                          worker_args=PLANTED, **PLANT_RUN)
    assert summary["faults"].get("partition", 0) > 0
    assert any(v.startswith("[I1]") for v in summary["violations"]), "\n".join(lines[-60:])


def test_unfenced_recovery_is_invisible_without_partitions(tmp_path):
    _need_hosts()
    summary, lines = _run(tmp_path, PLANT_SECONDS, PLANT_SEED,
                          ["bookie_kill", "bookie_pause", "writer_kill", "etcd_restart"],
                          worker_args=PLANTED, **PLANT_RUN)
    assert summary["faults_total"] > 0
    assert not summary["violations"], "\n".join(lines[-60:])
