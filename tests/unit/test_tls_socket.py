"""TlsSocket (wire/tls_socket.py): one TLS connection read by one thread while
others send on it, through FrameWriter; the handshake bounded by a timeout."""
from __future__ import annotations

import socket
import ssl
import threading
import time

import pytest

from pybk_spark.wire import lane_frames
from pybk_spark.wire.frame_socket import FrameWriter, read_frame, send_parts
from pybk_spark.wire.tls_socket import handshake

pytest.importorskip("trustme")


@pytest.fixture(scope="module")
def contexts(tmp_path_factory):
    from pybk_spark.cluster.certs import make_cert_files
    files = make_cert_files(tmp_path_factory.mktemp("tlssock"), clients=())
    server = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server.load_cert_chain(files.bookie_cert, files.bookie_key)
    client = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    client.load_verify_locations(cafile=str(files.ca_file))
    return server, client


def _tls_pair(contexts):
    server_ctx, client_ctx = contexts
    a, b = socket.socketpair()
    a.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 64 * 1024)
    out = {}
    t = threading.Thread(target=lambda: out.setdefault(
        "b", handshake(b, server_ctx, server_side=True, timeout=30)))
    t.start()
    ta = handshake(a, client_ctx, server_side=False, server_hostname="localhost", timeout=30)
    t.join(30)
    return ta, out["b"]


def test_frames_both_ways_while_a_thread_reads(contexts):
    a, b = _tls_pair(contexts)
    frames = [lane_frames.frame(bytes([i % 251]) * (1000 + 7919 * i % 70000)) for i in range(200)]
    got_a, got_b = [], []

    def reader(sock, got, n):
        with sock.makefile("rb") as stream:
            for _ in range(n):
                got.append(read_frame(stream, 1 << 20))

    readers = [threading.Thread(target=reader, args=(a, got_a, len(frames))),
               threading.Thread(target=reader, args=(b, got_b, len(frames)))]
    for r in readers:
        r.start()
    wa, wb = FrameWriter(a, "a", 1 << 30), FrameWriter(b, "b", 1 << 30)
    senders = [threading.Thread(target=lambda w=w: [w.send(f) for f in frames]) for w in (wa, wb)]
    for s in senders:
        s.start()
    for t in senders + readers:
        t.join(60)
    want = [f[lane_frames.HEADER_BYTES:] for f in frames]
    assert got_a == want and got_b == want
    big = [b"x" * (3 << 20), b"y" * 5, b"z" * (1 << 20)]
    t = threading.Thread(target=send_parts, args=(a, lane_frames.frame_parts(*big)))
    t.start()
    with b.makefile("rb") as stream:
        assert read_frame(stream, 8 << 20) == b"".join(big)
    t.join(60)
    wa.close()                                   # shutdown: the peer reads the end
    with b.makefile("rb") as stream:
        assert read_frame(stream, 1 << 20) is None
    wb.close()


def test_handshake_times_out_and_garbage_fails(contexts):
    server_ctx, _ = contexts
    a, b = socket.socketpair()
    t0 = time.monotonic()
    with pytest.raises(TimeoutError):
        handshake(b, server_ctx, server_side=True, timeout=0.3)   # the peer says nothing
    assert time.monotonic() - t0 < 30
    a.close()
    a, b = socket.socketpair()
    a.sendall(b"GET / HTTP/1.1\r\n\r\n" * 4)
    with pytest.raises(ssl.SSLError):
        handshake(b, server_ctx, server_side=True, timeout=30)
    a.close()


def test_recv_timeout(contexts):
    a, b = _tls_pair(contexts)
    b.settimeout(0.2)
    with pytest.raises(TimeoutError):
        b.recv(10)
    a.close()
    b.close()
