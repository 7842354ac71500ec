"""Group commit of batches that reach a bookie together on one connection:
the batches a connection receives while the bookie syncs share the next
fdatasync, over the add lane and over a gRPC AddStream.

In-process bookie behind its real gRPC server and add lane.  The journal's
fdatasync goes through the ``fsync`` seam, which holds the burst's first
group until the rest of the burst has arrived behind it (or gives up after
a while: a connection thread that led each batch as it read it never reads
the next one during that fdatasync).  So the count of fdatasyncs says how the burst was grouped,
whatever the machine's speed."""
from __future__ import annotations

import os
import socket
import threading
import time

import grpc
import pytest

from bookie_server.bookie import Bookie
from bookie_server.config import BookieConfig
from bookie_server.serving.service import add_service, bind_server, make_add_lane
from pybk_spark.testing.bookie_process import entries_bytes, payload_for, read_all
from pybk_spark.wire import bookie_wire_pb2 as pb
from pybk_spark.wire import bookie_wire_pb2_grpc as pbg
from pybk_spark.wire import framing, lane_frames
from pybk_spark.wire.frame_socket import read_frame

KEY = b"k"
BURST = 20
BOOKIE_ID = "b0"


def _until(pred, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while not pred():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.002)
    return True


class HeldBookie:
    """A bookie whose next fdatasync, once ``hold`` is set, waits until the
    whole burst is in progress (``BURST`` adds accepted, none durable)."""

    def __init__(self, tmp_path) -> None:
        self.hold = threading.Event()
        self.syncs: list[int] = []
        cfg = BookieConfig(data_dir=str(tmp_path), port=0, add_lane_port=0,
                           flush_interval_s=3600)
        self.bookie = Bookie(cfg, fsync=self._fdatasync).open(background=False)
        self.server, self.port = bind_server(cfg)
        self.service = add_service(self.server, self.bookie, cfg, BOOKIE_ID)
        self.server.start()
        self.lane = make_add_lane(self.service)
        self.channel = grpc.insecure_channel(f"127.0.0.1:{self.port}")
        self.stub = pbg.BookieStub(self.channel)

    def _fdatasync(self, fd: int) -> None:
        if self.hold.is_set():
            self.hold.clear()
            # every add of the burst accepted, none durable: queued behind this
            # group, or written by the journal's writer after it
            _until(lambda: self.bookie.admission.adds >= BURST, timeout=10.0)
        self.syncs.append(fd)
        os.fdatasync(fd)

    def close(self) -> None:
        self.channel.close()
        if self.lane is not None:
            self.lane.stop()
        self.server.stop(None)
        self.service.close()
        self.bookie.close()


@pytest.fixture
def held(tmp_path):
    hb = HeldBookie(tmp_path)
    yield hb
    hb.close()


def _request(ledger: int, entry_id: int, request_id: int) -> pb.AddRequest:
    return pb.AddRequest(ledger_id=ledger, master_key=KEY, request_id=request_id,
                         entries=entries_bytes(ledger, [entry_id]))


def _burst(held: HeldBookie, ledger: int, send_burst) -> dict[int, int]:
    """The ledger's first add alone (its key record), then a burst of
    BURST batches of one entry each through ``send_burst``; returns
    {request_id: code} and checks that the burst took at most three
    fdatasyncs and that every entry reads back."""
    first = held.stub.AddEntries(_request(ledger, 0, 1))
    assert first.code == pb.OK
    before = len(held.syncs)
    held.hold.set()
    got = send_burst([_request(ledger, i, 10 + i) for i in range(1, BURST + 1)])
    assert got == {10 + i: pb.OK for i in range(1, BURST + 1)}
    # the first batch's group, then the rest of the burst as one
    assert len(held.syncs) - before <= 3, f"{len(held.syncs) - before} fdatasyncs for {BURST} adds"
    assert read_all(held.stub, ledger, 0, BURST) == {e: payload_for(ledger, e)
                                                     for e in range(BURST + 1)}
    return got


def test_batches_queued_on_an_add_stream_during_a_sync_share_the_next_one(held):
    def send(requests):
        return {r.request_id: r.code for r in held.stub.AddStream(iter(requests), timeout=60)}
    _burst(held, 5, send)


def test_batches_queued_on_a_lane_connection_during_a_sync_share_the_next_one(held):
    def send(requests):
        with socket.create_connection(("127.0.0.1", held.lane.port), timeout=60) as sock:
            # one send: the burst arrives with the hello, more behind every batch but the last
            sock.sendall(lane_frames.hello(BOOKIE_ID) + b"".join(
                lane_frames.frame(*framing.payload_parts(
                    pb.AddRequest(ledger_id=r.ledger_id, master_key=r.master_key,
                                  request_id=r.request_id), r.entries)) for r in requests))
            with sock.makefile("rb") as stream:
                answers = [lane_frames.parse_add_answer(read_frame(stream, 1 << 20))
                           for _ in requests]
        return {a.request_id: a.code for a in answers}
    _burst(held, 6, send)
