"""Dead-writer recovery against the real cluster: a SIGKILLed writer's ledger
is closed with every acknowledged entry (once through spark-submit), a second
run is a no-op, a live writer's ledger is left alone unless --force."""
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from pybk_spark import errors
from pybk_spark.cluster import procs

from admin_helpers import one_json_document, pybk, spark_submit, wait_until

WRITER = Path(__file__).with_name("dead_writer.py")


def _start_writer(uri, acks_wanted=600, chunk=50):
    proc = subprocess.Popen([sys.executable, str(WRITER), uri, str(chunk)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    procs.register(proc)
    ledger, acked = None, -1
    try:
        for line in proc.stdout:
            kind, value = line.split()
            if kind == "LEDGER":
                ledger = int(value)
            elif kind == "ACK":
                acked = int(value)
                if acked >= acks_wanted:
                    break
        else:
            raise AssertionError(f"writer exited early: {proc.stderr.read()[-2000:]}")
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        procs.unregister(proc)
    return ledger, acked


def _check_recovered(bk, ledger, acked):
    md = bk.get_ledger_metadata(ledger)
    assert md.is_closed
    assert md.last_entry_id >= acked, "an acknowledged entry was lost"
    rh = bk.open_ledger(ledger, password=b"secret", recovery=False)
    got = [e.payload for e in rh.read(0, md.last_entry_id)]
    assert got == [f"e{i}".encode() for i in range(md.last_entry_id + 1)]


@pytest.fixture
def bk(cluster_bk):
    return cluster_bk


def test_dead_writer_recovered_by_spark_job_then_noop(cluster, bk):
    uri = cluster.metadata_uri
    ledger, acked = _start_writer(uri)
    wait_until(lambda: not bk.is_writer_alive(ledger), 30, "writer lease expiry")
    assert not bk.get_ledger_metadata(ledger).is_closed

    res = spark_submit("recover_ledgers.py", "--metadata-uri", uri, "--ledger", ledger, "--json")
    assert res.rc == 0, res.err[-3000:]
    report = one_json_document(res)
    row = [r for r in report["ledgers"] if r["ledger"] == ledger][0]
    assert row["outcome"] == "recovered" and row["last_entry"] >= acked
    _check_recovered(bk, ledger, acked)

    again = pybk("--json", "recover", "--metadata-uri", uri, "--ledger", ledger)   # no-op
    assert again.rc == 0, again.out + again.err
    assert again.json()["ledgers"] == [] and again.json()["skipped"] == []
    _check_recovered(bk, ledger, acked)


def test_live_writer_left_alone_unless_force(cluster, bk):
    uri = cluster.metadata_uri
    lh = bk.create_ledger(3, 2, 2)
    lh.add_entries([b"a", b"b", b"c"])
    res = pybk("--json", "recover", "--metadata-uri", uri, "--ledger", lh.ledger_id)
    assert res.rc == 0 and res.json()["ledgers"] == []
    skipped = {s["ledger"]: s["reason"] for s in res.json()["skipped"]}
    assert "writer alive" in skipped[lh.ledger_id]
    assert bk.get_ledger_metadata(lh.ledger_id).state == "OPEN"
    lh.add_entry(b"d")                                          # writer still works

    forced = pybk("--json", "recover", "--metadata-uri", uri, "--force", "--ledger", lh.ledger_id)
    assert forced.rc == 0, forced.out
    row = [r for r in forced.json()["ledgers"] if r["ledger"] == lh.ledger_id][0]
    assert row["outcome"] == "recovered" and row["last_entry"] == 3
    with pytest.raises(errors.BKError):
        lh.add_entry(b"e")                                      # fenced: unknown outcome
    lh._lease = None


def test_recover_in_process_and_log_filter(cluster, bk):
    uri = cluster.metadata_uri
    ledger, acked = _start_writer(uri, acks_wanted=100, chunk=20)
    wait_until(lambda: not bk.is_writer_alive(ledger), 30, "writer lease expiry")
    res = pybk("recover", "--metadata-uri", uri, "--min-idle", "0", "--ledger", ledger)
    assert res.rc == 0, res.err
    assert "recovered" in res.out and "ledger" in res.out     # human table
    _check_recovered(bk, ledger, acked)
    missing_log = pybk("recover", "--metadata-uri", uri, "--log", "no-such-log-xyz")
    assert missing_log.rc == 1 and "LogNotFound" in missing_log.err


def test_recover_by_log_and_wrong_password_fails(cluster, bk):
    import uuid
    from pybk_spark.logs.log_writer import LogWriter
    uri = cluster.metadata_uri
    name = f"dead-log-{uuid.uuid4().hex[:8]}"
    w = LogWriter(bk, name, password=b"logpw").open()
    w.append_batch([b"r0", b"r1", b"r2"])
    ledger = w.current_ledger_id
    w._handle._lease.revoke()                  # the leader "dies" without closing
    w._handle._lease = None
    young = pybk("--json", "recover", "--metadata-uri", uri, "--log", name, "--min-idle", "3600")
    assert young.rc == 0 and "min-idle" in young.json()["skipped"][0]["reason"]
    wrong = pybk("--json", "recover", "--metadata-uri", uri, "--log", name)
    assert wrong.rc == 1, wrong.out                 # no password given: Unauthorized
    assert wrong.json()["failed"] == [ledger]
    assert "Unauthorized" in wrong.json()["ledgers"][0]["error"]
    ok = pybk("--json", "recover", "--metadata-uri", uri, "--log", name, "--password", "logpw")
    assert ok.rc == 0, ok.out
    row = ok.json()["ledgers"][0]
    assert row["ledger"] == ledger and row["outcome"] == "recovered" and row["last_entry"] == 2
