"""A real bookie-server against a real etcd: registration, read-only
re-registration, cookies, GC."""
from __future__ import annotations

import json
import os
import shutil
import signal

import pytest

from pybk_spark.metadata.store import ledger_key
from pybk_spark.testing.bookie_process import entries_bytes, payload_for, read_all
from pybk_spark.wire import bookie_wire_pb2 as pb
from pybk_spark.testing.waiting import wait_until

pytestmark = pytest.mark.slow
KEY = b"key"


def test_registration_moves_with_disk_threshold_and_vanishes_on_kill(bookies, etcd_scope):
    uri, store = etcd_scope
    bp = bookies(metadata_uri=uri, conf={"disk_check_interval_s": 0.1,
                                         "registration_ttl_s": 2}).start()
    wkey, rkey = f"bookies/writable/{bp.bookie_id}", f"bookies/readonly/{bp.bookie_id}"
    reg = json.loads(wait_until(lambda: store.get(wkey), "writable registration").value)
    assert reg["address"] == bp.address and reg["state"] == "writable"
    assert store.get(rkey) is None
    # tiny threshold: read-only, re-registered as such
    bp.write_conf(disk_usage_threshold=0.0001, disk_usage_lwm=0.00005)
    bp.signal(signal.SIGHUP)
    wait_until(lambda: store.get(rkey) is not None and store.get(wkey) is None, "readonly key")
    stub = bp.stub()
    assert stub.AddEntries(pb.AddRequest(ledger_id=1, master_key=KEY,
                                         entries=entries_bytes(1, [0]))).code == pb.READ_ONLY
    # below the low-water mark again: writable
    bp.write_conf(disk_usage_threshold=0.99999, disk_usage_lwm=0.99998)
    bp.signal(signal.SIGHUP)
    wait_until(lambda: store.get(wkey) is not None and store.get(rkey) is None, "writable key")
    assert stub.AddEntries(pb.AddRequest(ledger_id=1, master_key=KEY,
                                         entries=entries_bytes(1, [0]))).code == 0
    # crash: the lease expires and the registration disappears
    bp.kill()
    wait_until(lambda: store.get(wkey) is None, "registration expiry after SIGKILL")
    # clean shutdown removes it at once
    bp.start()
    wait_until(lambda: store.get(wkey), "re-registration")
    assert bp.terminate() == 0
    assert store.get(wkey) is None


def test_cookie_refuses_wiped_data_dir_until_formatted(bookies, etcd_scope):
    uri, store = etcd_scope
    bp = bookies(metadata_uri=uri).start()
    assert bp.stub().AddEntries(pb.AddRequest(ledger_id=1, master_key=KEY,
                                              entries=entries_bytes(1, [0, 1]))).code == 0
    cookie = json.loads(store.get(f"cookies/{bp.bookie_id}").value)
    with open(os.path.join(bp.data_dir, "cookie.json")) as fh:
        assert json.load(fh)["instance_id"] == cookie["instance_id"]
    assert bp.terminate() == 0
    # the disk is wiped: the bookie must not rejoin silently
    shutil.rmtree(bp.data_dir)
    bp.start(wait=False)
    assert bp.wait_exit() == 2
    assert "wiped or is foreign" in bp.log_tail()
    # a foreign data dir (another instance's cookie) is refused too
    os.makedirs(bp.data_dir, exist_ok=True)   # the refused start made it (bookie.lock)
    with open(os.path.join(bp.data_dir, "cookie.json"), "w") as fh:
        json.dump({"bookie_id": bp.bookie_id, "instance_id": "someone-else", "version": 1}, fh)
    bp.start(wait=False)
    assert bp.wait_exit() == 2
    assert "cookie mismatch" in bp.log_tail()
    # escape hatch: format (confirmed: the dir holds a cookie), then it joins as a new
    # bookie whose id lost its data: an error for what it may have held, never "no such"
    assert bp.run_format().returncode == 2
    assert os.path.exists(os.path.join(bp.data_dir, "cookie.json"))
    res = bp.run_format("--yes")
    assert res.returncode == 0, res.stderr
    assert store.get(f"cookies/{bp.bookie_id}") is None
    bp.start()
    new_cookie = json.loads(store.get(f"cookies/{bp.bookie_id}").value)
    assert new_cookie["instance_id"] != cookie["instance_id"]
    assert bp.stub().ReadEntries(pb.ReadRequest(ledger_id=1, first_entry_id=0,
                                                last_entry_id=1)).code == pb.IO_ERROR


def test_gc_reclaims_deleted_ledger_only(bookies, etcd_scope):
    uri, store = etcd_scope
    live, dead = 11, 12
    for ledger in (live, dead):
        store.put_if_absent(ledger_key(ledger), b'{"test": true}')
    bp = bookies(metadata_uri=uri, conf={"gc_interval_s": 0.3, "flush_interval_s": 0.2,
                                         "segment_max_bytes": 64 * 1024,
                                         "compaction_min_live_ratio": 0.9}).start()
    stub = bp.stub()
    for i in range(20):
        for ledger in (live, dead):
            r = stub.AddEntries(pb.AddRequest(
                ledger_id=ledger, master_key=KEY,
                entries=entries_bytes(ledger, range(i * 50, i * 50 + 50), size=200)))
            assert r.code == 0
    seg_dir = os.path.join(bp.data_dir, "store", "segments")
    wait_until(lambda: os.listdir(seg_dir), "segments written")
    assert store.delete(ledger_key(dead))
    wait_until(lambda: dead not in stub.ListLedgers(pb.ListLedgersRequest()).ledger_ids,
               "GC of the deleted ledger")
    assert live in stub.ListLedgers(pb.ListLedgersRequest()).ledger_ids
    expected = {e: payload_for(live, e, 200) for e in range(1000)}
    assert read_all(stub, live, 0, 999) == expected
    assert stub.ReadEntries(pb.ReadRequest(ledger_id=dead, first_entry_id=0,
                                           last_entry_id=5)).code == pb.NO_SUCH_LEDGER
    # data is reclaimed on disk: segment bytes shrink to about the live ledger's share
    def seg_bytes():
        return sum(os.path.getsize(os.path.join(seg_dir, n)) for n in os.listdir(seg_dir))
    wait_until(lambda: seg_bytes() < 1000 * 200 * 1.6,
               f"segment space reclaimed: {sorted(os.listdir(seg_dir))} {seg_bytes()}")
    # and it stays deleted across a crash
    bp.kill()
    bp.start()
    stub = bp.stub()
    assert dead not in stub.ListLedgers(pb.ListLedgersRequest()).ledger_ids
    assert read_all(stub, live, 0, 999) == expected


def test_clean_stop_while_etcd_hangs(bookies, tmp_path):
    """SIGTERM while etcd answers nothing (a partition: SIGSTOPped etcd, so
    every RPC hangs until its timeout).  The bookie still shuts down cleanly
    and on its own: the unregistration is abandoned after the lease ttl (the
    lease expires by itself), and no background thread registers it again
    once etcd is back."""
    from pybk_spark.cluster.etcd_process import EtcdProcess
    from pybk_spark.metadata import open_store
    etcd = EtcdProcess(str(tmp_path / "etcd")).start()
    try:
        uri = etcd.uri("hang")
        bp = bookies(metadata_uri=uri, conf={"registration_ttl_s": 2, "gc_interval_s": 0.2,
                                             "disk_check_interval_s": 0.1}).start()
        store = open_store(uri)
        try:
            wkey = f"bookies/writable/{bp.bookie_id}"
            wait_until(lambda: store.get(wkey), "registration")
            os.kill(etcd.proc.pid, signal.SIGSTOP)
            try:
                wait_until(lambda: "event=lease_refresh_failed" in bp.log_tail(),
                           "a refresh round hanging on etcd")
                bp.signal(signal.SIGTERM)
                # LocalCluster's supervisor waits 15 s before SIGKILL, systemd 60 s
                code = bp.proc.wait(15)
            finally:
                os.kill(etcd.proc.pid, signal.SIGCONT)
            log = bp.log_tail(20000)
            assert code == 0, log
            assert "event=unregister_abandoned" in log and "event=bookie_stopped" in log, log
            wait_until(lambda: store.get(wkey) is None, "the abandoned lease expiring")
        finally:
            store.close()
    finally:
        etcd.stop()
