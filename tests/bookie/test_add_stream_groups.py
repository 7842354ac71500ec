"""Group commit on a gRPC AddStream: the adds that reach one stream while
the bookie syncs a group share the next fdatasync.  In-process bookie
behind a real gRPC server; the journal's fdatasync goes through the
``fsync`` seam, which holds the burst's first group until the rest of the
burst has queued behind it (or gives up after a while: a handler that led
each add as it read it never lets them queue)."""
from __future__ import annotations

import os
import threading
import time

import grpc

from bookie_server.bookie import Bookie
from bookie_server.config import BookieConfig
from bookie_server.serving.service import add_service, bind_server
from pybk_spark.testing.bookie_process import entries_bytes, payload_for, read_all
from pybk_spark.wire import bookie_wire_pb2 as pb
from pybk_spark.wire import bookie_wire_pb2_grpc as pbg

KEY = b"k"
BURST = 20


def _until(pred, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while not pred():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.002)
    return True


def test_adds_queued_on_a_stream_during_a_sync_share_the_next_one(tmp_path):
    hold = threading.Event()          # set: the next fdatasync waits for the burst to queue
    syncs = []
    bookie: list[Bookie] = []

    def fdatasync(fd):
        if hold.is_set():
            hold.clear()
            _until(lambda: bookie[0].journal.queue_depth() >= BURST - 1, timeout=10.0)
        syncs.append(fd)
        os.fdatasync(fd)

    cfg = BookieConfig(data_dir=str(tmp_path), port=0, add_lane_port=-1, flush_interval_s=3600)
    b = Bookie(cfg, fsync=fdatasync).open(background=False)
    bookie.append(b)
    server, port = bind_server(cfg)
    service = add_service(server, b, cfg, "b0")
    server.start()
    channel = grpc.insecure_channel(f"127.0.0.1:{port}")
    try:
        stub = pbg.BookieStub(channel)
        first = stub.AddEntries(pb.AddRequest(ledger_id=5, master_key=KEY, request_id=1,
                                              entries=entries_bytes(5, [0])))
        assert first.code == pb.OK                   # the key record: a group of its own
        before = len(syncs)
        hold.set()
        requests = [pb.AddRequest(ledger_id=5, master_key=KEY, request_id=10 + i,
                                  entries=entries_bytes(5, [i])) for i in range(1, BURST + 1)]
        got = {r.request_id: r.code for r in stub.AddStream(iter(requests), timeout=60)}
        assert got == {10 + i: pb.OK for i in range(1, BURST + 1)}
        # the first add's group, then the rest of the burst as one
        assert len(syncs) - before <= 3, f"{len(syncs) - before} fdatasyncs for {BURST} adds"
        assert read_all(stub, 5, 0, BURST) == {e: payload_for(5, e) for e in range(BURST + 1)}
    finally:
        channel.close()
        server.stop(None)
        service.close()
        b.close()
