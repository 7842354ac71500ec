"""The checker catches a planted bookie bug in real processes.

The bookies run from the test-only entry point ``faulty_bookie.py`` with
the ``ack_before_fsync`` fault: the journal's injected pwritev (a test seam;
production code has no fault switch) writes nothing, so the journal
acknowledges a group without writing it: acks precede durability, data
reaches disk only at the next checkpoint.  (A pure
"skip fdatasync" would be invisible to a SIGKILL test: the page cache
survives a process crash; losing the unsynced write is what a power cut
would do.)  Every bookie of the ensemble is crashed and restarted, which a
correct bookie survives without losing anything (the journal is the
promise); with the flag the acknowledged entries are gone and the checker
must say so.  The control run (plain ``bookie_server``) must be clean.
"""
from __future__ import annotations

import signal

import pytest

from pybk_spark.cluster.local import LocalCluster
from pybk_spark.testing.fixtures import bookie_server_available

from . import faulty_bookie
from .history import History
from .scenario import RecordedWriter, client, final_check

pytestmark = pytest.mark.slow


def _crash_all_and_check(tmp_path, fault: str | None) -> list:
    cluster = LocalCluster(tmp_path / "cluster", num_bookies=3,
                           bookie_conf={"flush_interval_s": 3600.0},
                           bookie_command=faulty_bookie.command(fault) if fault else None)
    hist_dir = tmp_path / "history"
    hist_dir.mkdir()
    try:
        cluster.start()
        bk = client(cluster)
        hist = History(str(hist_dir / "w.jsonl"), "w")
        try:
            w = RecordedWriter(hist, bk.create_ledger(3, 3, 2))
            futs = [w.add_async() for _ in range(40)]
            for f in futs:
                f.result(120)
            lid = w.lh.ledger_id
            for b in w.lh.metadata.current_ensemble:     # crash every replica
                cluster.kill_bookie(b, signal.SIGKILL)
            for b in w.lh.metadata.current_ensemble:
                cluster.start_bookie(b)
        finally:
            hist.close()
            bk.close()
        return final_check(cluster, hist_dir, [lid])
    finally:
        cluster.stop()


@pytest.mark.skipif(not bookie_server_available(), reason="bookie_server not available")
def test_checker_catches_ack_before_fsync(tmp_path):
    violations = _crash_all_and_check(tmp_path, "ack_before_fsync")
    assert any(v.invariant == "I1" for v in violations), violations


@pytest.mark.skipif(not bookie_server_available(), reason="bookie_server not available")
def test_crash_of_every_replica_loses_nothing_without_the_flag(tmp_path):
    assert _crash_all_and_check(tmp_path, None) == []
