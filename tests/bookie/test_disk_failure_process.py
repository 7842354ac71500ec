"""Storage failure in a real bookie-server process against a real etcd:
a real disk-full (a size-limited tmpfs as the data dir) and an injected EIO
(the test-only entry point tests/chaos/faulty_bookie.py).  Every acknowledged
entry reads back, the bookie registers read-only, adds and fences are refused
with READ_ONLY, reads are served, and a restart replays the journal."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

from pybk_spark.testing.bookie_process import entries_bytes, payload_for, read_all
from pybk_spark.wire import bookie_wire_pb2 as pb
from pybk_spark.testing.waiting import wait_until

pytestmark = pytest.mark.slow
KEY = b"key"
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
FAULTY_BOOKIE = os.path.join(ROOT, "tests", "chaos", "faulty_bookie.py")
# the disk checker must not turn the bookie read-only before the disk is full:
# these tests are about the journal failing, not the usage threshold
CONF = {"disk_usage_threshold": 1.0, "disk_usage_lwm": 0.99, "disk_check_interval_s": 3600,
        "flush_interval_s": 3600, "registration_ttl_s": 2}


def _registered(store, bookie_id: str, read_only: bool):
    want = f"bookies/{'readonly' if read_only else 'writable'}/{bookie_id}"
    other = f"bookies/{'writable' if read_only else 'readonly'}/{bookie_id}"
    wait_until(lambda: store.get(want) is not None and store.get(other) is None,
               f"registration {want}")


def _add(stub, ledger: int, ids: list[int], lac: int, size: int = 100):
    return stub.AddEntries(pb.AddRequest(ledger_id=ledger, master_key=KEY,
                                         entries=entries_bytes(ledger, ids, lac=lac, size=size)),
                           timeout=60)


def _check_failed_bookie(bp, store, ledger: int, acked: list[int], errno_name: str, op: str):
    """Read-only in etcd, adds/fences refused READ_ONLY, every acked entry served."""
    _registered(store, bp.bookie_id, read_only=True)
    stub = bp.stub()
    nxt = acked[-1] + 1
    assert _add(stub, ledger, [nxt], acked[-1]).code == pb.READ_ONLY
    r = stub.AddEntries(pb.AddRequest(ledger_id=ledger, master_key=KEY, recovery=True,
                                      entries=entries_bytes(ledger, [nxt], lac=acked[-1])))
    assert r.code == pb.READ_ONLY
    assert stub.ReadLac(pb.ReadLacRequest(ledger_id=ledger, fence=True, master_key=KEY,
                                          wait_for_lac_above=-2)).code == pb.READ_ONLY
    assert stub.GetBookieInfo(pb.BookieInfoRequest()).state == pb.READ_ONLY_STATE
    got = read_all(stub, ledger, 0, acked[-1])
    assert sorted(got) == acked
    assert all(got[e] == payload_for(ledger, e, len(got[e])) for e in acked)
    log = bp.log_tail(200_000)
    failed = [line for line in log.splitlines() if "event=journal_failed" in line]
    assert len(failed) == 1 and f"op={op}" in failed[0] and f"errno={errno_name}" in failed[0], \
        failed
    assert f"path={bp.data_dir}" in failed[0]


def test_disk_full_tmpfs_turns_the_bookie_read_only_and_loses_no_ack(tmp_path, bookies,
                                                                       etcd_scope):
    uri, store = etcd_scope
    mnt = tmp_path / "data"          # the data dir IS the mount: conf and log stay outside
    mnt.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=8m", "tmpfs", str(mnt)],
                          capture_output=True, text=True)
    if done.returncode != 0:
        print(f"cannot mount a tmpfs: {done.stderr.strip()}", file=sys.stderr)
        pytest.skip(f"mount -t tmpfs not permitted: {done.stderr.strip()}")
    bp = None
    try:
        bp = bookies("data", metadata_uri=uri, conf=dict(CONF)).start()
        _registered(store, bp.bookie_id, read_only=False)
        stub = bp.stub()
        ledger, acked, codes = 11, [], []
        entry, size, per_add = 0, 20_000, 10          # 200 KB adds
        while len(codes) < 2:                         # the failing add, then a refused one
            ids = list(range(entry, entry + per_add))
            r = _add(stub, ledger, ids, acked[-1] if acked else -1, size)
            if r.code == 0:
                assert (r.first_entry_id, r.last_entry_id) == (ids[0], ids[-1])
                acked.extend(ids)
                entry += per_add
            else:
                codes.append(r.code)
            assert entry < 100_000, "the 8 MB tmpfs never filled up"
        assert codes[0] in (pb.IO_ERROR, pb.READ_ONLY) and codes[1] == pb.READ_ONLY, codes
        assert len(acked) > 100
        _check_failed_bookie(bp, store, ledger, acked, "ENOSPC", "write")
        # the operator frees space (here: grows the tmpfs) and restarts the bookie
        subprocess.run(["mount", "-o", "remount,size=64m", str(mnt)], check=True)
        assert bp.stub().GetBookieInfo(pb.BookieInfoRequest()).state == pb.READ_ONLY_STATE
        assert bp.terminate() == 0
        bp.start()
        _registered(store, bp.bookie_id, read_only=False)
        stub = bp.stub()
        got = read_all(stub, ledger, 0, acked[-1])
        assert sorted(got) == acked
        nxt = acked[-1] + 1
        r = _add(stub, ledger, list(range(nxt, nxt + per_add)), acked[-1], size)
        assert r.code == 0
    finally:
        if bp is not None:
            bp.kill()               # the mount must be free before umount
        if subprocess.run(["umount", str(mnt)]).returncode != 0:
            subprocess.run(["umount", "-l", str(mnt)])


def test_injected_eio_fails_the_group_and_a_restart_replays(tmp_path, bookies, etcd_scope):
    uri, store = etcd_scope
    trigger = tmp_path / "fail-fsync"
    bp = bookies("b1", metadata_uri=uri, conf=dict(CONF),
                 command=[sys.executable, FAULTY_BOOKIE, "--fault",
                          f"eio_fsync_when={trigger}"]).start()
    _registered(store, bp.bookie_id, read_only=False)
    stub = bp.stub()
    ledger = 5
    for e in range(10):
        assert _add(stub, ledger, [e], e - 1).code == 0
    trigger.touch()                                  # the disk "fails"
    r = _add(stub, ledger, [10], 9)
    assert r.code in (pb.IO_ERROR, pb.READ_ONLY), r
    acked = list(range(10))
    _check_failed_bookie(bp, store, ledger, acked, "EIO", "fdatasync")
    # restart (the disk is "fixed"): the journal is replayed, acked entries served
    trigger.unlink()
    bp.restart()
    _registered(store, bp.bookie_id, read_only=False)
    stub = bp.stub()
    got = read_all(stub, ledger, 0, 10)
    assert sorted(got)[:10] == acked       # 10 was never acked; it may exist (BK's model)
    lac = stub.ReadLac(pb.ReadLacRequest(ledger_id=ledger, wait_for_lac_above=-2))
    assert lac.code == 0 and lac.lac in (8, 9)
    assert _add(stub, ledger, [11], 9).code == 0
