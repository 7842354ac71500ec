"""Helpers for the operator-tool tests (imported as ``admin_helpers``): run
``pybk`` in-process, run a job through spark-submit (whole process group
killed on timeout), poll with a deadline, check a bookie's registration."""
import io
import json
import subprocess
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path

from pybk_spark.commands import cli
from pybk_spark.testing import waiting

ROOT = Path(__file__).resolve().parents[2]


class Result:
    def __init__(self, rc, out, err):
        self.rc, self.out, self.err = rc, out, err

    def json(self):
        return json.loads(self.out)


def pybk(*argv) -> Result:
    """Run ``pybk`` in this process; returns exit status, stdout, stderr."""
    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        try:
            rc = cli.main([str(a) for a in argv])
        except SystemExit as exc:      # argparse usage errors
            rc = exc.code
    return Result(rc, out.getvalue(), err.getvalue())


def wait_until(predicate, timeout: float = 60.0, what: str = "condition"):
    """testing/waiting.py's wait, with these tests' argument order."""
    return waiting.wait_until(predicate, what, timeout)


def spark_submit(job: str, *args, timeout: float = 300.0) -> Result:
    """spark-submit as an operator runs it: no log-level flag of our own (the
    job keeps Spark at WARN itself)."""
    from pybk_spark.commands.demo import _kill_group, spark_env, spark_submit_path
    cmd = [spark_submit_path(), "--master", "local[2]",
           "--conf", "spark.ui.enabled=false",
           "--conf", "spark.driver.host=127.0.0.1",
           "--conf", "spark.driver.bindAddress=127.0.0.1",
           str(ROOT / "jobs" / job), *[str(a) for a in args]]
    proc = subprocess.Popen(cmd, env=spark_env(), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True,
                            cwd="/tmp")
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        _kill_group(proc)
        out, err = proc.communicate()
        raise AssertionError(f"spark-submit {job} timed out; stderr tail:\n{err[-3000:]}") from None
    finally:
        if proc.poll() is None:
            _kill_group(proc)
    return Result(proc.returncode, out, err)


def registered(store, bookie_id: str) -> bool:
    return any(store.get(f"bookies/{m}/{bookie_id}") is not None
               for m in ("writable", "readonly"))


def one_json_document(res: Result) -> dict:
    """A ``--json`` job's report: the whole of stdout is one JSON document,
    and Spark logs at WARN (the 3 INFO lines that precede its conf at most)."""
    report = json.loads(res.out)
    assert isinstance(report, dict), res.out
    info = [line for line in res.err.splitlines() if " INFO " in line]
    assert len(info) <= 3, info
    return report
