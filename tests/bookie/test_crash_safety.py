"""Crash safety of a real bookie-server: SIGKILL mid-stream, fences, torn journals."""
from __future__ import annotations

import os
import threading
import time

import pytest

from bookie_server.journal.journal import HEADER, file_name, list_files
from pybk_spark.testing.bookie_process import entries_bytes, payload_for, read_all
from pybk_spark.wire import bookie_wire_pb2 as pb

pytestmark = pytest.mark.slow
KEY = b"k" * 32


def _wait_for(pred, timeout=60.0, what="condition"):
    deadline = time.monotonic() + timeout
    while not pred():
        if time.monotonic() > deadline:
            raise TimeoutError(what)
        time.sleep(0.01)


def test_sigkill_mid_stream_keeps_every_acked_entry(bookies):
    # a tiny checkpoint interval so both segments and journal replay are exercised
    bp = bookies(conf={"flush_interval_s": 0.2, "segment_max_bytes": 256 * 1024}).start()
    stub = bp.stub()
    acked: list[tuple[int, int]] = []
    sent_sizes = {}
    stop = threading.Event()

    def requests():
        n = 0
        while not stop.is_set() and n < 100000:
            ids = range(n * 20, n * 20 + 20)
            sent_sizes[n] = 20
            yield pb.AddRequest(ledger_id=7, master_key=KEY, request_id=n,
                                entries=entries_bytes(7, ids, lac=n * 20 - 1, size=200))
            n += 1

    def client():
        try:
            for resp in stub.AddStream(requests()):
                if resp.code == 0:
                    acked.append((resp.first_entry_id, resp.last_entry_id))
        except Exception:  # noqa: BLE001 - the stream dies with the bookie
            pass

    t = threading.Thread(target=client)
    t.start()
    _wait_for(lambda: len(acked) >= 300, what="acks")
    bp.kill()                                   # crash while the stream is running
    stop.set()
    t.join(60)
    assert len(acked) >= 300
    bp.start()
    stub = bp.stub()
    max_acked = max(last for _, last in acked)
    got = read_all(stub, 7, 0, max_acked)
    for first, last in acked:
        for e in range(first, last + 1):
            assert got.get(e) == payload_for(7, e, 200), f"acked entry {e} lost or changed"
    lac = stub.ReadLac(pb.ReadLacRequest(ledger_id=7, wait_for_lac_above=-2))
    assert lac.code == 0 and lac.last_entry_id >= max_acked


def test_fence_survives_sigkill(bookies):
    bp = bookies(conf={"flush_interval_s": 3600}).start()
    stub = bp.stub()
    assert stub.AddEntries(pb.AddRequest(ledger_id=3, master_key=KEY,
                                         entries=entries_bytes(3, range(5), lac=-1))).code == 0
    fr = stub.Fence(pb.FenceRequest(ledger_id=3, master_key=KEY))
    assert fr.code == 0 and fr.last_entry_id == 4
    # a fence-read on a ledger this bookie never saw must persist too
    r = stub.ReadLac(pb.ReadLacRequest(ledger_id=4, fence=True, master_key=KEY))
    assert r.code == 0 and r.fenced
    bp.kill()
    bp.start()
    stub = bp.stub()
    for ledger in (3, 4):
        plain = stub.AddEntries(pb.AddRequest(ledger_id=ledger, master_key=KEY,
                                              entries=entries_bytes(ledger, [5])))
        assert plain.code == pb.FENCED
        rec = stub.AddEntries(pb.AddRequest(ledger_id=ledger, master_key=KEY, recovery=True,
                                            entries=entries_bytes(ledger, [5])))
        assert rec.code == 0
        wrong = stub.AddEntries(pb.AddRequest(ledger_id=ledger, master_key=b"bad", recovery=True,
                                              entries=entries_bytes(ledger, [6])))
        assert wrong.code == pb.UNAUTHORIZED
    assert read_all(stub, 3, 0, 10) == {e: payload_for(3, e) for e in range(6)}


def _records(path: str) -> list[tuple[int, int]]:
    """(offset, total length) of every framed record in a journal file."""
    out, pos = [], 0
    with open(path, "rb") as fh:
        data = fh.read()
    while pos + HEADER.size <= len(data):
        length, crc, rtype = HEADER.unpack_from(data, pos)
        if rtype == 0:
            break
        out.append((pos, HEADER.size + length))
        pos += HEADER.size + length
    return out


@pytest.mark.parametrize("damage", ["truncate", "corrupt", "garbage_header"])
def test_damaged_journal_tail_is_dropped(bookies, damage):
    bp = bookies(conf={"flush_interval_s": 3600}).start()
    stub = bp.stub()
    for i in range(5):
        r = stub.AddEntries(pb.AddRequest(ledger_id=9, master_key=KEY,
                                          entries=entries_bytes(9, range(i * 10, i * 10 + 10))))
        assert r.code == 0
    bp.kill()
    jdir = os.path.join(bp.data_dir, "journal")
    path = os.path.join(jdir, file_name(list_files(jdir)[-1]))
    recs = _records(path)
    last_off, last_len = recs[-1]
    with open(path, "r+b") as fh:
        if damage == "truncate":
            fh.truncate(last_off + last_len // 2)
        elif damage == "corrupt":
            fh.seek(last_off + last_len - 5)
            b = fh.read(1)
            fh.seek(last_off + last_len - 5)
            fh.write(bytes([b[0] ^ 0xFF]))
        else:
            fh.seek(last_off)
            fh.write(b"\xff" * HEADER.size)
    bp.start()
    stub = bp.stub()
    got = read_all(stub, 9, 0, 100)
    assert got == {e: payload_for(9, e) for e in range(40)}, "damaged record must be dropped"
    # the bookie keeps working: the lost batch can be written again and read back
    assert stub.AddEntries(pb.AddRequest(ledger_id=9, master_key=KEY,
                                         entries=entries_bytes(9, range(40, 50)))).code == 0
    bp.kill()
    bp.start()
    assert read_all(bp.stub(), 9, 0, 100) == {e: payload_for(9, e) for e in range(50)}
    assert "journal_tail_truncated" in bp.log_tail(20000)
