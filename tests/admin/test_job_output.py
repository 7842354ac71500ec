"""spark-submit jobs keep stdout parsable: ``--json`` prints exactly one JSON
document, progress goes to stderr, Spark logs at WARN by default."""
import os

import pytest

from pybk_spark.admin.jobs import job_output

from admin_helpers import one_json_document, spark_submit


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


@pytest.mark.spark
def test_a_job_refused_under_spark_submit_prints_one_json_error():
    """A job's one JSON document under spark-submit, here for a refused
    setting (exit 2); the jobs' reports are checked the same way where they
    run (tests/admin/test_rereplicate.py and test_recover.py,
    ``one_json_document``)."""
    bad = spark_submit("rereplicate.py", "--metadata-uri", "http://nowhere/pybk", "--json")
    assert bad.rc == 2, bad.out + bad.err[-2000:]
    assert one_json_document(bad)["error"] == "IncorrectParameter", bad.out
