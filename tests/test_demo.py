"""`make demo` end to end: a fresh local cluster, spark-submit jobs/demo.py, teardown."""
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest


def processes_mentioning(text: str) -> list[str]:
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            cmdline = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if text in cmdline:
            found.append(f"{proc.name}: {cmdline[:200]}")
    return found


@pytest.mark.slow
@pytest.mark.spark
def test_demo_exits_zero_reports_a_match_and_leaves_no_process(tmp_path):
    env = dict(os.environ, PYSPARK_PYTHON=sys.executable, PYSPARK_DRIVER_PYTHON=sys.executable,
               SPARK_LOCAL_IP="127.0.0.1")
    out = subprocess.run([sys.executable, "-m", "pybk_spark.commands.demo", "--", "--ledgers", "2",
                          "--entries", "300"],
                         cwd=str(tmp_path), env=env, capture_output=True, text=True, timeout=900)
    assert out.returncode == 0, out.stdout[-4000:] + out.stderr[-4000:]
    assert "RESULT: OK" in out.stdout
    assert "demo: PASSED" in out.stdout
    offloaded = re.search(r"appended 200 entries in 4 segments; offloaded 2 closed segments "
                          r"\(100 entries, \d+ B of Parquet\) to (\S+) and deleted their 2 ledgers",
                          out.stdout)
    assert offloaded, out.stdout[-4000:]
    assert "read_log: 100 rows from Parquet + 100 rows from bookies = 200 (appended 200); " \
           "in log order identical" in out.stdout
    data_dir = re.search(r"bookies in (\S+)", out.stdout).group(1)
    assert processes_mentioning(data_dir) == []
    assert offloaded.group(1).startswith(data_dir)
    assert not Path(data_dir).exists()
