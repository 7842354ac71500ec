"""README.md and docs/spark.md run as written.

Every ```python and ```bash block of each file runs, in order, against a
fresh local cluster (etcd + 3 bookie-server processes); the test fails on the
first block that fails, naming the file and line.  Conventions:

* the URI: snippets read ``PYBK_METADATA_URI`` (what ``pybk standalone``
  prints; ``pybk`` takes it as its ``--metadata-uri`` default); the test sets
  it to its cluster's URI;
* Python blocks share one namespace per file, with ``spark`` bound to the
  test session, as in the ``pyspark`` shell;
* bash blocks run with ``bash -euo pipefail`` from a scratch directory that
  looks like the project root (``.venv``, ``jobs``, ``conf`` linked in);
* not run: blocks tagged otherwise (```text for output), blocks that call
  ``make`` (the README's opening ``make demo`` / ``make test``, the set-up
  the test stands in for), and blocks right after an HTML comment
  ``<!-- readme-test: skip (REASON) -->`` (interactive shells, daemons,
  membership changes).
"""
from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.slow, pytest.mark.spark]

ROOT = Path(__file__).resolve().parents[2]
RUN = ("python", "bash")
SKIP_MARK = re.compile(r"<!--\s*readme-test:\s*skip\b")


def code_blocks(path: Path) -> list[tuple[int, str, str, bool]]:
    """(line, language, code, skipped) of every fenced block."""
    out = []
    lines = path.read_text().splitlines()
    i = 0
    while i < len(lines):
        m = re.match(r"^```(\w*)\s*$", lines[i])
        if not m:
            i += 1
            continue
        start, lang = i + 1, m.group(1)
        before = next((lines[j] for j in range(i - 1, -1, -1) if lines[j].strip()), "")
        j = i + 1
        while j < len(lines) and not lines[j].startswith("```"):
            j += 1
        code = "\n".join(lines[i + 1:j])
        calls_make = any(re.match(r"\s*make\b", line) for line in code.splitlines())
        out.append((start, lang, code, bool(SKIP_MARK.search(before)) or calls_make))
        i = j + 1
    return out


@pytest.fixture                      # one per file: README and the guide both use log "events"
def readme_cluster(tmp_path_factory):
    from pybk_spark.testing.fixtures import bookie_server_available, private_cluster
    if not bookie_server_available():
        pytest.skip("bookie_server is not available")
    yield from private_cluster(tmp_path_factory.mktemp("readme-cluster"), num_bookies=3)


def _project_like(tmp: Path) -> Path:
    for name in ("jobs", "conf"):
        (tmp / name).symlink_to(ROOT / name)
    (tmp / ".venv").symlink_to(Path(sys.executable).parent.parent)
    return tmp


def run_file(doc: str, spark, uri: str, tmp: Path) -> int:
    path = ROOT / doc
    env = dict(os.environ, PYBK_METADATA_URI=uri, SPARK_LOCAL_IP="127.0.0.1",
               PYTHONPATH=os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH"))
                                          if p))
    namespace = {"spark": spark, "__name__": "__readme__"}
    ran = 0
    old_cwd, old_env = os.getcwd(), dict(os.environ)
    os.chdir(tmp)
    os.environ.update(env)
    try:
        for line, lang, code, skipped in code_blocks(path):
            if skipped or lang not in RUN:
                continue
            where = f"{doc}:{line}"
            if lang == "python":
                try:
                    exec(compile(code, where, "exec"), namespace)
                except Exception as exc:
                    pytest.fail(f"{where}: the Python block fails: {type(exc).__name__}: "
                                f"{str(exc)[:3000]}")
            else:
                res = subprocess.run(["bash", "-euo", "pipefail", "-c", code], cwd=tmp, env=env,
                                     capture_output=True, text=True, timeout=900)
                assert res.returncode == 0, (f"{where}: the bash block exits {res.returncode}:\n"
                                             f"{res.stdout[-3000:]}\n{res.stderr[-3000:]}")
            ran += 1
    finally:
        os.chdir(old_cwd)
        os.environ.clear()
        os.environ.update(old_env)
    return ran


def test_code_blocks_are_parsed():
    blocks = code_blocks(ROOT / "README.md")
    assert blocks[0][3], "the README's opening make demo / make test block must not run"
    assert any(lang == "python" and not skipped for _, lang, _, skipped in blocks)


def test_readme_runs(spark, readme_cluster, tmp_path):
    assert run_file("README.md", spark, readme_cluster.metadata_uri,
                    _project_like(tmp_path)) >= 5


def test_spark_guide_runs(spark, readme_cluster, tmp_path):
    assert run_file("docs/spark.md", spark, readme_cluster.metadata_uri,
                    _project_like(tmp_path)) >= 3
