"""Unit tests of the bookie's pure parts and of the journal in isolation."""
from __future__ import annotations

import dataclasses
import os
import re
import threading
from concurrent.futures import Future

import numpy as np
import pyarrow as pa
import pytest

from bookie_server import cookie
from pybk_spark.protocol import ledger_state as ls
from bookie_server.background import gc_candidates, next_read_only
from bookie_server.serving.metrics import BookieMetrics
from pybk_spark.wire.add_validation import max_value_length
from bookie_server.config import BookieConfig, load_config, parse_conf_text
from bookie_server.storage.run_index import runs_of
from bookie_server.journal.journal import Journal, Position, RecordType
from bookie_server.journal.journal_replay import replay
from bookie_server.journal.records import Submission
from pybk_spark import errors

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


# -- ledger_state ------------------------------------------------------------------------
def test_add_decisions():
    s = ls.empty(1)
    plan = ls.decide_add(s, b"k", recovery=False, read_only=False)
    assert plan.record_key and plan.state.master_key == b"k"
    s = plan.state
    assert not ls.decide_add(s, b"k", recovery=False, read_only=False).record_key
    with pytest.raises(errors.Unauthorized):
        ls.decide_add(s, b"x", recovery=True, read_only=False)
    with pytest.raises(errors.Unauthorized):
        ls.decide_add(s, b"", recovery=False, read_only=False)
    with pytest.raises(errors.ReadOnly):
        ls.decide_add(s, b"k", recovery=False, read_only=True)
    assert ls.decide_add(s, b"k", recovery=True, read_only=True).state == s
    f = ls.decide_fence(s, b"k")
    assert f.record_fence and not f.record_key and f.state.fenced
    with pytest.raises(errors.LedgerFenced) as exc:
        ls.decide_add(f.state, b"k", recovery=False, read_only=False)
    assert exc.value.outcome_known is False
    assert ls.decide_add(f.state, b"k", recovery=True, read_only=False).state.fenced
    again = ls.decide_fence(f.state, b"k")
    assert not again.record_fence and not again.record_key


def test_fence_records_key_of_unknown_ledger_and_lac_is_max():
    f = ls.decide_fence(ls.empty(2), b"k")
    assert f.record_key and f.record_fence
    s = ls.apply_entries(ls.empty(2), max_lac=5, max_entry_id=7)
    s = ls.apply_explicit_lac(s, 3)
    assert s.lac == 5 and s.last_entry_id == 7
    s = ls.apply_explicit_lac(s, 9)
    assert s.lac == 9
    assert ls.LedgerState.from_json(s.to_json()) == s


# -- cookie ----------------------------------------------------------------------------------
def test_cookie_decisions():
    c = {"bookie_id": "b", "instance_id": "1", "entry_format": cookie.ENTRY_FORMAT}
    assert cookie.decide("b", None, None, False, standalone=False) == cookie.CREATE
    assert cookie.decide("b", c, c, True, standalone=False) == cookie.OK
    for local, remote, data in [(None, c, False), (None, c, True), (c, None, True),
                                (c, {**c, "instance_id": "2"}, True), (None, None, True),
                                ({**c, "bookie_id": "other"}, c, True)]:
        with pytest.raises(errors.InvalidCookie):
            cookie.decide("b", local, remote, data, standalone=False)
    assert cookie.decide("b", None, None, False, standalone=True) == cookie.CREATE
    assert cookie.decide("b", c, None, True, standalone=True) == cookie.OK
    assert cookie.new_cookie("b")["entry_format"] == cookie.ENTRY_FORMAT


@pytest.mark.parametrize("standalone", [False, True])
def test_cookie_of_a_data_dir_in_the_entry_format_before_length_is_refused(standalone):
    old = {"bookie_id": "b", "instance_id": "1", "version": 1}       # no entry_format
    with pytest.raises(errors.InvalidCookie, match="cumulative length"):
        cookie.decide("b", old, old, True, standalone=standalone)


# -- background decisions -----------------------------------------------------------------------
def test_read_only_hysteresis():
    assert next_read_only(False, 0.96, 0.95, 0.90) is True
    assert next_read_only(True, 0.93, 0.95, 0.90) is True
    assert next_read_only(True, 0.89, 0.95, 0.90) is False
    assert next_read_only(False, 0.93, 0.95, 0.90) is False


def test_gc_candidates():
    keys = ["ledgers/00000000000000000001", "ledgers/00000000000000000003", "ledgers/junk"]
    assert gc_candidates([1, 2, 3, 4], keys) == [2, 4]


def test_runs_of():
    s, e, r = runs_of(np.array([0, 1, 2, 5, 6, 9], np.int64))
    assert s.tolist() == [0, 5, 9] and e.tolist() == [2, 6, 9] and r.tolist() == [0, 3, 5]
    for ids, want in (([7, 8, 9], ([7], [9], [0])), ([4], ([4], [4], [0])), ([], ([], [], []))):
        got = runs_of(np.array(ids, np.int64))
        assert tuple(a.tolist() for a in got) == want, ids


def test_max_value_length_reads_the_offsets_of_slices_too():
    arr = pa.array([b"a", b"bbbb", b"cc"], pa.binary())
    assert max_value_length(arr) == 4
    assert [max_value_length(arr.slice(i, 1)) for i in range(3)] == [1, 4, 2]
    assert max_value_length(arr.slice(1, 2)) == 4 and max_value_length(arr.slice(2, 1)) == 2


# -- config -------------------------------------------------------------------------------------
def test_conf_file_documents_every_key_with_its_default():
    text = open(os.path.join(ROOT, "conf", "bookie.conf")).read()
    documented = dict(re.findall(r"^# (\w+) = ?(\S*)", text, re.M))
    defaults = BookieConfig()
    for f in dataclasses.fields(BookieConfig):
        assert f.name in documented, f.name
        shown = parse_conf_text(f"{f.name} = {documented[f.name]}").get(f.name, "")
        assert shown == getattr(defaults, f.name), f.name
    assert load_config(os.path.join(ROOT, "conf", "bookie.conf")) == defaults


def test_conf_rejects_unknown_keys_and_bad_values():
    with pytest.raises(ValueError):
        parse_conf_text("no_such_key = 1")
    with pytest.raises(ValueError):
        parse_conf_text("port = eighty")
    assert parse_conf_text("port = 1  # comment\njournal_sync_data = false") == \
        {"port": 1, "journal_sync_data": False}
    with pytest.raises(ValueError, match="read_buffers_at_start_mb"):
        load_config(None, {"read_buffers_at_start_mb": -1})
    with pytest.raises(ValueError, match="pull_buffers_at_start_mb"):
        load_config(None, {"pull_buffers_at_start_mb": -1})


# -- journal ------------------------------------------------------------------------------------
class _Recorder:
    def __init__(self):
        self.groups = []

    def journal_fsync(self, seconds, group_len, nbytes):
        self.groups.append(group_len)


@pytest.mark.parametrize("drop_page_cache", [False, True])
def test_journal_group_commit_and_replay(tmp_path, drop_page_cache):
    rec = _Recorder()
    j = Journal(str(tmp_path), metrics=rec, max_group_bytes=1 << 20, prealloc_bytes=1 << 16,
                page_cache_keep_bytes=0 if drop_page_cache else None)
    durable = []
    futs = [j.submit([(RecordType.FENCE, i.to_bytes(8, "little"))]) for i in range(10)]
    j.start(lambda group, pos: durable.extend(group))     # all 10 queued before start
    positions = [f.result() for f in futs]
    assert rec.groups[0] == 10, "queued submissions share one fdatasync"
    assert len(set(positions)) == 1 and len(durable) == 10
    big = j.submit([(RecordType.ADD_BATCH, b"x" * 100)]).result()
    assert big > positions[0]
    j.close()
    got = list(replay(str(tmp_path), Position(0, 0)))
    assert [r[1] for r in got] == [RecordType.FENCE] * 10 + [RecordType.ADD_BATCH]
    assert [int.from_bytes(r[2], "little") for r in got[:10]] == list(range(10))
    # replay from a checkpoint position skips what is before it
    assert len(list(replay(str(tmp_path), positions[0]))) == 1


def test_journal_leader_writes_on_the_callers_thread_when_idle(tmp_path):
    where = []
    j = Journal(str(tmp_path), lead_max_bytes=1024)
    j.start(lambda group, pos: where.append(threading.current_thread().name))
    small = j.write([(RecordType.FENCE, b"\0" * 8)])
    assert small.done(), "an idle journal's leader completes before write() returns"
    big = j.write([(RecordType.ADD_BATCH, b"z" * 4096)])   # over lead_max_bytes
    big.result(10)
    j.close()
    assert where == [threading.current_thread().name, "journal-sync"]


def test_journal_leader_and_pipeline_keep_submission_order(tmp_path):
    """Leaders (queued or claimed inline) and the writer thread take turns;
    whatever the interleaving,
    each thread's records are durable in the order it submitted them, and
    the on_durable order is the file order."""
    rec = _Recorder()
    durable = []
    j = Journal(str(tmp_path), metrics=rec, lead_max_bytes=64, prealloc_bytes=0,
                max_file_bytes=20_000)                       # rolls several times
    j.start(lambda group, pos: durable.extend(sub.records[0][1] for sub in group))
    per_thread = 300

    def worker(t: int) -> None:
        futs = []
        for i in range(per_thread):
            body = bytes([t]) + i.to_bytes(4, "little") + (b"." * (100 if i % 7 == 0 else 3))
            recs: list = [(RecordType.ADD_BATCH, body)]
            sub = Submission(recs)
            if i % 5 == 0 and j.claim(sub):     # inline, when the journal is idle
                done: Future = Future()
                done.set_result(j.lead_now(sub))
                futs.append(done)
            else:
                futs.append(j.write(recs) if i % 3 else j.submit(recs))
        positions = [f.result(30) for f in futs]
        assert positions == sorted(positions)

    threads = [threading.Thread(target=worker, args=(t,)) for t in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    j.close()
    assert len(durable) == 4 * per_thread
    for t in range(4):
        mine = [int.from_bytes(b[1:5], "little") for b in durable if b[0] == t]
        assert mine == list(range(per_thread))
    replayed = [body for _pos, _type, body in replay(str(tmp_path), Position(0, 0))]
    assert replayed == durable
    assert sum(rec.groups) == 4 * per_thread       # every record counted in one fdatasync


def test_journal_rolls_and_deletes_before_checkpoint(tmp_path):
    j = Journal(str(tmp_path), max_file_bytes=300, prealloc_bytes=0)
    j.start(lambda group, pos: None)
    pos = [j.submit([(RecordType.ADD_BATCH, b"y" * 200)]).result() for _ in range(5)]
    assert len({p.seq for p in pos}) >= 3
    kept = pos[0].seq                      # e.g. still holds an indexed batch
    removed = j.delete_before(pos[-1], keep=frozenset({kept}))
    assert len(removed) >= 1 and kept not in removed
    assert os.path.exists(j.path_of(kept))
    j.close()
    left = list(replay(str(tmp_path), Position(0, 0)))
    assert 1 <= len(left) < 5


def test_journal_submissions_fail_after_close(tmp_path):
    j = Journal(str(tmp_path))
    j.start(lambda group, pos: None)
    j.close()
    with pytest.raises(errors.BookieIOError):
        j.submit([(RecordType.FENCE, b"\0" * 8)]).result()


def test_fence_linearizes_with_concurrent_adds(tmp_path):
    """Whatever the interleaving: every plain add acknowledged at any time is
    already readable when the fence returns (so recovery cannot miss it)."""

    from bookie_server.bookie import Bookie
    from pybk_spark.testing.bookie_process import entries_bytes

    b = Bookie(BookieConfig(data_dir=str(tmp_path), flush_interval_s=3600)).open()
    try:
        for round_ in range(5):
            ledger = 100 + round_
            acked, stop = [], threading.Event()
            first_ack = threading.Event()

            def writer():
                futs, eid = [], 0
                while not stop.is_set():
                    try:
                        fut, first, last = b.add_async(ledger, b"k", entries_bytes(ledger, [eid]))
                    except errors.LedgerFenced:
                        break
                    futs.append((fut, eid))
                    eid += 1
                    while futs and futs[0][0].done():
                        f, e = futs.pop(0)
                        if f.exception() is None:
                            acked.append(e)
                            first_ack.set()
                for f, e in futs:
                    try:
                        f.result()
                        acked.append(e)
                    except errors.BKError:
                        pass

            t = threading.Thread(target=writer)
            t.start()
            assert first_ack.wait(60)
            b.fence(ledger, b"k")
            stored, nxt = set(), 0
            while True:
                r = b.read(ledger, nxt, 10 ** 6)
                stored.update(r.batch.column(1).to_pylist())
                nxt = max(stored) + 1
                if r.end != "LIMIT":
                    break
            stop.set()
            t.join(60)
            assert acked and set(acked) <= stored, sorted(set(acked) - stored)[:5]
            with pytest.raises(errors.LedgerFenced):
                b.add(ledger, b"k", entries_bytes(ledger, [10 ** 6]))
    finally:
        b.close()


def test_failed_fdatasync_turns_the_bookie_read_only_until_restart(tmp_path):
    """A journal fdatasync that fails (EIO here, injected at the syscall the
    journal is given) fails that add and every later one with a typed error,
    turns the bookie read-only (listeners such as the registrar are told),
    keeps what was acknowledged readable, and cannot be undone by the disk
    checker; a restart replays the journal and the bookie is writable again."""
    import errno

    from bookie_server.bookie import Bookie
    from pybk_spark.testing.bookie_process import entries_bytes

    failing = threading.Event()

    def fdatasync(fd):
        if failing.is_set():
            raise OSError(errno.EIO, "injected EIO")
        os.fdatasync(fd)

    cfg = BookieConfig(data_dir=str(tmp_path), flush_interval_s=3600)
    b = Bookie(cfg, fsync=fdatasync).open()
    modes = []
    switched = threading.Event()
    b.add_mode_listener(lambda ro: (modes.append(ro), switched.set()))
    try:
        assert b.add(7, b"k", entries_bytes(7, [0, 1])) == (0, 1)
        failing.set()
        with pytest.raises(errors.BookieIOError):
            b.add(7, b"k", entries_bytes(7, [2]))
        assert switched.wait(30) and modes == [True] and b.read_only
        assert b.io_error and "EIO" in b.io_error
        with pytest.raises((errors.BookieIOError, errors.ReadOnly)):
            b.add(7, b"k", entries_bytes(7, [3]))
        assert not b.set_read_only(False) and b.read_only       # the disk checker's call
        got = b.read(7, 0, 1)
        assert got.batch.column("entry_id").to_pylist() == [0, 1]
    finally:
        b.close(checkpoint=False)
    b = Bookie(cfg).open()
    try:
        assert not b.read_only and b.io_error is None
        assert b.read(7, 0, 1).batch.column("entry_id").to_pylist() == [0, 1]
        assert b.add(7, b"k", entries_bytes(7, [2])) == (2, 2)
    finally:
        b.close()


def test_big_batches_stay_in_the_journal_and_are_never_copied(tmp_path):
    """A big add batch is indexed where the journal wrote it: a checkpoint
    writes no segment bytes for it, the journal file it lives in survives
    later checkpoints and restarts while the ledger lives, and goes once GC
    has deleted the ledger; small batches still go to segments."""
    from bookie_server.bookie import Bookie
    from bookie_server.journal.journal import list_files
    from pybk_spark.testing.bookie_process import entries_bytes, payload_for

    cfg = BookieConfig(data_dir=str(tmp_path), flush_interval_s=3600,
                       journal_max_file_bytes=300_000, journal_prealloc_bytes=0)
    seg_dir = tmp_path / "store" / "segments"
    jdir = str(tmp_path / "journal")

    def seg_bytes() -> int:
        return sum(p.stat().st_size for p in seg_dir.glob("*.seg"))

    b = Bookie(cfg).open(background=False)
    b.add(1, b"k", entries_bytes(1, range(0, 200), size=1000))      # ~200 KB: big
    b.add(2, b"k", entries_bytes(2, range(0, 3), size=10))          # small
    first_file = list_files(jdir)[0]
    b.checkpoint()
    assert 0 < seg_bytes() < 10_000, "only the small batch was written to a segment"
    for i in range(3):                     # roll past the first journal file
        b.add(2, b"k", entries_bytes(2, range(3 + 200 * i, 203 + 200 * i), size=1000))
    b.checkpoint()
    assert first_file in list_files(jdir), "the file holding ledger 1's batch is kept"
    b.close()

    b = Bookie(cfg).open(background=False)
    got = b.read(1, 0, 199).batch
    assert got.column(1).to_pylist() == list(range(200))
    assert got.column(3).to_pylist() == [payload_for(1, e, 1000) for e in range(200)]
    b.delete_ledger(1)
    b.delete_ledger(2)
    b.checkpoint()
    b.checkpoint()
    assert first_file not in list_files(jdir), "deleted once no live batch is in it"
    b.close()


def test_checkpoint_compacts_a_sparse_segment_and_survives_restart(tmp_path):
    """After GC leaves a segment mostly dead, the checkpoint copies the live
    batch into a new segment, persists an index pointing there and deletes
    the old file; the data reads back the same, also after a restart."""
    from bookie_server.bookie import Bookie
    from pybk_spark.testing.bookie_process import entries_bytes, payload_for

    cfg = BookieConfig(data_dir=str(tmp_path), flush_interval_s=3600,
                       compaction_min_live_ratio=0.5)
    seg_dir = tmp_path / "store" / "segments"

    def segments() -> dict[str, int]:
        return {p.name: p.stat().st_size for p in seg_dir.glob("*.seg")}

    b = Bookie(cfg).open(background=False)
    for i in range(10):                     # small adds: merged into segments
        b.add(1, b"k", entries_bytes(1, range(10 * i, 10 * i + 10), size=500))
    b.add(2, b"k", entries_bytes(2, range(0, 10), size=500))
    b.checkpoint()
    (old,) = segments()
    b.delete_ledger(1)                      # ~90% of the segment is now dead
    b.checkpoint()
    now = segments()
    assert old not in now and len(now) == 1, now
    assert next(iter(now.values())) < 10_000, "only ledger 2's batch was copied"
    want = [payload_for(2, e, 500) for e in range(10)]
    assert b.read(2, 0, 9).batch.column(3).to_pylist() == want
    b.close()

    b = Bookie(cfg).open(background=False)
    assert b.read(2, 0, 9).batch.column(3).to_pylist() == want
    with pytest.raises(errors.NoSuchLedger):
        b.read(1, 0, 0)
    b.close()


def test_idle_restarts_never_move_the_checkpoint_back(tmp_path):
    """A restart that replays nothing starts from the checkpoint's position
    (not the journal's beginning), and the fresh journal file it opens moves
    the mark past the empty ones: a later checkpoint never rewinds, and idle
    restart cycles do not pile up journal files."""
    import json

    from bookie_server.bookie import Bookie
    from bookie_server.journal.journal import list_files
    from pybk_spark.testing.bookie_process import entries_bytes

    cfg = BookieConfig(data_dir=str(tmp_path), flush_interval_s=3600, journal_prealloc_bytes=0)
    jdir = str(tmp_path / "journal")

    def mark() -> tuple[int, int]:
        doc = json.loads((tmp_path / "checkpoint.json").read_text())
        return doc["journal_seq"], doc["journal_offset"]

    b = Bookie(cfg).open(background=False)
    b.add(1, b"k", entries_bytes(1, range(0, 3), size=10))
    b.close()
    marks = [mark()]
    for clean in (False, True, False, True, True):
        b = Bookie(cfg).open(background=False)
        b.close(checkpoint=clean)
        marks.append(mark())
    assert marks == sorted(marks) and marks[-1] > marks[0], marks
    assert len(list_files(jdir)) <= 3, list_files(jdir)
    b = Bookie(cfg).open(background=False)
    assert b.read(1, 0, 2).batch.num_rows == 3
    b.close()


def test_both_journal_crc_implementations_give_the_same_values():
    """The optional ``crc32c`` package (the fastcrc extra) and google_crc32c
    must agree, so a journal written with one replays with the other."""
    import pyarrow as pa
    from bookie_server.journal import journal_crc as journal
    if not journal.FAST_AVAILABLE:
        pytest.skip("the fastcrc extra (crc32c package) is not installed")
    rng = np.random.default_rng(5)
    for size in (0, 1, 7, 4096, 1 << 20):
        body = rng.bytes(size)
        for rtype in (1, 2, 5, 255):
            want = journal.crc_of_google(rtype, body)
            assert journal.crc_of_fast(rtype, body) == want
            assert journal.crc_of_fast(rtype, pa.py_buffer(body)) == want
            assert journal.crc_of_fast(rtype, memoryview(body)) == want


def test_the_google_crc_takes_every_body_a_record_can_have():
    """Without the fastcrc extra, records received into buffers (a lone add's
    frame: a writable memoryview) are summed by google_crc32c, which takes
    bytes only; each kind of body gives the value of its bytes."""
    import pyarrow as pa
    from bookie_server.journal import journal_crc as journal
    body = bytes(range(256)) * 5
    want = journal.crc_of_google(3, body)
    for kind in (bytearray(body), memoryview(bytearray(body)), memoryview(body),
                 memoryview(body).toreadonly(), pa.py_buffer(body)):
        assert journal.crc_of_google(3, kind) == want, type(kind)


def test_sparse_reads_of_many_rows_slice_contiguous_runs_and_take_gapped_ones(tmp_path):
    """A sparse read of more than SLICE_READ_MAX_ROWS rows: a run of rows of
    one stored batch that is contiguous is answered as a slice, a gapped one
    (a striped read's rows) with take(); either way every stored id, in
    order, with its own payload, before and after a checkpoint."""
    from bookie_server.bookie import Bookie
    from bookie_server.storage.entry_store import SLICE_READ_MAX_ROWS
    from pybk_spark.testing.bookie_process import entries_bytes, payload_for

    gapped = list(range(600, 1800, 3))                     # one stored batch with gaps
    stored = list(range(0, 600)) + gapped + list(range(1801, 2400))
    assert len(stored) > 4 * SLICE_READ_MAX_ROWS
    cfg = BookieConfig(data_dir=str(tmp_path), flush_interval_s=3600,
                       journal_prealloc_bytes=0)
    b = Bookie(cfg).open(background=False)
    try:
        for ids in (range(0, 600), gapped, range(1801, 2400)):
            b.add(1, b"k", entries_bytes(1, ids, size=50), recovery=True)
        for when in ("journal", "segments"):
            for first, last in ((0, 3000), (590, 1805), (601, 1700)):
                got = b.read(1, first, last, sparse=True, max_entries=10_000).batch
                want = [e for e in stored if first <= e <= last]
                assert got.column(1).to_pylist() == want, (when, first, last)
                assert got.column(3).to_pylist() == [payload_for(1, e, 50) for e in want]
            got = b.read(1, 0, 3000, sparse=True, max_entries=10_000, stripe=(3, 1)).batch
            want = [e for e in stored if e % 3 == 1]           # rows of a batch, with gaps
            assert got.column(1).to_pylist() == want, when
            assert got.column(3).to_pylist() == [payload_for(1, e, 50) for e in want]
            b.checkpoint()
    finally:
        b.close()


def test_add_metrics_of_every_thread_are_exported_under_their_names():
    """The add path's counters and histograms are per-thread numbers summed
    at scrape time, under the names, labels and buckets of before; the
    numbers of threads that ended stay counted."""
    from prometheus_client import generate_latest
    m = BookieMetrics()

    def adds() -> None:
        m.hot.add_ok(3, 300, 0.0003)
        m.hot.add_error()
        m.journal_fsync(0.001, 2, 1500)
    for _ in range(3):
        t = threading.Thread(target=adds)
        t.start()
        t.join()
    adds()
    text = generate_latest(m.registry).decode()
    for line in ('bookie_add_requests_total{outcome="ok"} 4.0',
                 'bookie_add_requests_total{outcome="error"} 4.0',
                 "bookie_add_entries_total 12.0", "bookie_add_bytes_total 1200.0",
                 'bookie_add_latency_seconds_bucket{le="0.0002"} 0.0',
                 'bookie_add_latency_seconds_bucket{le="0.0005"} 4.0',
                 'bookie_add_latency_seconds_bucket{le="+Inf"} 4.0',
                 "bookie_add_latency_seconds_count 4.0",
                 'bookie_journal_fdatasync_seconds_bucket{le="0.001"} 4.0',
                 'bookie_journal_group_requests_bucket{le="1.0"} 0.0',
                 'bookie_journal_group_requests_bucket{le="2.0"} 4.0',
                 "bookie_journal_group_requests_sum 8.0",
                 'bookie_journal_group_bytes_bucket{le="10000.0"} 4.0'):
        assert line in text.splitlines(), line
    assert len(m.hot._cells) <= 1, "the lists of threads that ended are folded"
