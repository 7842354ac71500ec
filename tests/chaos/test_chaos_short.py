"""A short chaos run in the test suite: etcd + 5 bookies + writers/readers +
nemesis for CHAOS_SECONDS (default 60), then heal, recover, re-replicate and
check.  Where test hosts can be made (runner ``--topology auto``) every
process has its own host (3 etcd members) and link faults are drawn too;
elsewhere everything runs on 127.0.0.1.  On failure the message carries the seed and the replay command.
Replay / longer runs: ``make chaos DURATION=600 SEED=<seed>``."""
from __future__ import annotations

import os
import random

import pytest

from pybk_spark.testing.fixtures import bookie_server_available

from .runner import run

pytestmark = pytest.mark.slow


@pytest.mark.skipif(not bookie_server_available(), reason="bookie_server not available")
def test_short_chaos_run_finds_no_violation(tmp_path):
    seed = int(os.environ.get("PYBK_CHAOS_SEED", random.SystemRandom().randrange(1 << 31)))
    duration = float(os.environ.get("CHAOS_SECONDS", "60"))
    lines: list[str] = []
    summary = run(duration, seed, workdir=str(tmp_path / "chaos"),
                  out=lambda m: (lines.append(m), print(m)))
    assert summary["operations"] > 0 and summary["faults_total"] > 0
    assert not summary["violations"], (
        f"seed {seed}: {len(summary['violations'])} violation(s); replay with "
        f"PYBK_CHAOS_SEED={seed} CHAOS_SECONDS={duration:g} or "
        f"make chaos DURATION={duration:g} SEED={seed}\n" + "\n".join(lines[-60:]))
