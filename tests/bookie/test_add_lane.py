"""The bookie's add lane (wire/lane_frames.py) and its read connections against
a real bookie-server, spoken to over raw sockets: the same answers as the
gRPC calls, and bad
input (wrong magic, garbage, oversized or torn frames) gets a typed answer
or a closed connection, never a stopped bookie."""
from __future__ import annotations

import socket
import threading

import pytest

from pybk_spark.testing.bookie_process import entries_bytes, free_port, payload_for, read_all
from pybk_spark.wire.entries import batch_from_bytes, entry_record_head, to_entries
from pybk_spark.wire.frame_socket import read_frame, read_frame_into
from pybk_spark.wire import lane_frames
from pybk_spark.wire import bookie_wire_pb2 as pb
from pybk_spark.wire import framing

pytestmark = pytest.mark.slow
KEY = b"key"
LIMIT = (1 << 20) + (4 << 20)          # the bookie's message limit: max_batch_bytes + 4 MiB


@pytest.fixture
def bookie(bookies):
    bp = bookies(conf={"max_entry_bytes": 4096, "max_batch_bytes": 1 << 20,
                       "add_lane_port": free_port()}).start()
    yield bp


def _connect(bp, hello=None) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", int(bp.conf["add_lane_port"])), timeout=30)
    sock.sendall(lane_frames.hello(bp.bookie_id) if hello is None else hello)
    return sock


def _request(ledger, ids, request_id, key=KEY, **kw) -> bytes:
    head = pb.AddRequest(ledger_id=ledger, master_key=key, request_id=request_id)
    return lane_frames.frame(*framing.payload_parts(head, entries_bytes(ledger, ids, **kw)))


def _answers(sock, n):
    with sock.makefile("rb") as stream:
        return [lane_frames.parse_add_answer(read_frame(stream, 1 << 20)) for _ in range(n)]


def _serving(bp) -> bool:
    return bp.stub().Health(pb.HealthRequest(), timeout=10).serving


def test_lane_answers_like_the_grpc_calls(bookie):
    stub = bookie.stub()
    with _connect(bookie) as sock:
        sock.sendall(_request(7, [0, 1, 2], 11) + _request(7, [3], 12)
                     + _request(7, [4], 13, key=b"wrong")
                     + _request(8, [0], 14, size=8192))
        got = {a.request_id: a for a in _answers(sock, 4)}
    assert (got[11].code, got[11].first_entry_id, got[11].last_entry_id) == (pb.OK, 0, 2)
    assert (got[12].code, got[12].first_entry_id, got[12].last_entry_id) == (pb.OK, 3, 3)
    assert got[13].code == pb.UNAUTHORIZED
    assert got[14].code == pb.TOO_LARGE
    # the same requests over gRPC get the same codes
    assert stub.AddEntries(pb.AddRequest(ledger_id=7, master_key=b"wrong",
                                         entries=entries_bytes(7, [5]))).code == pb.UNAUTHORIZED
    big = stub.AddEntries(pb.AddRequest(ledger_id=8, master_key=KEY,
                                        entries=entries_bytes(8, [0], size=8192)))
    assert big.code == pb.TOO_LARGE


def test_wrong_magic_is_refused_and_the_bookie_keeps_serving(bookie):
    with _connect(bookie, hello=b"GET / HTTP/1.1\r\n\r\n") as sock:
        assert sock.recv(100) == b""             # closed, nothing answered
    assert _serving(bookie)


def test_a_connection_meant_for_another_bookie_is_refused(bookie):
    """An address can outlive its bookie (a new port after a restart, taken
    by another): adds must never be acknowledged by the wrong bookie."""
    with _connect(bookie, hello=lane_frames.hello("127.0.0.1:1")) as sock:
        sock.sendall(_request(10, [0], 1))
        with sock.makefile("rb") as stream:
            answers = []
            while (body := read_frame(stream, 1 << 20)) is not None:
                answers.append(lane_frames.parse_add_answer(body))
    assert [(a.request_id, a.code) for a in answers] == [
        (lane_frames.CONNECTION_REQUEST_ID, pb.BAD_REQUEST)]
    assert "not 127.0.0.1:1" in answers[0].message
    with _connect(bookie) as sock:               # the add never happened
        sock.sendall(_request(10, [0], 2))
        assert _answers(sock, 1)[0].code == pb.OK


@pytest.mark.parametrize("bad", ["garbage", "oversized", "torn"])
def test_bad_frames_get_a_connection_answer_then_a_close(bookie, bad):
    with _connect(bookie) as sock:
        good = _request(9, [0], 1)
        if bad == "garbage":
            sock.sendall(good + lane_frames.frame(b"\xff" * 40))
        elif bad == "oversized":
            sock.sendall(good + (LIMIT + 1).to_bytes(4, "little"))
        else:                                    # a frame cut short, then the client leaves
            sock.sendall(good + _request(9, [1], 2)[:30])
            sock.shutdown(socket.SHUT_WR)
        with sock.makefile("rb") as stream:
            answers = []
            while (body := read_frame(stream, 1 << 20)) is not None:
                answers.append(lane_frames.parse_add_answer(body))
    # the add before the bad frame is answered too, before the refusal or
    # after it (the connection drains its adds before it closes)
    assert sorted((a.request_id, a.code) for a in answers) == [
        (lane_frames.CONNECTION_REQUEST_ID, pb.BAD_REQUEST), (1, pb.OK)]
    assert _serving(bookie)
    with _connect(bookie) as sock:               # and a new connection works
        sock.sendall(_request(9, [1], 3))
        assert _answers(sock, 1)[0].code == pb.OK


def test_lane_off(bookies):
    bp = bookies(conf={"add_lane_port": -1}).start()
    assert "add_lane_port=-1" in open(bp.log_path).read()
    assert _serving(bp)


def test_lane_metrics(bookies):
    import urllib.request
    port = free_port()
    bp = bookies(conf={"metrics_port": port, "add_lane_port": free_port()}).start()

    def metric(name):
        text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics",
                                      timeout=30).read().decode()
        return [float(ln.split()[1]) for ln in text.splitlines() if ln.startswith(name + " ")]

    with _connect(bp) as sock:
        sock.sendall(_request(11, [0], 1))
        assert _answers(sock, 1)[0].code == pb.OK
        assert metric("bookie_add_lane_connections") == [1.0]
    with _connect(bp, hello=b"nonsense") as sock:
        assert sock.recv(100) == b""
    with _connect(bp, hello=lane_frames.hello("someone-else")) as sock:
        with sock.makefile("rb") as stream:
            while read_frame(stream, 1 << 20) is not None:
                pass
    assert metric("bookie_add_lane_refused_total") == [2.0]
    assert metric('bookie_add_requests_total{outcome="ok"}') == [1.0]


# -- read connections (READ_MAGIC) --------------------------------------------------------
def _read_request(ledger, first, last, request_id, key=b"", **kw) -> bytes:
    return lane_frames.frame(pb.ReadRequest(ledger_id=ledger, first_entry_id=first,
                                         last_entry_id=last, master_key=key,
                                         request_id=request_id, **kw).SerializeToString())


def _read_answers(sock, n):
    with sock.makefile("rb") as stream:
        return [framing.parse_read_response(read_frame_into(stream, 64 << 20))
                for _ in range(n)]


def test_read_connection_answers_like_read_entries_in_order(bookie):
    with _connect(bookie) as sock:
        sock.sendall(_request(20, list(range(6)), 1))
        assert _answers(sock, 1)[0].code == pb.OK
    stub = bookie.stub()
    with _connect(bookie, hello=lane_frames.hello(bookie.bookie_id, lane_frames.READ_MAGIC)) as sock:
        # pipelined: answered one at a time, in the order sent, each with its id
        sock.sendall(_read_request(20, 0, 5, 31) + _read_request(20, 2, 3, 32)
                     + _read_request(20, 9, 9, 33) + _read_request(21, 0, 0, 34)
                     + _read_request(20, 0, 5, 35, max_entries=2))
        got = _read_answers(sock, 5)
    assert [a.request_id for a in got] == [31, 32, 33, 34, 35]
    assert [a.code for a in got] == [pb.OK, pb.OK, pb.NO_SUCH_ENTRY, pb.NO_SUCH_LEDGER, pb.OK]
    assert (got[4].end, got[0].end) == (pb.LIMIT, pb.COMPLETE)
    for answer, (first, last, limit) in zip((got[0], got[1], got[4]),
                                            ((0, 5, 0), (2, 3, 0), (0, 5, 2))):
        over_grpc = framing.parse_read_response(stub.ReadEntries(pb.ReadRequest(
            ledger_id=20, first_entry_id=first, last_entry_id=last,
            max_entries=limit)).SerializeToString())
        assert (bytes(answer.entries), answer.lac, answer.end) == \
            (bytes(over_grpc.entries), over_grpc.lac, over_grpc.end)
        assert batch_from_bytes(answer.entries).column("entry_id").to_pylist() == \
            list(range(first, (first + limit) if limit else last + 1))


@pytest.mark.parametrize("bad", ["garbage", "wrong bookie"])
def test_bad_read_connections_get_a_read_answer_then_a_close(bookie, bad):
    if bad == "wrong bookie":
        hello = lane_frames.hello("127.0.0.1:1", lane_frames.READ_MAGIC)
        request = _read_request(20, 0, 0, 1)
    else:
        hello = lane_frames.hello(bookie.bookie_id, lane_frames.READ_MAGIC)
        request = lane_frames.frame(b"\xff" * 40)
    with _connect(bookie, hello=hello) as sock:
        sock.sendall(request)
        with sock.makefile("rb") as stream:
            answers = []
            while (body := read_frame_into(stream, 64 << 20)) is not None:
                answers.append(framing.parse_read_response(body))
    assert [(a.request_id, a.code) for a in answers] == [
        (lane_frames.CONNECTION_REQUEST_ID, pb.BAD_REQUEST)]
    assert _serving(bookie)


def test_a_silent_connection_is_closed_after_the_hello_timeout(bookies):
    bp = bookies(conf={"add_lane_port": free_port(), "lane_hello_timeout_s": 0.5}).start()
    with socket.create_connection(("127.0.0.1", int(bp.conf["add_lane_port"])),
                                  timeout=30) as sock:
        sock.sendall(lane_frames.MAGIC)                 # and then nothing
        assert sock.recv(100) == b""                 # closed by the bookie, nothing answered
    assert "event=add_lane_hello_timeout" in open(bp.log_path).read()
    with _connect(bp) as sock:                       # a client that says hello is served
        sock.sendall(_request(30, [0], 1))
        assert _answers(sock, 1)[0].code == pb.OK


def test_connections_over_the_cap_are_refused_at_accept(bookies):
    bp = bookies(conf={"add_lane_port": free_port(), "lane_max_connections": 2}).start()
    held = [_connect(bp), _connect(bp)]
    try:
        for i, sock in enumerate(held):              # both are served
            sock.sendall(_request(31, [i], i + 1))
            assert _answers(sock, 1)[0].code == pb.OK
        with _connect(bp) as third:                  # closed at accept (its hello unread:
            try:                                     # a reset, or an end of stream)
                assert third.recv(100) == b""
            except ConnectionResetError:
                pass
    finally:
        for sock in held:
            sock.close()
    assert "event=add_lane_full" in open(bp.log_path).read()
    assert _serving(bp)


# -- entry frames (a lone add as the record its writer framed) ------------------------------
def _entry(ledger, entry_id, request_id, key=KEY, size=100, lac=-1, recovery=False) -> bytes:
    payload = bytes([entry_id % 251]) * size
    head = entry_record_head(ledger, entry_id, lac, size * (entry_id + 1), b"dgst")
    return lane_frames.entry_frame(request_id, recovery, key, head, payload)


def test_entry_frames_answer_like_add_requests_and_survive_a_restart(bookie):
    with _connect(bookie) as sock:
        sock.sendall(_entry(30, 0, 1) + _entry(30, 1, 2, lac=0) + _request(30, [2], 3)
                     + _entry(30, 3, 4, key=b"wrong") + _entry(30, 3, 5, size=8192)
                     + _entry(30, -1, 6) + _entry(30, 1, 7))
        got = {a.request_id: a for a in _answers(sock, 7)}
    assert [(got[i].code, got[i].first_entry_id, got[i].last_entry_id) for i in (1, 2, 3)] == [
        (pb.OK, 0, 0), (pb.OK, 1, 1), (pb.OK, 2, 2)]
    # an entry frame's OK answer is the compact entry answer; an AddRequest's is an AddResponse
    assert [type(got[i]) for i in (1, 2, 3, 4)] == [lane_frames.EntryAnswer] * 2 + [
        pb.AddResponse] * 2
    assert (got[2].ledger_id, got[2].message) == (30, "")
    assert got[4].code == pb.UNAUTHORIZED
    assert got[5].code == pb.TOO_LARGE
    assert got[6].code == pb.BAD_REQUEST
    assert got[7].code == pb.OK                 # a duplicate: the first copy is kept

    def stored():
        r = bookie.stub().ReadEntries(pb.ReadRequest(ledger_id=30, first_entry_id=0,
                                                     last_entry_id=9), timeout=60)
        assert (r.code, r.lac) == (pb.OK, 0)
        return to_entries(batch_from_bytes(r.entries))
    before = stored()
    assert [(e.entry_id, e.payload, e.length) for e in before] == [
        (0, b"\0" * 100, 100), (1, b"\1" * 100, 200), (2, payload_for(30, 2, 100), 100)]
    bookie.kill()                                # no checkpoint: the journal is replayed
    bookie.start()
    assert stored() == before


def test_a_torn_entry_frame_closes_the_connection(bookie):
    with _connect(bookie) as sock:
        sock.sendall(lane_frames.frame(b"\0\0\1"))
        with sock.makefile("rb") as stream:
            answers = []
            while (body := read_frame(stream, 1 << 20)) is not None:
                answers.append(lane_frames.parse_add_answer(body))
    assert [(a.request_id, a.code) for a in answers] == [
        (lane_frames.CONNECTION_REQUEST_ID, pb.BAD_REQUEST)]
    assert _serving(bookie)


@pytest.mark.parametrize("slots", [64, 4])
def test_a_burst_of_entry_frames_is_journaled_as_a_group(bookies, slots):
    """Lone adds that arrive together on one connection (a pipelining
    client's, queued while the bookie was busy) share fdatasyncs: the
    burst's last add leads them as one group, not one group per add.  With
    fewer add slots than the burst, the connection thread leads what it
    queued before it waits for a slot.  Batches: test_add_bursts.py."""
    import urllib.request
    port = free_port()
    bp = bookies(conf={"metrics_port": port, "add_lane_port": free_port(),
                       "max_inflight_per_stream": slots}).start()

    def metric(name):
        text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics",
                                      timeout=30).read().decode()
        return sum(float(ln.split()[1]) for ln in text.splitlines() if ln.startswith(name + " "))

    groups = metric("bookie_journal_group_requests_count")
    with _connect(bp) as sock:
        sock.sendall(_entry(40, 0, 1))               # the key record: a group of its own
        assert _answers(sock, 1)[0].code == pb.OK
        groups = metric("bookie_journal_group_requests_count")
        n = 40
        sock.sendall(b"".join(_entry(40, i, 100 + i, lac=i - 1) for i in range(1, n + 1)))
        got = _answers(sock, n)
    assert sorted(a.request_id for a in got) == [100 + i for i in range(1, n + 1)]
    assert {a.code for a in got} == {pb.OK}
    # with 4 slots the burst needs at least n // 4 groups; the journal's
    # writer taking a group while the thread waits for a slot adds some on
    # a busy machine, still far from one group per add
    assert metric("bookie_journal_group_requests_count") - groups <= (n // 4 if slots > n
                                                                      else n // 2)


def test_batches_of_megabytes_land_where_the_journal_writes_them_and_read_back(bookies):
    """AddRequest frames of ``_POOLED_FRAME_MIN`` and more are received with
    their entries in a journal record space (lane_server ``_place_add``):
    pipelined with small ones and a lone add between them, each is answered
    in order and reads back byte for byte, before and after a restart."""
    bp = bookies(conf={"add_lane_port": free_port()}).start()
    sizes = {0: 600_000, 1: 700_000, 2: 16, 3: 900_000, 4: 1_200_000}   # entries 0-1, 3-4: 2+ MiB
    with _connect(bp) as sock:
        frames = [_request(30, [0, 1], 1, payloads=[payload_for(30, 0, sizes[0]),
                                                    payload_for(30, 1, sizes[1])]),
                  lane_frames.entry_frame(2, False, KEY, entry_record_head(30, 2, -1, 0, b"d"),
                                          payload_for(30, 2, sizes[2])),
                  _request(30, [3, 4], 3, payloads=[payload_for(30, 3, sizes[3]),
                                                    payload_for(30, 4, sizes[4])])]
        sock.sendall(b"".join(frames))
        got = _answers(sock, 3)
    assert [a.code for a in got] == [pb.OK] * 3
    for restarted in (False, True):
        if restarted:
            bp.restart()
        back = read_all(bp.stub(), 30, 0, 4)
        assert back == {e: payload_for(30, e, n) for e, n in sizes.items()}, restarted


def test_a_large_add_frame_is_received_apart_into_a_record_space():
    """``frame_bodies`` offers ``_place_add`` each large frame its ``recv``
    cut off: an AddRequest comes back as its other fields and a
    ``RecordSpace`` holding its entries; an entry frame of the same size is
    left to the pool as a whole body."""
    from bookie_server.serving.lane_server import _POOLED_FRAME_MIN, PlacedAdd, _place_add
    from pybk_spark.wire.frame_socket import frame_bodies

    entries = entries_bytes(40, [0, 1], size=_POOLED_FRAME_MIN)
    add = _request(40, [0, 1], 9, size=_POOLED_FRAME_MIN)
    lone = lane_frames.entry_frame(10, False, KEY, entry_record_head(40, 2, -1, 0, b"d"),
                                   b"x" * _POOLED_FRAME_MIN)
    a, b = socket.socketpair()
    with a, b:
        sender = threading.Thread(target=a.sendall, args=(add + lone + _request(40, [3], 11),))
        sender.start()
        bodies = frame_bodies(b, LIMIT, LIMIT, take_min=_POOLED_FRAME_MIN, place=_place_add)
        placed, whole, small = next(bodies), next(bodies), next(bodies)
        sender.join()
    assert isinstance(placed, PlacedAdd)
    req = framing.parse_head(pb.AddRequest, placed.head, placed.space.body())
    assert (req.ledger_id, req.request_id, req.master_key) == (40, 9, KEY)
    assert bytes(req.entries) == entries and placed.space.holds(req.entries)
    assert bytes(whole) == lone[lane_frames.HEADER_BYTES:]
    assert framing.parse_add_request(small).request_id == 11
