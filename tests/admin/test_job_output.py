"""spark-submit jobs keep stdout parsable: ``--json`` prints exactly one JSON
document, progress goes to stderr, Spark logs at WARN by default."""
import json
import os
import subprocess

import pytest

from pybk_spark.admin.jobs import job_output

from admin_helpers import ROOT


def _fake_parent(tmp_path, target_fd: int) -> str:
    """A /proc look-alike whose process 4242 has ``target_fd`` as stderr."""
    fd_dir = tmp_path / "proc" / "4242" / "fd"
    fd_dir.mkdir(parents=True)
    (fd_dir / "2").symlink_to(f"/proc/self/fd/{target_fd}")
    return str(tmp_path / "proc")


def test_merged_stderr_moves_to_the_parents_stderr(tmp_path):
    out_r, out_w = os.pipe()
    jvm_r, jvm_w = os.pipe()
    err = os.dup(out_w)                       # the driver's stderr merged into its stdout
    try:
        assert job_output.merged(out_w, err)
        root = _fake_parent(tmp_path, jvm_w)
        assert job_output.separate_stderr(True, out_fd=out_w, err_fd=err, proc_root=root,
                                          parent_pid=4242) == job_output.SEPARATED
        os.write(err, b"progress\n")
        os.write(out_w, b"{}\n")
        assert os.read(jvm_r, 100) == b"progress\n"
        assert os.read(out_r, 100) == b"{}\n"
        assert not job_output.merged(out_w, err)
    finally:
        for fd in (out_r, out_w, jvm_r, jvm_w, err):
            os.close(fd)


def test_without_a_usable_parent_stderr_json_silences_it(tmp_path):
    out_r, out_w = os.pipe()
    err = os.dup(out_w)
    regular = tmp_path / "jvm.log"
    regular.write_text("")
    fd = os.open(regular, os.O_WRONLY)
    try:
        root = _fake_parent(tmp_path, fd)     # a regular file is never reopened
        assert job_output.separate_stderr(False, out_fd=out_w, err_fd=err, proc_root=root,
                                          parent_pid=4242) == job_output.MERGED
        assert job_output.separate_stderr(True, out_fd=out_w, err_fd=err, proc_root=root,
                                          parent_pid=4242) == job_output.SILENCED
        os.write(err, b"progress\n")
        os.write(out_w, b"{}\n")
        assert os.read(out_r, 100) == b"{}\n"
        assert regular.read_text() == ""
    finally:
        for f in (out_r, out_w, err, fd):
            os.close(f)


def _submit(job: str, *args) -> subprocess.CompletedProcess:
    """spark-submit as an operator runs it: no log-level flag of our own."""
    from pybk_spark.commands.demo import spark_env, spark_submit_path
    cmd = [spark_submit_path(), "--master", "local[2]", "--conf", "spark.ui.enabled=false",
           "--conf", "spark.driver.host=127.0.0.1", "--conf", "spark.driver.bindAddress=127.0.0.1",
           str(ROOT / "jobs" / job), *args]
    return subprocess.run(cmd, env=spark_env(), capture_output=True, text=True, timeout=600,
                          cwd="/tmp")


@pytest.mark.spark
def test_jobs_print_one_json_document_under_spark_submit(cluster):
    from pybk_spark.ledger.client import BookKeeper
    uri = cluster.metadata_uri
    with BookKeeper(uri) as bk:
        for _ in range(2):
            lh = bk.create_ledger(ensemble=3, write_quorum=2, ack_quorum=2)
            lh.add_entries([b"x"] * 10)
            lh.close()
    for job, args in (("rereplicate.py", ("--verify",)), ("recover_ledgers.py", ())):
        res = _submit(job, "--metadata-uri", uri, "--json", *args)
        assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
        report = json.loads(res.stdout)              # the whole of stdout, nothing else
        assert isinstance(report, dict), res.stdout
        info = [line for line in res.stderr.splitlines() if " INFO " in line]
        assert len(info) <= 3, info                  # Spark at WARN (3 lines precede its conf)
        if job == "rereplicate.py":
            assert report["under_replicated"] == []
            assert "tasks done" in res.stderr, res.stderr[-2000:]

    bad = _submit("rereplicate.py", "--metadata-uri", "http://nowhere/pybk", "--json")
    assert bad.returncode == 2, bad.stdout + bad.stderr[-2000:]
    assert json.loads(bad.stdout)["error"] == "IncorrectParameter", bad.stdout
