"""Request handling of a real bookie-server: typed errors, reads, long polls,
read-only mode, identity."""
from __future__ import annotations

import json
import os
import signal
import threading
import time

import pyarrow as pa
import pytest

from pybk_spark.testing.bookie_process import entries_bytes, payload_for, read_all
from pybk_spark.wire import bookie_wire_pb2 as pb
from pybk_spark.wire.entries import batch_from_bytes

pytestmark = pytest.mark.slow
KEY = b"key"


@pytest.fixture
def bookie(bookies):
    bp = bookies(conf={"max_entry_bytes": 4096, "max_batch_bytes": 1 << 20,
                       "max_read_entries": 50}).start()
    yield bp


def _add(stub, ledger, ids, key=KEY, recovery=False, lac=-1, **kw):
    return stub.AddEntries(pb.AddRequest(ledger_id=ledger, master_key=key, recovery=recovery,
                                         entries=entries_bytes(ledger, ids, lac=lac, **kw)))


def _ipc(table: pa.Table) -> bytes:
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as w:
        w.write_table(table)
    return sink.getvalue().to_pybytes()


def test_bad_requests_get_typed_codes_and_bookie_keeps_serving(bookie):
    stub = bookie.stub()
    assert _add(stub, 1, range(3)).code == 0
    wrong_types = _ipc(pa.table({"ledger_id": pa.array([1], pa.int32()),
                                 "entry_id": pa.array([3], pa.int64()),
                                 "lac": pa.array([0], pa.int64()),
                                 "payload": pa.array(["x"], pa.string()),
                                 "digest": pa.array([b""], pa.binary()),
                                 "length": pa.array([1], pa.int64())}))
    null_payload = _ipc(pa.table({"ledger_id": pa.array([1], pa.int64()),
                                  "entry_id": pa.array([3], pa.int64()),
                                  "lac": pa.array([0], pa.int64()),
                                  "payload": pa.array([None], pa.binary()),
                                  "digest": pa.array([b""], pa.binary()),
                                  "length": pa.array([1], pa.int64())}))
    cases = {
        "garbage": (pb.AddRequest(ledger_id=1, master_key=KEY, entries=b"\x00\x01garbage"),
                    pb.BAD_REQUEST),
        "truncated arrow": (pb.AddRequest(ledger_id=1, master_key=KEY,
                                          entries=entries_bytes(1, [3])[:-40]), pb.BAD_REQUEST),
        "wrong types": (pb.AddRequest(ledger_id=1, master_key=KEY, entries=wrong_types),
                        pb.BAD_REQUEST),
        "empty": (pb.AddRequest(ledger_id=1, master_key=KEY, entries=b""), pb.BAD_REQUEST),
        "null payload": (pb.AddRequest(ledger_id=1, master_key=KEY, entries=null_payload),
                         pb.BAD_REQUEST),
        "other ledger rows": (pb.AddRequest(ledger_id=1, master_key=KEY,
                                            entries=entries_bytes(2, [3])), pb.BAD_REQUEST),
        "descending ids": (pb.AddRequest(ledger_id=1, master_key=KEY,
                                         entries=entries_bytes(1, [5, 4])), pb.BAD_REQUEST),
        "negative id": (pb.AddRequest(ledger_id=1, master_key=KEY,
                                      entries=entries_bytes(1, [-1])), pb.BAD_REQUEST),
        "oversized entry": (pb.AddRequest(ledger_id=1, master_key=KEY,
                                          entries=entries_bytes(1, [3], size=5000)), pb.TOO_LARGE),
        "oversized batch": (pb.AddRequest(ledger_id=1, master_key=KEY,
                                          entries=entries_bytes(1, range(3, 400), size=4000)),
                            pb.TOO_LARGE),
        "wrong key": (pb.AddRequest(ledger_id=1, master_key=b"nope",
                                    entries=entries_bytes(1, [3])), pb.UNAUTHORIZED),
    }
    for name, (req, code) in cases.items():
        resp = stub.AddEntries(req)
        assert resp.code == code, f"{name}: got {resp.code} {resp.message}"
        assert resp.message, name
    assert stub.Fence(pb.FenceRequest(ledger_id=1, master_key=b"nope")).code == pb.UNAUTHORIZED
    assert stub.WriteLac(pb.WriteLacRequest(ledger_id=1, master_key=b"x", lac=1)).code == \
        pb.UNAUTHORIZED
    bad_read = stub.ReadEntries(pb.ReadRequest(ledger_id=1, first_entry_id=5, last_entry_id=2))
    assert bad_read.code == pb.BAD_REQUEST
    # same through the pipelined stream: one bad request does not break the stream
    reqs = [pb.AddRequest(ledger_id=1, master_key=KEY, entries=b"junk", request_id=1),
            pb.AddRequest(ledger_id=1, master_key=KEY, entries=entries_bytes(1, [3]),
                          request_id=2)]
    codes = {r.request_id: r.code for r in stub.AddStream(iter(reqs))}
    assert codes == {1: pb.BAD_REQUEST, 2: pb.OK}
    assert stub.Health(pb.HealthRequest()).serving
    assert read_all(stub, 1, 0, 10) == {e: payload_for(1, e) for e in range(4)}
    assert bookie.proc.poll() is None


def test_reads_duplicates_and_limits(bookie):
    stub = bookie.stub()
    assert stub.ReadEntries(pb.ReadRequest(ledger_id=5, first_entry_id=0,
                                           last_entry_id=3)).code == pb.NO_SUCH_LEDGER
    assert _add(stub, 5, range(0, 30), lac=-1).code == 0
    # duplicate add with different bytes: first copy kept, no error
    assert _add(stub, 5, range(20, 40), lac=19, payloads=[b"other"] * 20).code == 0
    assert _add(stub, 5, [45, 46]).code == 0
    got = read_all(stub, 5, 0, 100)
    assert got == {**{e: payload_for(5, e) for e in range(20)},
                   **{e: payload_for(5, e) for e in range(20, 30)},
                   **{e: b"other" for e in range(30, 40)}}
    r = stub.ReadEntries(pb.ReadRequest(ledger_id=5, first_entry_id=0, last_entry_id=200))
    assert r.code == 0 and r.end == pb.MISSING and batch_from_bytes(r.entries).num_rows == 40
    r = stub.ReadEntries(pb.ReadRequest(ledger_id=5, first_entry_id=0, last_entry_id=200,
                                        max_entries=10))
    assert r.end == pb.LIMIT and batch_from_bytes(r.entries).column(1).to_pylist() == \
        list(range(10))
    r = stub.ReadEntries(pb.ReadRequest(ledger_id=5, first_entry_id=0, last_entry_id=9))
    assert r.end == pb.COMPLETE and batch_from_bytes(r.entries).num_rows == 10
    r = stub.ReadEntries(pb.ReadRequest(ledger_id=5, first_entry_id=35, last_entry_id=200))
    assert r.end == pb.MISSING and batch_from_bytes(r.entries).column(1).to_pylist() == \
        list(range(35, 40))
    r = stub.ReadEntries(pb.ReadRequest(ledger_id=5, first_entry_id=41, last_entry_id=42))
    assert r.code == pb.NO_SUCH_ENTRY and r.lac == 19
    r = stub.ReadEntries(pb.ReadRequest(ledger_id=5, first_entry_id=0, last_entry_id=100,
                                        max_bytes=250))
    assert r.end == pb.LIMIT and batch_from_bytes(r.entries).num_rows == 2
    info = stub.GetBookieInfo(pb.BookieInfoRequest())
    assert info.entry_count == 42 and info.ledger_count == 1 and info.state == pb.WRITABLE
    assert list(stub.ListLedgers(pb.ListLedgersRequest()).ledger_ids) == [5]


def test_long_poll_read_lac(bookie):
    stub = bookie.stub()
    assert _add(stub, 8, [0, 1], lac=-1).code == 0
    # times out: returns the current value
    r = stub.ReadLac(pb.ReadLacRequest(ledger_id=8, wait_for_lac_above=5, timeout_ms=200))
    assert r.code == 0 and r.lac == -1 and r.last_entry_id == 1
    result = {}
    started = threading.Event()

    def poll():
        started.set()
        result["r"] = stub.ReadLac(pb.ReadLacRequest(ledger_id=8, wait_for_lac_above=0,
                                                     timeout_ms=60000))
    t = threading.Thread(target=poll)
    t.start()
    started.wait()
    # other RPCs are served while the poll waits
    assert stub.Health(pb.HealthRequest()).serving
    assert _add(stub, 8, [2], lac=0).code == 0          # LAC 0: not above 0 yet
    assert _add(stub, 8, [3], lac=2).code == 0          # LAC advances past 0: poll answers
    t.join(60)
    assert not t.is_alive()
    assert result["r"].lac == 2
    # explicit LAC also wakes pollers and is served
    assert stub.WriteLac(pb.WriteLacRequest(ledger_id=8, master_key=KEY, lac=3)).code == 0
    r = stub.ReadLac(pb.ReadLacRequest(ledger_id=8, wait_for_lac_above=2, timeout_ms=60000))
    assert r.lac == 3


def test_read_only_by_disk_threshold_and_back(bookies):
    bp = bookies(conf={"disk_usage_threshold": 0.0001, "disk_usage_lwm": 0.00005,
                       "disk_check_interval_s": 0.1}).start()
    stub = bp.stub()
    assert stub.GetBookieInfo(pb.BookieInfoRequest()).state == pb.READ_ONLY_STATE
    assert _add(stub, 1, [0]).code == pb.READ_ONLY
    # recovery adds (high priority) and fences still work on a read-only bookie
    assert _add(stub, 1, [0], recovery=True).code == 0
    assert stub.Fence(pb.FenceRequest(ledger_id=1, master_key=KEY)).code == 0
    assert read_all(stub, 1, 0, 0) == {0: payload_for(1, 0)}
    bp.write_conf(disk_usage_threshold=0.99999, disk_usage_lwm=0.99998)
    bp.signal(signal.SIGHUP)
    deadline = time.monotonic() + 60
    while stub.GetBookieInfo(pb.BookieInfoRequest()).state != pb.WRITABLE:
        assert time.monotonic() < deadline
        time.sleep(0.05)
    assert _add(stub, 2, [0]).code == 0
    assert bp.terminate() == 0


def test_clean_shutdown_and_foreign_data_dir(bookies, tmp_path):
    bp = bookies("b1").start()
    assert _add(bp.stub(), 1, range(3)).code == 0
    assert bp.terminate() == 0
    # same data dir under another identity: refused with a clear message
    other = bookies("b2")
    other.data_dir = bp.data_dir
    other.bookie_id = "someone-else"
    other.start(wait=False)
    assert other.wait_exit() == 2
    assert "refusing to start" in other.log_tail()
    # data without a cookie (foreign dir): refused
    os.unlink(os.path.join(bp.data_dir, "cookie.json"))
    bp.start(wait=False)
    assert bp.wait_exit() == 2
    # a data dir written in the entry format before ``length``: refused, saying why
    with open(os.path.join(bp.data_dir, "cookie.json"), "w") as fh:
        json.dump({"bookie_id": bp.bookie_id, "instance_id": "x", "version": 1}, fh)
    bp.start(wait=False)
    assert bp.wait_exit() == 2
    assert "cumulative length" in bp.log_tail()
    # original identity restored: starts and serves its data
    with open(os.path.join(bp.data_dir, "cookie.json"), "w") as fh:
        json.dump({"bookie_id": bp.bookie_id, "instance_id": "x", "version": 1,
                   "entry_format": 2}, fh)
    bp.start()
    assert read_all(bp.stub(), 1, 0, 5) == {e: payload_for(1, e) for e in range(3)}


def test_metrics_endpoint(bookies):
    import urllib.request
    from pybk_spark.testing.bookie_process import free_port
    port = free_port()
    bp = bookies(conf={"metrics_port": port}).start()
    stub = bp.stub()
    assert _add(stub, 1, range(10)).code == 0
    assert stub.ReadEntries(pb.ReadRequest(ledger_id=1, first_entry_id=0,
                                           last_entry_id=9)).code == 0
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=30).read().decode()
    for name in ("bookie_add_requests_total", "bookie_add_entries_total 10.0",
                 "bookie_read_entries_total 10.0", "bookie_journal_fdatasync_seconds_bucket",
                 "bookie_journal_group_requests_bucket", "bookie_journal_queue_depth",
                 "bookie_disk_usage_ratio", "bookie_add_latency_seconds_bucket",
                 "bookie_journal_live_bytes", "bookie_journal_page_cache_window_bytes"):
        assert name in text, name
    # the window holds the adds just journaled (default keep: 1 GiB, nothing dropped yet)
    held = [ln for ln in text.splitlines()
            if ln.startswith("bookie_journal_page_cache_window_bytes ")]
    assert held and float(held[0].split()[1]) > 0


def test_cancelled_stream_and_concurrent_clients(bookie):
    stub = bookie.stub()
    gate = threading.Event()

    def requests():
        for i in range(5):
            yield pb.AddRequest(ledger_id=20, master_key=KEY, request_id=i,
                                entries=entries_bytes(20, [i]))
        gate.wait(60)               # hold the stream open, then the client cancels it

    call = stub.AddStream(requests())
    got = [next(call) for _ in range(5)]
    assert all(r.code == 0 for r in got)
    call.cancel()
    gate.set()
    # many concurrent unary and streaming clients on different ledgers
    results = []

    def unary(ledger):
        for i in range(20):
            results.append(_add(stub, ledger, [i]).code)

    def streaming(ledger):
        reqs = (pb.AddRequest(ledger_id=ledger, master_key=KEY, request_id=i,
                              entries=entries_bytes(ledger, range(i * 10, i * 10 + 10)))
                for i in range(20))
        results.extend(r.code for r in stub.AddStream(reqs))
    threads = [threading.Thread(target=unary, args=(30 + k,)) for k in range(4)] + \
              [threading.Thread(target=streaming, args=(40 + k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert sorted(results) == [0] * 160
    for k in range(4):
        assert read_all(stub, 30 + k, 0, 100) == {e: payload_for(30 + k, e) for e in range(20)}
        assert read_all(stub, 40 + k, 0, 500) == {e: payload_for(40 + k, e) for e in range(200)}
    assert read_all(stub, 20, 0, 10) == {e: payload_for(20, e) for e in range(5)}
    assert stub.Health(pb.HealthRequest()).serving


def test_stream_answers_lone_adds_and_bursts_each_once(bookie):
    """One AddStream carries lone adds (each waits for its answer), a burst
    of batches past the leader path's size (the journal's writer thread
    takes them) and lone adds again: every request is answered once, with
    its own id."""
    stub = bookie.stub()
    answered = threading.Semaphore(0)

    def requests():
        for i in range(5):                    # lone: wait for each answer
            yield pb.AddRequest(ledger_id=60, master_key=KEY, request_id=i,
                                entries=entries_bytes(60, [i]))
            answered.acquire()
        for i in range(5, 45):                # a burst of 70 KB batches (past the
            yield pb.AddRequest(                # leader path's 64 KiB: journal pipeline)
                ledger_id=61, master_key=KEY, request_id=i,
                entries=entries_bytes(61, range((i - 5) * 50, (i - 4) * 50), size=1400))
        for i in range(45, 50):               # lone again
            yield pb.AddRequest(ledger_id=60, master_key=KEY, request_id=i,
                                entries=entries_bytes(60, [i - 40]))

    got = {}
    for resp in stub.AddStream(requests()):
        got[resp.request_id] = resp.code
        if resp.request_id < 5:
            answered.release()
    assert got == {i: pb.OK for i in range(50)}
    assert read_all(stub, 60, 0, 20) == {e: payload_for(60, e) for e in range(10)}
    assert len(read_all(stub, 61, 0, 2000)) == 2000
