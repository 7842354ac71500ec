"""The readers a bookie's pulls read their peers with, kept for the next
pull (bookie_server/serving/peer_pool.py), against a real bookie-server as
the peer: a kept reader reuses its lane connection, survives a restart of
the peer, and is closed when it idles too long, the pool closes or the
pulling bookie stops."""
from __future__ import annotations

import contextlib
import urllib.request
from typing import Iterator

import grpc
import numpy as np
import pyarrow as pa
import pytest

from bookie_server.bookie import Bookie
from bookie_server.config import BookieConfig
from bookie_server.serving import pull
from bookie_server.serving.peer_lane import LanePeerReader
from bookie_server.serving.peer_pool import PeerReaders
from bookie_server.serving.service import add_service, bind_server, make_add_lane
from pybk_spark.testing.bookie_process import entries_bytes, free_port
from pybk_spark.wire import bookie_wire_pb2_grpc as pb_grpc
from pybk_spark.testing.waiting import wait_until
from pybk_spark.wire import bookie_wire_pb2 as pb
from pybk_spark.wire.entries import batch_from_bytes

pytestmark = pytest.mark.slow

KEY = b"key"
LEDGER = 5


@pytest.fixture
def peer(bookies):
    bp = bookies(conf={"metrics_port": free_port(), "add_lane_port": free_port()}).start()
    got = bp.stub().AddEntries(pb.AddRequest(ledger_id=LEDGER, master_key=KEY,
                                             entries=entries_bytes(LEDGER, range(10))), timeout=30)
    assert got.code == pb.OK, got
    return bp


def _lane_connections(bp) -> float:
    text = urllib.request.urlopen(f"http://127.0.0.1:{bp.conf['metrics_port']}/metrics",
                                  timeout=30).read().decode()
    (value,) = [float(ln.split()[1]) for ln in text.splitlines()
                if ln.startswith("bookie_add_lane_connections ")]
    return value


def _maker(bp):
    address = f"127.0.0.1:{bp.conf['add_lane_port']}"
    return (("lane", address, bp.bookie_id),
            lambda: LanePeerReader(address, bp.bookie_id, 16 << 20))


def _ids_read(reader) -> list[int]:
    reader.send(LEDGER, 0, 9, max_entries=100, max_bytes=1 << 20, timeout=30, sparse=True)
    return reader.receive().batch.column("entry_id").to_pylist()


def _first_pull(pool: PeerReaders, bp):
    """(key, maker, the reader) after one pull of ``bp`` that read every entry."""
    key, make = _maker(bp)
    with pool.reader(key, make) as reader:
        assert _ids_read(reader) == list(range(10))
    return key, make, reader


def test_a_kept_reader_reuses_its_connection_across_pulls(peer):
    pool = PeerReaders()
    try:
        key, make, first = _first_pull(pool, peer)
        with pool.reader(key, make) as second:
            assert second is first
            assert _ids_read(second) == list(range(10))
        assert pool.opened == 1 and pool.idle_count() == 1
        assert _lane_connections(peer) == 1.0
    finally:
        pool.close()
    wait_until(lambda: _lane_connections(peer) == 0.0, "lane connections == 0.0", 30)


def test_a_kept_connection_the_peer_closed_is_reopened(peer):
    pool = PeerReaders()
    try:
        key, make, reader = _first_pull(pool, peer)
        peer.restart()                           # same ports: the kept connection is dead
        with pool.reader(key, make) as again:
            assert again is reader
            assert _ids_read(again) == list(range(10))
        assert pool.opened == 1
    finally:
        pool.close()


def test_an_idle_reader_is_closed_after_idle_close_s(peer):
    now = [1000.0]
    pool = PeerReaders(idle_close_s=30.0, clock=lambda: now[0])
    try:
        key, make, reader = _first_pull(pool, peer)
        now[0] += 29.0
        pool.expire()
        assert pool.idle_count() == 1 and _lane_connections(peer) == 1.0
        now[0] += 1.0
        pool.expire()
        assert pool.idle_count() == 0
        wait_until(lambda: _lane_connections(peer) == 0.0, "lane connections == 0.0", 30)
        with pool.reader(key, make) as fresh:       # the next pull opens a new one
            assert fresh is not reader and _ids_read(fresh) == list(range(10))
        assert pool.opened == 2
    finally:
        pool.close()


def test_a_pull_that_raises_closes_its_reader_and_pulls_at_once_get_their_own(peer):
    pool = PeerReaders(max_idle=1)
    try:
        key, make = _maker(peer)
        with pytest.raises(RuntimeError):
            with pool.reader(key, make) as broken:
                assert _ids_read(broken) == list(range(10))
                raise RuntimeError("the pull failed")
        assert pool.idle_count() == 0
        with pool.reader(key, make) as a, pool.reader(key, make) as b:
            assert a is not b and a is not broken
            assert _ids_read(a) == _ids_read(b) == list(range(10))
        assert pool.opened == 3 and pool.idle_count() == 1      # max_idle: one kept
        wait_until(lambda: _lane_connections(peer) == 1.0, "lane connections == 1.0", 30)
    finally:
        pool.close()


@contextlib.contextmanager
def _served(cfg: BookieConfig, bookie_id: str) -> Iterator[tuple]:
    """(the bookie, its service, its lane, its gRPC port): an in-process
    bookie served as ``bookie-server`` serves it (its gRPC server, its lane
    and the one service both serve it through), stopped in the same order."""
    bookie = Bookie(cfg).open(background=False)
    server, port = bind_server(cfg)
    service = add_service(server, bookie, cfg, bookie_id)
    lane = make_add_lane(service)
    server.start()
    try:
        assert lane is not None
        yield bookie, service, lane, port
    finally:
        if lane is not None:
            lane.stop()
        server.stop(grace=2).wait()
        service.close()
        bookie.close()


def test_a_stopped_bookie_leaves_no_kept_reader_open(peer, tmp_path):
    """The puller is an in-process bookie (``_served``)."""
    cfg = BookieConfig(data_dir=str(tmp_path / "puller"), port=free_port(), grpc_threads=4,
                       add_lane_port=free_port())
    with _served(cfg, "puller") as (_bookie, service, lane, port):
        assert lane.service is service     # one set of peer readers
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            got = pb_grpc.BookieStub(channel).PullEntries(pb.PullRequest(
                ledger_id=LEDGER, master_key=KEY, source_address=peer.address,
                source_lane_address=f"127.0.0.1:{peer.conf['add_lane_port']}",
                source_bookie_id=peer.bookie_id, digest_type="none", read_window=1,
                wanted_ids=pull.ids_to_bytes(np.arange(10, dtype=np.int64))), timeout=60)
        assert got.code == pb.OK and got.entries == 10, got
        assert service.peers.idle_count() == 1 and _lane_connections(peer) == 1.0
        reader = LanePeerReader(f"127.0.0.1:{lane.port}", "puller", 16 << 20)
        try:
            assert _ids_read(reader) == list(range(10))       # the lane serves what was pulled
        finally:
            reader.close()
    assert service.peers.idle_count() == 0
    wait_until(lambda: _lane_connections(peer) == 0.0, "lane connections == 0.0", 30)


def test_a_bookie_process_that_pulled_stops_cleanly(peer, bookies):
    """``bookie-server``'s own stop, with a kept reader of a peer: exit 0,
    and the peer sees the lane connection go."""
    puller = bookies("puller").start()
    got = puller.stub().PullEntries(pb.PullRequest(
        ledger_id=LEDGER, master_key=KEY, source_address=peer.address,
        source_lane_address=f"127.0.0.1:{peer.conf['add_lane_port']}",
        source_bookie_id=peer.bookie_id, digest_type="none", read_window=1,
        wanted_ids=pull.ids_to_bytes(np.arange(10, dtype=np.int64))), timeout=60)
    assert got.code == pb.OK and got.entries == 10, got
    assert _lane_connections(peer) == 1.0
    assert puller.terminate() == 0, puller.log_tail()
    wait_until(lambda: _lane_connections(peer) == 0.0, "lane connections == 0.0", 30)


def test_reads_are_pipelined_on_one_connection_and_abandoned_ones_never_answer_later(peer):
    reader = LanePeerReader(f"127.0.0.1:{peer.conf['add_lane_port']}", peer.bookie_id, 16 << 20)
    try:
        for first, last in ((0, 2), (3, 5), (6, 9)):      # three in flight at once
            reader.send(LEDGER, first, last, max_entries=100, max_bytes=1 << 20, timeout=30,
                        sparse=True)
        got = [reader.receive().batch.column("entry_id").to_pylist() for _ in range(2)]
        assert got == [[0, 1, 2], [3, 4, 5]]
        assert _lane_connections(peer) == 1.0
        reader.discard()              # the third is still unanswered: it never shows later
        assert _ids_read(reader) == list(range(10))
    finally:
        reader.close()


def test_a_big_answer_lands_in_a_journal_record_space_and_a_small_one_in_a_buffer(peer):
    """Entries of 64 KiB and more are received where the journal writes
    them from (``RecordSpace``): the answer's ``raw`` is that space's body."""
    got = peer.stub().AddEntries(pb.AddRequest(ledger_id=LEDGER + 1, master_key=KEY,
                                               entries=entries_bytes(LEDGER + 1, range(100),
                                                                     size=2048)), timeout=30)
    assert got.code == pb.OK, got
    reader = LanePeerReader(f"127.0.0.1:{peer.conf['add_lane_port']}", peer.bookie_id, 16 << 20)
    try:
        reader.send(LEDGER + 1, 0, 99, max_entries=100, max_bytes=1 << 20, timeout=30,
                    sparse=True)
        big = reader.receive()
        assert big.space is not None and big.space.holds(big.raw)
        assert big.batch.column("entry_id").to_pylist() == list(range(100))
        reader.send(LEDGER, 0, 9, max_entries=100, max_bytes=1 << 20, timeout=30, sparse=True)
        small = reader.receive()
        assert small.space is None and small.batch.num_rows == 10
    finally:
        reader.close()


def test_a_read_connection_holds_no_answer_while_it_waits(tmp_path, monkeypatch):
    """A bookie joins a large read's answer into a pooled buffer; the buffer
    is back in its pool once the answer is sent, before the connection waits
    for its next read: the next answer takes the same pages, and a reader
    kept open idle holds none."""
    from bookie_server.direct_buffers import BufferPool
    from bookie_server.storage import entry_store

    answers = BufferPool(64 << 20, huge=False)
    monkeypatch.setattr(entry_store, "ANSWER_BUFFERS", answers)
    cfg = BookieConfig(data_dir=str(tmp_path / "source"), port=0, add_lane_port=0)
    rows = entry_store.POOLED_ANSWER_ROWS * 2
    with _served(cfg, "source") as (bookie, _service, lane, _port):
        for first in range(0, rows, 512):        # several stored batches: the answer is joined
            bookie.add(LEDGER, KEY, entries_bytes(LEDGER, range(first, first + 512), size=1024))
        reader = LanePeerReader(f"127.0.0.1:{lane.port}", "source", 16 << 20)
        try:
            for _ in range(3):
                reader.send(LEDGER, 0, rows - 1, max_entries=rows, max_bytes=16 << 20,
                            timeout=30)
                got = reader.receive()
                assert got.batch.num_rows == rows
                del got
                # the answer is sent whole before the source lets go of it
                wait_until(lambda: answers.idle_bytes() > 0, "the answer back in its pool", 30)
                assert len(answers._idle) == 1 and sum(map(len, answers._idle.values())) == 1
        finally:
            reader.close()


def test_a_pulls_answer_is_sent_from_its_stored_batches(tmp_path, monkeypatch):
    """A pull's read (sparse, every stored id) of several stored batches is
    sent from where they lie: no answer is joined, and what arrives is every
    entry, in order, digests included."""
    from bookie_server.direct_buffers import BufferPool
    from bookie_server.storage import entry_store

    from pybk_spark.wire import entries

    answers = BufferPool(64 << 20, huge=False)
    monkeypatch.setattr(entry_store, "ANSWER_BUFFERS", answers)
    joined_rows = []
    real_one_batch = entries.one_batch
    monkeypatch.setattr(entries, "one_batch",
                        lambda rows: joined_rows.append(rows.num_rows) or real_one_batch(rows))
    cfg = BookieConfig(data_dir=str(tmp_path / "source"), port=0, add_lane_port=0)
    rows = entry_store.POOLED_ANSWER_ROWS * 2
    sent = [entries_bytes(LEDGER, range(first, first + 512), size=1024)
            for first in range(0, rows, 512)]
    with _served(cfg, "source") as (bookie, _service, lane, _port):
        for batch in sent:
            bookie.add(LEDGER, KEY, batch)
        reader = LanePeerReader(f"127.0.0.1:{lane.port}", "source", 16 << 20)
        try:
            reader.send(LEDGER, 0, rows - 1, max_entries=rows, max_bytes=16 << 20,
                        timeout=30, sparse=True)
            got = reader.receive().batch
        finally:
            reader.close()
    want = pa.Table.from_batches([batch_from_bytes(b) for b in sent]).combine_chunks()
    assert got.num_rows == rows
    for name in ("entry_id", "payload", "digest", "length"):
        assert got.column(name).equals(want.column(name).chunk(0)), name
    assert answers.idle_bytes() == 0 and not answers._idle        # nothing was joined
    assert rows not in joined_rows
