"""A chaos run with tiered storage in the workload (``make chaos``, not
``make test``): the short run's writers, readers and nemesis plus an
offloader that moves every log's closed segments to Parquet files, stops
some offloads after a step as a killed offloader would, is itself SIGKILLed
by the nemesis, and deletes offloaded ledgers after a 3 s grace period while
tail readers cross from files into ledgers.  The checker judges the deleted
segments from their files (I1, I3, I5: nothing lost, duplicated or
reordered) and every other offloaded segment's files against its ledger
(I11).  Replay: ``python -m tests.chaos.runner --offloaders 1 --duration D --seed S``."""
from __future__ import annotations

import os
import random

import pytest

from pybk_spark.testing.fixtures import bookie_server_available

from .runner import run

pytestmark = [pytest.mark.slow, pytest.mark.long]


@pytest.mark.skipif(not bookie_server_available(), reason="bookie_server not available")
def test_chaos_with_offload_finds_no_violation(tmp_path):
    seed = int(os.environ.get("PYBK_CHAOS_SEED", random.SystemRandom().randrange(1 << 31)))
    duration = float(os.environ.get("CHAOS_SECONDS", "60"))
    lines: list[str] = []
    summary = run(duration, seed, workdir=str(tmp_path / "chaos"), offloaders=1,
                  out=lambda m: (lines.append(m), print(m)))
    assert summary["ops"].get("offload:ok", 0) > 0, "\n".join(lines[-60:])
    assert not summary["violations"], (
        f"seed {seed}: {len(summary['violations'])} violation(s); replay with "
        f"python -m tests.chaos.runner --offloaders 1 --duration {duration:g} --seed {seed}\n"
        + "\n".join(lines[-60:]))
