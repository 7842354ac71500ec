"""`python -m bench.run --quick` runs end to end and writes the ratio keys.

Checks the harness, never the figures (no timing thresholds).  A ratio may be
null only when the JSON names the missing component under ``missing``.
"""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from bench.run import RATIO_KEYS

ROOT = Path(__file__).resolve().parents[1]
QUICK_JSON = ROOT / "bench" / "results" / "quick.json"


@pytest.mark.slow
def test_bench_quick_writes_every_ratio(tmp_path):
    latest = ROOT / "bench" / "results" / "latest.json"
    latest_before = latest.read_bytes() if latest.exists() else None
    env = dict(os.environ, PYSPARK_PYTHON=sys.executable, PYSPARK_DRIVER_PYTHON=sys.executable,
               SPARK_LOCAL_IP="127.0.0.1")
    proc = subprocess.run([sys.executable, "-m", "bench.run", "--quick", "--data-dir", str(tmp_path)],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    result = json.loads(QUICK_JSON.read_text())
    assert result["mode"] == "quick"
    assert set(result["ratios"]) == set(RATIO_KEYS)
    assert result["errors"] == {}, result["errors"]     # every figure's code path ran
    for key, value in result["ratios"].items():
        if value is None:
            assert result["missing"].get(key), f"ratio {key} is null without a documented reason"
        else:
            assert isinstance(value, (int, float))
    for field in ("nproc", "memory_gib", "disk_free_gib", "python", "pyspark", "pyarrow"):
        assert result["machine"].get(field) is not None, field
    assert (ROOT / "bench" / "results" / "quick.md").exists()
    assert (ROOT / "bench" / "results" / "quick.png").exists()
    # quick mode never overwrites the committed full-run figures
    after = latest.read_bytes() if latest.exists() else None
    assert after == latest_before
