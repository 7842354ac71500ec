"""FrameWriter over a socketpair: never blocks its caller, keeps frames whole
and in order, and cuts a peer that stops reading.  ``frame_bodies`` (the
bookie's reader) gives back every frame whole, however the bytes arrive."""
from __future__ import annotations

import socket
import threading

import pytest

from pybk_spark.wire.frame_socket import FrameWriter, corked, frame_bodies, read_frame
from pybk_spark.wire import lane_frames


def _pair():
    a, b = socket.socketpair()
    a.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 64 * 1024)
    return a, b


def test_frames_arrive_whole_and_in_order_through_a_slow_reader():
    a, b = _pair()
    writer = FrameWriter(a, "t", max_backlog_bytes=1 << 30)
    frames = [lane_frames.frame(bytes([i % 251]) * (1000 + 7919 * i % 70000)) for i in range(300)]
    got = []

    def read():
        with b.makefile("rb") as stream:
            while (body := read_frame(stream, 1 << 20)) is not None:
                got.append(body)

    for f in frames:                       # the peer is not reading yet: all of it queues
        assert writer.send(f)
    reader = threading.Thread(target=read)
    reader.start()
    assert writer.flush(60)
    writer.close()
    reader.join(60)
    assert got == [f[lane_frames.HEADER_BYTES:] for f in frames]


def test_frames_given_as_parts_arrive_whole_and_in_order_among_whole_frames():
    """A frame given as a list of buffers is gathered by ``sendmsg``; what
    the socket does not take at once queues as views, behind which later
    frames wait: the reader sees every frame whole and in order, however
    the two kinds interleave and wherever a send stopped."""
    a, b = _pair()
    writer = FrameWriter(a, "t", max_backlog_bytes=1 << 30)
    bodies = [bytes([i % 251]) * (1000 + 7919 * i % 70000) for i in range(200)]
    got = []

    def read():
        with b.makefile("rb") as stream:
            while (body := read_frame(stream, 1 << 20)) is not None:
                got.append(body)

    for i, body in enumerate(bodies):
        if i % 3:                          # cut into parts of 0..3 KiB, empty ones included
            cuts = list(range(0, len(body), 1024 * (i % 4))) if i % 4 else [0]
            parts = [memoryview(body)[c:c + 1024 * (i % 4)] for c in cuts] if i % 4 else [body]
            assert writer.send(lane_frames.frame_parts(*parts, b""))
        else:
            assert writer.send(lane_frames.frame(body))
    reader = threading.Thread(target=read)  # the first frames went at once, the rest queued
    reader.start()
    assert writer.flush(60)
    writer.close()
    reader.join(60)
    assert got == bodies


def test_frames_sent_corked_go_out_together_per_writer_in_order():
    """Inside ``corked()`` nothing leaves until the (outermost) block ends;
    then each writer's frames arrive as one send, in the order given, and
    frames of other threads are not held."""
    (a1, b1), (a2, b2) = _pair(), _pair()
    w1 = FrameWriter(a1, "t1", max_backlog_bytes=1 << 30)
    w2 = FrameWriter(a2, "t2", max_backlog_bytes=1 << 30)
    b1.setblocking(False)
    with corked():
        assert w1.send(lane_frames.frame(b"one"))
        with corked():
            assert w2.send(lane_frames.frame(b"two"))
            assert w1.send(lane_frames.frame(b"three"))
        other = threading.Thread(target=w2.send, args=(lane_frames.frame(b"elsewhere"),))
        other.start()
        other.join()
        with pytest.raises(BlockingIOError):
            b1.recv(100)                          # held back
    first = b1.recv(100)                          # both frames, one send
    assert first == lane_frames.frame(b"one") + lane_frames.frame(b"three")
    assert b2.recv(100) == lane_frames.frame(b"elsewhere") + lane_frames.frame(b"two")
    with corked():                                # a frame given as parts among them
        assert w1.send(lane_frames.frame(b"four"))
        assert w1.send(lane_frames.frame_parts(b"fi", b"ve"))
    assert b1.recv(100) == lane_frames.frame(b"four") + lane_frames.frame(b"five")
    for s in (a1, b1, a2, b2):
        s.close()


def test_a_peer_that_stops_reading_is_cut_off_not_waited_for():
    a, b = _pair()
    writer = FrameWriter(a, "t", max_backlog_bytes=256 * 1024)
    frame = lane_frames.frame(b"x" * 32 * 1024)
    sent = 0
    while writer.send(frame):              # returns at once each time; never blocks
        sent += 1
        assert sent < 10_000
    assert writer.closed and isinstance(writer.error, BufferError)
    assert not writer.send(frame)
    b.close()


def test_frame_length_limits():
    with pytest.raises(ValueError):
        lane_frames.frame_length((100).to_bytes(4, "little"), 99)
    with pytest.raises(ValueError):
        lane_frames.frame_length(b"\x01\x00", 99)
    assert lane_frames.frame_length((99).to_bytes(4, "little"), 99) == 99
    assert lane_frames.split_address("[::1]:3181") == ("::1", 3181)
    with pytest.raises(ValueError):
        lane_frames.split_address("no-port")


def _bodies_of(stream: bytes, cuts, limit=1 << 20, first_limit=1 << 20, received=0):
    """What ``frame_bodies`` reads from ``stream`` sent in pieces at ``cuts``
    (its first ``received`` bytes handed over as already read), as bytes."""
    got, errors = _raw_bodies_of(stream, cuts, limit, first_limit, received)
    return [bytes(body) for body in got], errors


def _raw_bodies_of(stream: bytes, cuts, limit=1 << 20, first_limit=1 << 20, received=0,
                   **pool):
    """The bodies ``frame_bodies`` yields, as yielded, and the errors it
    raised (each piece between ``cuts`` one recv); ``pool``: its ``take``
    and ``take_min``."""
    a, b = socket.socketpair()
    got: list = []
    errors: list = []

    def read():
        try:
            got.extend(frame_bodies(b, limit, first_limit, stream[:received], **pool))
        except ValueError as exc:
            errors.append(exc)

    reader = threading.Thread(target=read)
    reader.start()
    edges = [received, *cuts, len(stream)]
    for lo, hi in zip(edges, edges[1:]):
        a.sendall(stream[lo:hi])
        # the reader takes each piece alone: every cut is a recv boundary
        threading.Event().wait(0.002)
    a.close()
    reader.join(60)
    b.close()
    return got, errors


def test_frame_bodies_are_whole_however_the_bytes_arrive():
    bodies = [b"hello", b"", bytes(range(256)) * 3, b"\x00" * 70, b"x" * (200 << 10)]
    stream = b"".join(lane_frames.frame(x) for x in bodies)
    assert _bodies_of(stream, []) == (bodies, [])
    every_byte_of_the_heads = list(range(1, 900))            # cut inside headers and bodies
    assert _bodies_of(stream, every_byte_of_the_heads) == (bodies, [])
    big = len(stream) - len(bodies[-1])                       # the large frame's body in pieces
    assert _bodies_of(stream, [big - 2, big + 5, big + 70000, big + 150000]) == (bodies, [])
    for received in (3, 9, 12, big + 9):         # bytes read with the magic: a hello and more
        assert _bodies_of(stream, [big + 70000], received=received) == (bodies, [])


def test_frame_bodies_hold_the_first_frame_and_the_rest_to_their_limits():
    hello, add = lane_frames.frame(b"h" * 10), lane_frames.frame(b"a" * 100)
    assert _bodies_of(hello + add, [], limit=100, first_limit=10) == ([b"h" * 10, b"a" * 100], [])
    got, errors = _bodies_of(hello + add, [], limit=99, first_limit=10)
    assert got == [b"h" * 10] and "over the limit of 99" in str(errors[0])
    got, errors = _bodies_of(add, [2], limit=100, first_limit=10)   # the header cut in two
    assert got == [] and "over the limit of 10" in str(errors[0])


def test_frame_bodies_end_cleanly_between_frames_and_loudly_inside_one():
    frame = lane_frames.frame(b"z" * 50)
    assert _bodies_of(frame, []) == ([b"z" * 50], [])
    for cut in (2, 30):
        got, errors = _bodies_of(frame[:cut], [])
        assert got == [] and "connection ended inside a frame" in str(errors[0])
    big = lane_frames.frame(b"q" * (100 << 10))
    got, errors = _bodies_of(big[:70000], [])
    assert got == [] and "connection ended inside a frame" in str(errors[0])


def test_a_frame_body_keeps_no_more_than_itself_alive():
    """A bookie holds an add's record, a view of its frame body, in the
    write cache until a checkpoint: a body must not keep the rest of the
    receive buffer it arrived in (other frames, a cut-off frame's start)
    alive with it."""
    small = [bytes([k]) * 100 for k in range(5)]
    cut = b"c" * 3000                                       # cut off by the first recv
    stream = b"".join(lane_frames.frame(x) for x in [*small, cut])
    bodies, _ = _raw_bodies_of(stream, [len(stream) - 1000])
    assert [bytes(b) for b in bodies] == [*small, cut]
    for body in bodies:
        held = len(body.obj) if isinstance(body, memoryview) else len(body)
        assert held <= len(body) + lane_frames.HEADER_BYTES, (len(body), held)
    alone = lane_frames.frame(b"a" * 500)                   # one frame, one recv: a view of it
    (body,), _ = _raw_bodies_of(alone, [])
    assert isinstance(body, memoryview) and len(body.obj) == len(alone)


def _pool_in_a_fresh_process(env_value):
    import os
    import subprocess
    import sys
    env = {k: v for k, v in os.environ.items() if k != "ARROW_DEFAULT_MEMORY_POOL"}
    if env_value:
        env["ARROW_DEFAULT_MEMORY_POOL"] = env_value
    code = ("import pyarrow as pa; from pybk_spark.wire import arrow_memory as m; "
            "print(m.wire_pool().backend_name, m.use_for_process(), "
            "pa.default_memory_pool().backend_name)")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         check=True).stdout.split()
    return out


def test_the_wire_pool_keeps_freed_blocks_mapped_unless_the_operator_chose_a_pool():
    """Read answers land in jemalloc (or the system allocator), not pyarrow's
    default mimalloc, which returns freed blocks' pages to the kernel
    (wire/arrow_memory.py); ARROW_DEFAULT_MEMORY_POOL set by the operator wins."""
    wire, made_default, default = _pool_in_a_fresh_process("")
    assert wire in ("jemalloc", "system") and made_default == default == wire
    assert _pool_in_a_fresh_process("mimalloc") == ["mimalloc"] * 3


def test_a_big_frame_cut_off_by_its_recv_lands_in_a_buffer_from_take():
    """``take``/``take_min``: a body of ``take_min`` bytes or more that its
    recv cut off is received into the buffer ``take`` gives (a bookie's
    pooled buffers), smaller ones where they were; the bodies are whole."""
    import pyarrow as pa
    taken: list[int] = []

    def take(size):
        taken.append(size)
        buf = pa.allocate_buffer(size, resizable=False)
        return memoryview(buf).cast("B"), buf
    bodies = [b"s" * 100, b"m" * (100 << 10), bytes(range(256)) * 1200]
    stream = b"".join(lane_frames.frame(x) for x in bodies)
    cuts = [len(stream) - len(bodies[2]) + 10, len(stream) - 1000]
    got, errors = _raw_bodies_of(stream, cuts, take=take, take_min=200_000)
    assert [bytes(b) for b in got] == bodies and not errors
    assert taken == [len(bodies[2])]
