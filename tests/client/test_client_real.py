"""The client against real etcd + real bookie-server processes (LocalCluster).

Scenarios: basic lifecycle, fencing and recovery with a
SIGSTOPped bookie, SIGKILL mid-stream -> ensemble change, concurrent
recoveries agree, wrong password, IncorrectParameter before etcd.
No timing thresholds: waits are on futures/conditions; timeouts only bound
how long a hung bookie is waited for."""
from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pyarrow as pa
import pytest

from pybk_spark import errors
from pybk_spark.ledger.client import BookKeeper
from pybk_spark.protocol import ledger_metadata as lm
from pybk_spark.protocol.distribution import write_set
from pybk_spark.testing.waiting import wait_until


def _bk(cluster, **conf):
    base = {"explicit_lac_interval_ms": 0}
    base.update(conf)
    return BookKeeper(cluster.metadata_uri, conf=base)


def _wait_stored(bk, bookie, ledger_id, entry_id, timeout=30.0):
    """Until ``bookie`` holds ``entry_id``: an async add leaves from the
    writer's executor thread after ``add_entry_async`` returned, so a
    recovery started at once may fence the bookie first (and then rightly
    close the ledger before the entry)."""
    transport = bk.transports.get(bookie)
    wait_until(lambda: transport.read(ledger_id, entry_id, entry_id,
                                      sparse=True).result(timeout).batch.num_rows,
               f"entry {entry_id} on {bookie}", timeout)


def _ensure_bookies(cluster, n):
    while len(cluster.bookie_ids) < n:
        cluster.add_bookie()


def test_basic_lifecycle(cluster):
    bk = _bk(cluster)
    try:
        lh = bk.create_ledger(3, 2, 2)
        assert [lh.add_entry(b"hello-%d" % i) for i in range(3)] == [0, 1, 2]
        ids = lh.add_entries(b"bulk-%d" % i for i in range(2000))
        assert ids == list(range(3, 2003))
        f = lh.add_entry_async(b"async")
        assert f.result() == 2003
        lh.close()
        md = bk.get_ledger_metadata(lh.ledger_id)
        assert md.state == lm.CLOSED and md.last_entry_id == 2003
        for recovery in (False, True):
            rh = bk.open_ledger(lh.ledger_id, recovery=recovery)
            assert rh.last_add_confirmed == 2003
            got = rh.read(0, 2003)
            assert got[0].payload == b"hello-0" and got[2003].payload == b"async"
            assert [e.entry_id for e in got] == list(range(2004))
            rows = sum(b.num_rows for b in rh.read_batches(0, 2003, max_entries=500))
            assert rows == 2004
    finally:
        bk.close()


def test_wrong_password_unauthorized(cluster):
    bk = _bk(cluster)
    try:
        lh = bk.create_ledger(3, 2, 2, password=b"pw", digest="hmac")
        lh.add_entry(b"x")
        lh.close()
        with pytest.raises(errors.Unauthorized):
            bk.open_ledger(lh.ledger_id, password=b"nope")
        assert bk.open_ledger(lh.ledger_id, password=b"pw").read(0, 0)[0].payload == b"x"
    finally:
        bk.close()


def test_incorrect_parameter_before_etcd(cluster):
    bk = _bk(cluster)
    try:
        before = bk.metadata_store.get("idgen")
        for e, w, a in [(2, 3, 2), (3, 2, 3), (3, 1, 0)]:
            with pytest.raises(errors.IncorrectParameter):
                bk.create_ledger(e, w, a)
        after = bk.metadata_store.get("idgen")
        assert (before is None and after is None) or before.version == after.version
    finally:
        bk.close()


def test_fencing_and_recovery_scenario(cluster):
    """fencing-and-recovery.txt: up to 11 acked, 12 partial, a reader recovers,
    the ledger closes consistently, the old writer is fenced."""
    _ensure_bookies(cluster, 4)           # a spare for recovery's ensemble change
    writer_bk = _bk(cluster, add_timeout_s=60.0)
    reader_bk = _bk(cluster, read_timeout_s=3.0, add_timeout_s=3.0)
    stopped = None
    try:
        lh = writer_bk.create_ledger(3, 2, 2)
        for i in range(12):
            assert lh.add_entry(b"e%d" % i) == i
        ens = lh.metadata.current_ensemble
        stopped = ens[write_set(12, 3, 2)[1]]
        cluster.stop_bookie(stopped)
        fut12 = lh.add_entry_async(b"e12")   # reaches one bookie only: partial
        _wait_stored(reader_bk, ens[write_set(12, 3, 2)[0]], lh.ledger_id, 12)
        rh = reader_bk.open_ledger(lh.ledger_id)    # fencing open, hung bookie
        md = reader_bk.get_ledger_metadata(lh.ledger_id)
        assert md.state == lm.CLOSED
        assert md.last_entry_id == 12 == rh.last_add_confirmed
        assert [e.payload for e in rh.read(0, 12)] == [b"e%d" % i for i in range(13)]
        cluster.resume_bookie(stopped)
        stopped = None
        try:
            r = fut12.result(timeout=120)
            assert r <= md.last_entry_id     # a success must be inside the ledger
        except errors.LedgerFenced as exc:
            assert exc.outcome_known is False
        with pytest.raises(errors.LedgerFenced):
            lh.add_entry(b"e13")
        again = reader_bk.open_ledger(lh.ledger_id)
        assert again.last_add_confirmed == 12
    finally:
        if stopped:
            cluster.resume_bookie(stopped)
        writer_bk.close()
        reader_bk.close()


def test_sigkill_mid_stream_ensemble_change(cluster):
    _ensure_bookies(cluster, 4)
    bk = _bk(cluster, add_timeout_s=5.0, add_batch_entries=50)
    try:
        lh = bk.create_ledger(3, 2, 2)
        victim = lh.metadata.current_ensemble[0]
        futs = []
        for chunk in range(40):
            futs += lh.add_entries_async([b"c%d-%d" % (chunk, i) for i in range(50)])
            if chunk == 10:
                # mid-stream: something is acknowledged first, so the change's
                # fragment starts after 0 (a change before any ack would rewrite
                # the fragment at 0, correctly, leaving one fragment)
                futs[0].result(timeout=60)
                cluster.kill_bookie(victim)
        acked = []
        for f in futs:
            acked += f.result(timeout=120)
        assert acked == list(range(2000))
        md = lh.metadata
        assert victim not in md.current_ensemble and len(md.ensembles) >= 2
        lh.close()
        rh = bk.open_ledger(lh.ledger_id)
        assert rh.last_add_confirmed == 1999
        got = rh.read(0, 1999)
        assert [e.payload for e in got] == [b"c%d-%d" % (c, i) for c in range(40) for i in range(50)]
    finally:
        bk.close()


def test_concurrent_recoveries_agree(cluster):
    writer = _bk(cluster)
    readers = [_bk(cluster), _bk(cluster)]
    try:
        lh = writer.create_ledger(3, 2, 2)
        for i in range(30):
            lh.add_entry(b"r%d" % i)
        barrier = threading.Barrier(2)

        def recover(bk):
            barrier.wait()
            return bk.open_ledger(lh.ledger_id).last_add_confirmed
        with ThreadPoolExecutor(2) as ex:
            results = list(ex.map(recover, readers))
        md = writer.get_ledger_metadata(lh.ledger_id)
        assert results == [md.last_entry_id, md.last_entry_id]
        assert md.last_entry_id == 29
        with pytest.raises(errors.LedgerFenced):
            lh.add_entry(b"late")
    finally:
        writer.close()
        for r in readers:
            r.close()


def test_tailing_reader_long_poll(cluster):
    bk = _bk(cluster, explicit_lac_interval_ms=100)
    try:
        lh = bk.create_ledger(3, 2, 2)
        rh = bk.open_ledger(lh.ledger_id, recovery=False)
        assert rh.last_add_confirmed == -1
        for i in range(5):
            lh.add_entry(b"t%d" % i)
        lac = rh.wait_for_lac(3, timeout=30)     # explicit LAC makes 4 visible
        assert lac == 4
        assert [e.payload for e in rh.read(0, 4)] == [b"t%d" % i for i in range(5)]
        lh.close()
    finally:
        bk.close()


@pytest.mark.parametrize("write_quorum", [3, 2])
def test_read_batches_keeps_to_the_byte_budget(cluster, write_quorum):
    """A read window holds about ``max_bytes`` of payload (at least one
    entry), for contiguous (Qw = E) and striped (Qw < E, first-replica reads)
    ledgers; every entry comes back once, in order."""
    bk = _bk(cluster)
    try:
        lh = bk.create_ledger(3, write_quorum, 2)
        payloads = [bytes([i]) * 100_000 for i in range(12)]
        lh.add_entries(payloads)
        lh.close()
        rh = bk.open_ledger(lh.ledger_id, recovery=False)
        batches = list(rh.read_batches(0, 11, max_bytes=250_000))
        assert [p for b in batches for p in b.column("payload").to_pylist()] == payloads
        assert len(batches) >= 4 and all(b.num_rows <= 3 for b in batches)
        whole = list(rh.read_batches(0, 11))              # default budget: one window
        assert len(whole) == 1 and whole[0].num_rows == 12
    finally:
        bk.close()


@pytest.mark.parametrize("write_quorum", [3, 2])
def test_add_entries_async_of_a_binary_column(cluster, write_quorum):
    """A binary Arrow column (sliced) is added as its values, cut into
    requests by ``add_batch_bytes`` like a list of bytes."""
    bk = _bk(cluster, add_batch_bytes=4 << 20)
    try:
        lh = bk.create_ledger(3, write_quorum, 2)
        payloads = [bytes([i]) * 300_000 for i in range(30)]
        column = pa.array([b"skipped"] + payloads, pa.binary()).slice(1)
        futs = lh.add_entries_async(column)
        assert len(futs) > 1 and [i for f in futs for i in f.result()] == list(range(30))
        lh.close()
        rh = bk.open_ledger(lh.ledger_id, recovery=False)
        assert [e.payload for e in rh.read(0, 29)] == payloads
        other = bk.create_ledger(3, write_quorum, 2)
        for bad in (pa.array([b"a", None], pa.binary()), pa.array([1, 2])):
            with pytest.raises(errors.IncorrectParameter, match="add_entries_async"):
                other.add_entries_async(bad)
        assert other.add_entries_async(pa.array(["text"], pa.string()))[0].result() == [0]
        other.close()
    finally:
        bk.close()


def _wait_held(bk, bookies, ledger_id: int, entry_id: int, guard_s: float = 120.0) -> None:
    """Until each of ``bookies`` stores ``entry_id`` (non-fencing reads; the
    guard only bounds a hang)."""
    deadline = time.monotonic() + guard_s
    for b in bookies:
        while True:
            try:
                res = bk.transports.get(b).read(ledger_id, entry_id, entry_id,
                                                max_entries=1).result(guard_s)
                if res.batch.num_rows:
                    break
            except errors.NoSuchEntry:
                pass
            assert time.monotonic() < deadline, f"{b} never stored entry {entry_id}"
            time.sleep(0.01)


@pytest.mark.parametrize("tail", [0, 3])
def test_recovery_closes_at_the_length_its_entries_carry(cluster, tail):
    """A (3, 3, 3) ledger with 10 entries acknowledged (every bookie knows
    LAC 9) and ``tail`` more on two bookies only (the third paused, so never
    acknowledged).  Recovery closes it with length = the payload bytes of
    every entry in it: tail 0, the length entry 9 carries (read back); tail
    3, the one the last re-written entry carries."""
    _ensure_bookies(cluster, 4)           # a spare replaces the paused bookie in the re-write
    writer = _bk(cluster, add_timeout_s=60.0)
    rec = _bk(cluster, read_timeout_s=3.0, add_timeout_s=3.0)
    paused = None
    try:
        lh = writer.create_ledger(3, 3, 3)
        lid, key = lh.ledger_id, lm.master_key(b"")
        acked = [b"a" * (i + 1) for i in range(10)]
        lh.add_entries(acked[:4])
        lh.add_entries(acked[4:])
        ensemble = lh.metadata.current_ensemble
        for b in ensemble:                    # the writer's explicit LAC while idle
            writer.transports.get(b).write_lac(lid, key, 9).result(60)
        tail_payloads = [b"t" * (20 + i) for i in range(tail)]
        if tail:
            paused = ensemble[0]
            cluster.stop_bookie(paused)
            lh.add_entries_async(tail_payloads)
            _wait_held(writer, ensemble[1:], lid, 9 + tail)
        md = rec.open_ledger(lid).metadata
        assert (md.state, md.last_entry_id) == (lm.CLOSED, 9 + tail)
        assert md.length == sum(map(len, acked + tail_payloads))
        got = rec.open_ledger(lid, recovery=False).read(0, md.last_entry_id)
        assert [e.payload for e in got] == acked + tail_payloads
        assert got[-1].length == md.length
    finally:
        if paused is not None:
            cluster.resume_bookie(paused)
        writer.close()
        rec.close()
