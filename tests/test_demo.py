"""`make demo` end to end: a fresh local cluster, spark-submit jobs/demo.py, teardown."""
import os
import subprocess
import sys

import pytest


@pytest.mark.slow
@pytest.mark.spark
def test_demo_exits_zero_and_reports_a_match(tmp_path):
    env = dict(os.environ, PYSPARK_PYTHON=sys.executable, PYSPARK_DRIVER_PYTHON=sys.executable,
               SPARK_LOCAL_IP="127.0.0.1")
    out = subprocess.run([sys.executable, "-m", "pybk_spark.demo", "--", "--ledgers", "2",
                          "--entries", "300"],
                         cwd=str(tmp_path), env=env, capture_output=True, text=True, timeout=900)
    assert out.returncode == 0, out.stdout[-4000:] + out.stderr[-4000:]
    assert "RESULT: OK" in out.stdout
    assert "demo: PASSED" in out.stdout
