"""``pybk offload LOG`` and ``pybk offload --status`` on the shared real
cluster, and conf/offload.conf as the settings file they read."""
import uuid
from pathlib import Path

import pytest

from admin_helpers import pybk
from pybk_spark.logs.log import read_log
from pybk_spark.logs.log_writer import LogWriter, RollPolicy
from pybk_spark.logs.offload_conf import OffloadSettings, load_offload_conf

ROOT = Path(__file__).resolve().parents[2]


def test_offload_a_log_then_show_its_status(uri, cluster_bk, tmp_path):
    log = f"offcli-{uuid.uuid4().hex[:8]}"
    with LogWriter(cluster_bk, log, roll_policy=RollPolicy(max_entries=10)).open() as w:
        w.append_batch([b"r%d" % i for i in range(10)])
        w.append_batch([b"r%d" % i for i in range(10, 20)])
        w.append_batch([b"r%d" % i for i in range(20, 30)])
    res = pybk("offload", log, "--location", tmp_path, "--grace-s", "0", "--json",
               "--metadata-uri", uri)
    assert res.rc == 0, res.err
    report = res.json()
    md, _ = read_log(cluster_bk.metadata_store, log)
    assert report["offloaded"] == md.ledger_ids[:-2] and report["rows"] == 10 * len(
        report["offloaded"])
    assert report["ledgers_deleted"] == report["offloaded"]
    res = pybk("offload", "--status", log, "--json", "--metadata-uri", uri)
    assert res.rc == 0, res.err
    (status,) = res.json()
    assert status["offloaded"] == len(report["offloaded"]) == status["ledgers_deleted"]
    assert [s["ledger_id"] for s in status["segments_offloaded"]] == report["offloaded"]
    text = pybk("offload", log, "--location", tmp_path, "--metadata-uri", uri)
    assert text.rc == 0 and "offloaded 0 segments" in text.out
    read = pybk("readlog", log, "--json", "--metadata-uri", uri)
    assert [r["payload"] for r in read.json()["records"]] == [f"r{i}" for i in range(30)]


def test_offload_without_a_log_or_with_a_bad_setting_says_what_to_fix(uri):
    res = pybk("offload", "--metadata-uri", uri)
    assert res.rc == 1 and "name the LOG to offload, or pass --status" in res.err
    res = pybk("offload", "x", "--keep-segments", "1", "--metadata-uri", uri)
    assert res.rc == 1 and "keep_segments 1: at least 2" in res.err


def test_the_conf_file_holds_the_defaults_and_comments_every_key(tmp_path):
    path = ROOT / "conf" / "offload.conf"
    assert load_offload_conf(str(path)) == OffloadSettings()
    lines = path.read_text().splitlines()
    for i, line in enumerate(lines):
        if line and not line.startswith("#"):
            assert lines[i - 1].startswith("#"), f"conf/offload.conf: {line!r} has no comment"
    bad = tmp_path / "bad.conf"
    bad.write_text("grace = 3\n")
    with pytest.raises(Exception, match="did you mean 'grace_s'"):
        load_offload_conf(str(bad))


def test_deletelog_deletes_the_offloaded_files_too(uri, cluster_bk, tmp_path):
    log = f"offdel-{uuid.uuid4().hex[:8]}"
    with LogWriter(cluster_bk, log, roll_policy=RollPolicy(max_entries=5)).open() as w:
        for k in range(4):
            w.append_batch([b"d%d" % (k * 5 + i) for i in range(5)])
    assert pybk("offload", log, "--location", tmp_path, "--metadata-uri", uri).rc == 0
    assert list(tmp_path.rglob("*.parquet"))
    res = pybk("deletelog", log, "--json", "--metadata-uri", uri)
    assert res.rc == 0, res.err
    assert res.json()["offloaded_files_left"] == [] and not list(tmp_path.rglob("*.parquet"))


def test_a_logs_own_policy_set_shown_used_and_cleared(uri, cluster_bk, tmp_path):
    log = f"offpol-{uuid.uuid4().hex[:8]}"
    with LogWriter(cluster_bk, log, roll_policy=RollPolicy(max_entries=10)).open() as w:
        for k in range(4):
            w.append_batch([b"r%d" % (k * 10 + i) for i in range(10)])
    res = pybk("offload", log, "--set-policy", "--keep-segments", "3", "--json",
               "--metadata-uri", uri)
    assert res.rc == 0, res.err
    assert res.json()["policy"] == {"keep_segments": 3, "min_age_s": 0.0, "keep_bytes": -1}
    status = pybk("offload", "--status", log, "--metadata-uri", uri)
    assert status.rc == 0 and "keep_segments=3 min_age_s=0.0 keep_bytes=-1" in status.out
    res = pybk("offload", log, "--location", tmp_path, "--json", "--metadata-uri", uri)
    md, _ = read_log(cluster_bk.metadata_store, log)
    assert (res.json()["policy"], res.json()["offloaded"]) == ("log", md.ledger_ids[:1])
    res = pybk("offload", log, "--clear-policy", "--metadata-uri", uri)
    assert res.rc == 0 and f"log {log}: offload policy conf" in res.out
    res = pybk("offload", log, "--location", tmp_path, "--metadata-uri", uri)
    assert res.rc == 0 and "offloaded 1 segments" in res.out and "by the conf's rules" in res.out
    res = pybk("offload", log, "--set-policy", "--metadata-uri", uri)
    assert res.rc == 1 and "give at least one of --keep-segments" in res.err
    res = pybk("offload", log, "--set-policy", "--keep-bytes", "-2", "--metadata-uri", uri)
    assert res.rc == 1 and "keep_bytes -2" in res.err
