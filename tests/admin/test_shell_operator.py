"""The shell as operators meet it and the BookKeeper shell
commands added with it, against the shared real cluster: tables, decoded
DataFrame logs, escaped binary payloads, autorecovery switches, log deletion,
bookiesanity, readledger --bookie, offline readjournal / lastmark.  Every
expected failure: one line on stderr, no traceback, exit 1 (2 for usage)."""
import dataclasses
import threading
import uuid

import pyarrow as pa
import pytest

from pybk_spark.metadata import audit_control as ctl
from pybk_spark.admin.operations.autorecovery import AutoRecovery, AutoRecoveryConfig

from admin_helpers import pybk, wait_until


@pytest.fixture
def bk(cluster_bk):
    return cluster_bk


def one_line_error(res, *needles):
    assert res.rc == 1, (res.rc, res.out, res.err)
    assert "Traceback" not in res.err and len(res.err.strip().splitlines()) == 1, res.err
    for n in needles:
        assert n in res.err, res.err


# -- item 4: output --------------------------------------------------------------------------
def test_listbookies_is_a_table_with_the_lane_address(uri, cluster):
    human = pybk("listbookies", "--metadata-uri", uri, "--all")
    assert human.rc == 0
    header = human.out.splitlines()[0].split()
    assert header == ["bookie", "address", "add_lane", "rack", "state", "metrics_port"]
    js = pybk("--json", "listbookies", "--metadata-uri", uri)
    rows = {r["bookie_id"]: r for r in js.json()}
    for bid in cluster.bookie_ids:
        lane = rows[bid]["add_lane_address"]
        assert lane and any(bid in line and lane in line for line in human.out.splitlines())


def test_readledger_escapes_binary_payloads_and_hints_hex(uri, bk):
    lh = bk.create_ledger(3, 2, 2)
    lh.add_entries([b"\x00\xff\x10binary", "texté".encode()])
    lh.close()
    human = pybk("readledger", "--metadata-uri", uri, lh.ledger_id)
    assert human.rc == 0
    assert "\\x00\\xff\\x10binary" in human.out and "texté" in human.out
    assert "--hex" in human.out
    hexed = pybk("readledger", "--metadata-uri", uri, lh.ledger_id, "--hex")
    assert "00ff1062696e617279" in hexed.out and "--hex prints" not in hexed.out
    js = pybk("--json", "readledger", "--metadata-uri", uri, lh.ledger_id)
    assert [sorted(e) for e in js.json()["entries"]] == [["entry", "payload", "size"]] * 2
    one = sorted(lh.metadata.all_bookies())[0]
    copy = pybk("--json", "readledger", "--metadata-uri", uri, lh.ledger_id, "--bookie", one)
    assert copy.rc == 0 and copy.json()["bookie"] == one
    held = [e["entry"] for e in copy.json()["entries"]]
    assert held and set(held) <= {0, 1}
    other = pybk("readledger", "--metadata-uri", uri, lh.ledger_id, "--bookie", "nobody")
    one_line_error(other, "IncorrectParameter", "nobody", str(lh.ledger_id))


def test_readlog_prints_dataframe_rows(uri, bk):
    from pybk_spark.logs.log import update_log
    from pybk_spark.logs.log_writer import LogWriter
    from pybk_spark.spark.arrow_codec import encode_schema
    name = f"df-log-{uuid.uuid4().hex[:8]}"
    schema = pa.schema([pa.field("id", pa.int64()), pa.field("name", pa.string())])
    w = LogWriter(bk, name).open()
    update_log(bk.metadata_store, name,
               lambda m: dataclasses.replace(m, schema=encode_schema(schema)))
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, schema) as s:
        s.write_batch(pa.record_batch([pa.array([1, 2]), pa.array(["a", "b"])], schema=schema))
    w.append(sink.getvalue().to_pybytes())
    w.close()
    human = pybk("readlog", "--metadata-uri", uri, name)
    assert human.rc == 0, human.err
    assert "id=1 name='a'" in human.out and "id=2 name='b'" in human.out
    assert "ARROW" not in human.out.upper().replace("DATAFRAME", "")
    js = pybk("--json", "readlog", "--metadata-uri", uri, name)
    rec = js.json()["records"][0]
    assert {"ledger", "entry", "size", "payload"} <= set(rec)
    assert rec["rows"] == [{"id": 1, "name": "a"}, {"id": 2, "name": "b"}]


def test_unreachable_etcd_names_the_endpoint():
    res = pybk("listbookies", "--metadata-uri", "etcd://127.0.0.1:9/nowhere")
    one_line_error(res, "127.0.0.1:9")


# -- autorecovery switches ------------------------------------------------------------------
def test_autorecovery_switches_and_delay(uri, bk):
    store = bk.metadata_store
    try:
        off = pybk("--json", "autorecoveryctl", "--metadata-uri", uri, "--disable")
        assert off.rc == 0 and off.json()["enabled"] is False
        ar = AutoRecovery(bk, uri, AutoRecoveryConfig(), identity="t-switch")
        try:
            row = ar.run_round()
            assert row.get("disabled") is True or row["leader"] is False
        finally:
            ar.resign()
        human = pybk("autorecoveryctl", "--metadata-uri", uri)
        assert "DISABLED" in human.out
        assert pybk("autorecoveryctl", "--metadata-uri", uri, "--enable").rc == 0
        assert ctl.read_config(store)["enabled"] is True

        got = pybk("--json", "lostbookierecoverydelay", "--metadata-uri", uri, "--set", "7.5")
        assert got.json() == {"lost_bookie_recovery_delay_s": 7.5}
        assert "7.5 s" in pybk("lostbookierecoverydelay", "--metadata-uri", uri).out
        ar = AutoRecovery(bk, uri, AutoRecoveryConfig(lost_bookie_delay_s=0.0), identity="t-d")
        try:
            row = ar.run_round()
            assert not row["leader"] or row["lost_bookie_delay_s"] == 7.5
        finally:
            ar.resign()
        bad = pybk("lostbookierecoverydelay", "--metadata-uri", uri, "--set", "-1")
        one_line_error(bad, "IncorrectParameter")
    finally:
        ctl.set_enabled(store, True)
        ctl.set_lost_bookie_delay(store, None)
    cleared = pybk("--json", "lostbookierecoverydelay", "--metadata-uri", uri)
    assert cleared.json() == {"lost_bookie_recovery_delay_s": None}


def test_triggeraudit_starts_a_round_at_once(uri, bk):
    rows, stop = [], threading.Event()
    ar = AutoRecovery(bk, uri, AutoRecoveryConfig(interval_s=3600, trigger_poll_s=0.1),
                      identity="t-trigger")
    t = threading.Thread(target=ar.run_forever, args=(stop.wait, rows.append), daemon=True)
    t.start()
    try:
        wait_until(lambda: rows, 60, "first round")
        if not rows[0]["leader"]:
            pytest.skip("another autorecovery holds the leadership")
        res = pybk("--json", "triggeraudit", "--metadata-uri", uri)
        assert res.rc == 0 and res.json()["triggered"] and res.json()["leader"] == "t-trigger"
        wait_until(lambda: len(rows) >= 2, 60, "triggered round")   # not after 3600 s
    finally:
        stop.set()
        t.join(30)


# -- logs -------------------------------------------------------------------------------------------
def test_deletelog_refuses_an_active_writer_unless_forced(uri, bk):
    from pybk_spark.logs.log_writer import LogWriter
    name = f"del-log-{uuid.uuid4().hex[:8]}"
    w = LogWriter(bk, name).open()
    w.append(b"x")
    refused = pybk("deletelog", "--metadata-uri", uri, name)
    one_line_error(refused, "active writer", "--force")
    forced = pybk("--json", "deletelog", "--metadata-uri", uri, name, "--force")
    assert forced.rc == 0 and forced.json()["forced"] is True
    lid = forced.json()["deleted_ledgers"][0]
    assert lid not in bk.list_ledgers()
    w._lost = True
    missing = pybk("deletelog", "--metadata-uri", uri, name)
    one_line_error(missing, "LogNotFound")

    name2 = f"del-log-{uuid.uuid4().hex[:8]}"
    w2 = LogWriter(bk, name2).open()
    w2.append(b"a")
    first = w2.current_ledger_id
    w2.roll()
    w2.append(b"b")
    w2.close()
    tr = pybk("--json", "truncatelog", "--metadata-uri", uri, name2, "--before",
              _ledgers(uri, name2)[-1])
    assert tr.rc == 0 and tr.json()["deleted_ledgers"] == [first]
    done = pybk("deletelog", "--metadata-uri", uri, name2)
    assert done.rc == 0 and f"deleted log {name2}" in done.out


def test_logretention_shows_sets_and_applies(uri, bk):
    from pybk_spark.logs.log_writer import LogWriter
    name = f"ret-log-{uuid.uuid4().hex[:8]}"
    w = LogWriter(bk, name).open()
    for payload in (b"a", b"b"):
        w.append(payload)
        w.roll()
    shown = pybk("logretention", "--metadata-uri", uri, name)
    assert shown.rc == 0 and "retention.ms=-1 retention.bytes=-1" in shown.out
    first_two = _ledgers(uri, name)[:2]
    res = pybk("--json", "logretention", "--metadata-uri", uri, name, "--bytes", "0", "--apply")
    assert res.rc == 0, res.err
    assert res.json()["retention_bytes"] == 0 and res.json()["deleted_ledgers"] == first_two
    assert len(_ledgers(uri, name)) == 1 and not set(first_two) & set(bk.list_ledgers())
    listed = {r["log"]: r for r in pybk("--json", "listlogs", "--metadata-uri", uri).json()}
    assert listed[name]["retention"] == "bytes=0" and listed[name]["truncated_ledgers"] == 2
    assert "retention=bytes=0" in pybk("logmetadata", "--metadata-uri", uri, name).out
    off = pybk("logretention", "--metadata-uri", uri, name, "--bytes", "-1")
    assert "retention.bytes=-1" in off.out
    bad = pybk("logretention", "--metadata-uri", uri, name, "--ms", "-5")
    one_line_error(bad, "retention.ms", ">= 0")
    w.close()


def _ledgers(uri, name):
    md = pybk("--json", "logmetadata", "--metadata-uri", uri, name).json()
    return [s["ledger_id"] for s in md["segments"]]


# -- one bookie --------------------------------------------------------------------------------------
def test_bookiesanity(uri, cluster, bk):
    bid = cluster.bookie_ids[1]
    res = pybk("--json", "bookiesanity", "--metadata-uri", uri, "--bookie", bid)
    assert res.rc == 0, res.err
    assert res.json()["ok"] and res.json()["bookie"] == bid
    assert res.json()["ledger"] not in bk.list_ledgers()
    bad = pybk("bookiesanity", "--metadata-uri", uri, "--bookie", "nobody:1")
    one_line_error(bad, "NotEnoughBookies", "nobody:1")


def test_updatecookie_points_to_bookie_server(uri):
    res = pybk("updatecookie")
    assert res.rc == 0 and "bookie-server updatecookie" in res.out


# -- offline ------------------------------------------------------------------------------------------
def test_readjournal_and_lastmark(uri, cluster, bk):
    lh = bk.create_ledger(3, 3, 2)
    lh.add_entries([b"journal-%d" % i for i in range(5)])
    lh.close()
    # a bookie of the ledger's ensemble: the shared cluster may hold more bookies than E
    data_dir = cluster.bookie_data_dir(lh.metadata.current_ensemble[0])
    js = pybk("--json", "readjournal", "--data-dir", data_dir, "--ledger", lh.ledger_id)
    assert js.rc == 0, js.err
    adds = [r for r in js.json()["records"] if r["type"] == "ADD_BATCH"]
    assert adds and {r["ledger"] for r in js.json()["records"]} == {lh.ledger_id}
    assert sum(r["entries"] for r in adds) == 5
    assert any(r["type"] == "MASTER_KEY" for r in js.json()["records"])
    human = pybk("readjournal", "--data-dir", data_dir, "--max", "3")
    assert human.rc == 0 and human.out.splitlines()[0].split()[:3] == ["file", "offset", "type"]
    mark = pybk("--json", "lastmark", "--data-dir", data_dir)
    assert mark.rc == 0 and mark.json()["journal_file"].endswith(".jnl")
    assert "last mark" in pybk("lastmark", "--data-dir", data_dir).out or \
        "no checkpoint" in pybk("lastmark", "--data-dir", data_dir).out
    bad = pybk("readjournal", "--data-dir", "/nonexistent/bookie")
    one_line_error(bad, "/nonexistent/bookie/journal")


def test_offline_commands_on_odd_dirs(tmp_path):
    (tmp_path / "journal").mkdir()
    mark = pybk("--json", "lastmark", "--data-dir", tmp_path)
    assert mark.rc == 0 and mark.json()["checkpoint"] is False
    empty = pybk("readjournal", "--data-dir", tmp_path)
    assert empty.rc == 0 and "(no journal records)" in empty.out
    (tmp_path / "journal" / "0000000000000001.jnl").mkdir()     # not a file: OSError
    bad = pybk("readjournal", "--data-dir", tmp_path)
    one_line_error(bad, "0000000000000001.jnl")
    badjs = pybk("--json", "readjournal", "--data-dir", tmp_path)
    assert badjs.rc == 1 and badjs.json()["error"] == "IsADirectoryError"
    (tmp_path / "checkpoint.json").write_text("{not json")
    torn = pybk("lastmark", "--data-dir", tmp_path)
    one_line_error(torn, "checkpoint.json")
