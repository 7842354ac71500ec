"""Network partitions in the chaos harness (tests/chaos/link_nemesis.py), on
separate test hosts: 3 etcd members, 5 bookies and every worker on its own
network namespace (host_topology.py).  Skips, naming what is missing, where
test hosts or iptables are unavailable.

* A short seeded run with only link faults (partitions of every shape,
  one-way drops, loss, a writer stalled past its lease, relay delay /
  jitter / reordering / held-bytes stall (tcp_relay.py); netem where the
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
  the checker must report acknowledged entries beyond the close (I1).  There
  is no control run for this plant: a fresh CI run saw the recoverer race a
  live writer's first adds without any partition (recovery right after the
  create, LAC -1 from unfenced bookies), so the plant is not partition-only.

* The second planted bug: the ledger writers run with ``faulty_client``'s
  ``reuse_id_on_timeout`` (an add that timed out is taken as failed and its
  ids are reused for the next payloads).  The nemesis drops a bookie's
  replies to a writer or partitions a writer from 1-2 bookies for 2-10 s,
  longer than the 5 s add timeout now and then; the checker must report an
  acknowledged entry missing or replaced in its closed ledger (I1).  The
  control, same seed with process faults that never time an add out
  (bookie kill: the connection is refused; writer kill; etcd restart), stays
  clean.  (A bookie paused past the add timeout would expose it too: a
  pause is a partition seen from the writer.)

* Auto-recovery under bookie <-> etcd partitions: an ``autorecovery``
  worker (the ``pybk autorecovery`` loop, its own host, no lost-bookie
  delay) re-replicates a bookie whose 5 s registration lapsed while the
  bookie still serves its clients; with writers, logs and the recoverer
  running, nothing acked is lost or doubled (I1, I5), and after the final
  re-replication every entry has Qw replicas (I6).  The short link-fault run
  above runs one autorecovery worker too.

Replay: PYBK_CHAOS_SEED / CHAOS_SECONDS, or ``make chaos TOPOLOGY=hosts
FAULTS=partition,one_way,loss,stall SEED=<seed>``.
"""
from __future__ import annotations

import os

import pytest

from pybk_spark.testing.fixtures import bookie_server_available

from .runner import run

pytestmark = pytest.mark.slow

LINK_KINDS = ["partition", "one_way", "loss", "stall", "delay", "netem"]
# The recoverer carries the plant and recovers only ledgers whose writer lease
# is gone; ledger writers hold a ledger open for seconds (a pause after each
# add) with a 3 s lease, so a writer cut off from etcd outlives its lease while
# it is still adding: the zombie.
PLANTED = {"recoverer": ["--plant", "unfenced_recovery", "--fence-live", "0"],
           "ledger-writer": ["--add-pause", "0.2", "--lease-ttl", "3"]}
PLANT_RUN = {"ledger_writers": 2, "logs": 0, "rereplicate": False}   # every writer a zombie-to-be
PLANT_SEEDS = (11, 12)       # the second only if the first run misses (timing on 2 cores)
PLANT_SECONDS = 60.0
# Second plant: the ledger writers reuse ids after a timed-out add; long-lived
# ledgers (a pause after each add) so a cut of > 5 s lands inside one.
REUSE = {"ledger-writer": ["--plant", "reuse_id_on_timeout", "--add-pause", "0.1"],
         "recoverer": ["--fence-live", "0"]}
REUSE_RUN = {"ledger_writers": 2, "logs": 0, "rereplicate": False}
REUSE_SEEDS = (7, 8)
REUSE_SECONDS = 60.0
REUSE_LINK = ["one_way", "partition:writer-bookies"]
REUSE_CONTROL = ["bookie_kill", "writer_kill", "etcd_restart"]


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


def _caught(tmp_path, seeds, kinds, invariant: str = "[I1]", **kw):
    """Run the planted bug under ``kinds`` with each seed in turn until the
    checker reports ``invariant``; fail naming every seed if none does.  A
    plant's window depends on timing, so a loaded machine may need a second
    seed; a bug the nemesis cannot expose at all fails both."""
    tails = []
    for seed in seeds:
        workdir = tmp_path / f"seed-{seed}"
        workdir.mkdir()
        summary, lines = _run(workdir, PLANT_SECONDS, seed, kinds, **kw)
        assert summary["faults_total"] > 0
        if any(v.startswith(invariant) for v in summary["violations"]):
            return summary
        tails.append(f"seed {seed}: no {invariant}\n" + "\n".join(lines[-30:]))
    pytest.fail("planted bug not caught:\n" + "\n".join(tails))


def test_short_partition_run_finds_no_violation(tmp_path):
    _need_hosts()
    seed = int(os.environ.get("PYBK_CHAOS_SEED", SHORT_SEED))
    duration = float(os.environ.get("CHAOS_SECONDS", "60"))
    summary, lines = _run(tmp_path, duration, seed, LINK_KINDS, autorecoverers=1)
    assert summary["faults_total"] > 0 and set(summary["faults"]) <= set(LINK_KINDS)
    assert not summary["violations"], (
        f"seed {seed}: {len(summary['violations'])} violation(s); replay with "
        f"PYBK_CHAOS_SEED={seed} CHAOS_SECONDS={duration:g} or make chaos TOPOLOGY=hosts "
        f"FAULTS={','.join(LINK_KINDS)} DURATION={duration:g} SEED={seed}\n"
        + "\n".join(lines[-60:]))


def test_partition_nemesis_catches_unfenced_recovery(tmp_path):
    _need_hosts()
    summary = _caught(tmp_path, PLANT_SEEDS, ["partition:writer-etcd"],
                      worker_args=PLANTED, **PLANT_RUN)
    assert summary["faults"].get("partition", 0) > 0


@pytest.mark.long
def test_link_nemesis_catches_reused_ids_after_timeout(tmp_path):
    _need_hosts()
    _caught(tmp_path, REUSE_SEEDS, REUSE_LINK, worker_args=REUSE, **REUSE_RUN)


@pytest.mark.long
def test_reused_ids_are_invisible_without_link_faults(tmp_path):
    _need_hosts()
    summary, lines = _run(tmp_path, REUSE_SECONDS, REUSE_SEEDS[0], REUSE_CONTROL,
                          worker_args=REUSE, **REUSE_RUN)
    assert summary["faults_total"] > 0
    assert not summary["violations"], "\n".join(lines[-60:])


AR_SEED = 5
SHORT_SEED = 2026112403        # PYBK_CHAOS_SEED replaces it
AR_SECONDS = 60.0


def test_autorecovery_during_bookie_etcd_partitions(tmp_path):
    _need_hosts()
    summary, lines = _run(tmp_path, AR_SECONDS, AR_SEED, ["partition:bookie-etcd"],
                          autorecoverers=1)
    tail = "\n".join(lines[-60:])
    assert summary["fault_shapes"].get("partition:bookie-etcd", 0) > 0, tail
    ar = summary["autorecovery"]
    assert ar.get("rounds", 0) > 0 and ar.get("rounds_with_lost", 0) > 0, tail
    assert not summary["violations"], tail
