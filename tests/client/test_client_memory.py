"""Client behaviour against in-memory bookies and the metadata twin (fast).

The same behaviours run against real etcd + bookie-server processes in
test_client_real.py."""
import json
import random

import pytest

from pybk_spark import errors
from pybk_spark.ledger.client import BookKeeper
from pybk_spark.metadata.memory_store import MemoryMetadataStore
from pybk_spark.metadata.store import ledger_key
from pybk_spark.protocol import ledger_metadata as lm
from pybk_spark.transport.memory import MemoryTransportPool


def _register(store, pool, bid: str, rack: str) -> None:
    pool.add_bookie(bid)
    store.put(f"bookies/writable/{bid}", json.dumps({"bookie_id": bid, "address": "",
                                                     "rack": rack}).encode())


@pytest.fixture
def env():
    store = MemoryMetadataStore()
    pool = MemoryTransportPool()
    for i in range(5):
        _register(store, pool, f"b{i}", f"r{i % 2}")
    bk = BookKeeper(store=store, transports=pool, rng=random.Random(1), background=False)
    yield bk, store, pool
    bk.close()


def test_create_add_close_read(env):
    bk, _, _ = env
    lh = bk.create_ledger(3, 2, 2)
    assert [lh.add_entry(b"e%d" % i) for i in range(5)] == list(range(5))
    assert lh.add_entries(b"x%d" % i for i in range(100)) == list(range(5, 105))
    assert lh.last_add_confirmed == 104
    lh.close()
    md = bk.get_ledger_metadata(lh.ledger_id)
    assert md.state == lm.CLOSED and md.last_entry_id == 104
    rh = bk.open_ledger(lh.ledger_id)
    entries = rh.read(0, 104)
    assert [e.entry_id for e in entries] == list(range(105))
    assert entries[3].payload == b"e3" and entries[5].payload == b"x0"
    batches = list(rh.read_batches(0, 104, max_entries=10))
    assert sum(b.num_rows for b in batches) == 105
    assert batches[0].schema.names == ["ledger_id", "entry_id", "payload"]


def test_incorrect_parameter_before_metadata(env):
    bk, store, _ = env
    rev = store.revision() if hasattr(store, "revision") else None
    for e, w, a in [(2, 3, 2), (3, 2, 3), (3, 0, 0), (0, 0, 0)]:
        with pytest.raises(errors.IncorrectParameter):
            bk.create_ledger(e, w, a)
    if rev is not None:
        assert store.revision() == rev


def test_not_enough_bookies(env):
    bk, _, _ = env
    with pytest.raises(errors.NotEnoughBookies):
        bk.create_ledger(6, 2, 2)


def test_wrong_password_unauthorized(env):
    bk, _, _ = env
    lh = bk.create_ledger(3, 3, 2, password=b"secret", digest="hmac")
    lh.add_entry(b"a")
    lh.close()
    with pytest.raises(errors.Unauthorized):
        bk.open_ledger(lh.ledger_id, password=b"wrong")
    assert bk.open_ledger(lh.ledger_id, password=b"secret").read(0, 0)[0].payload == b"a"


def test_recovery_closes_open_ledger_and_fences_writer(env):
    bk, _, _ = env
    lh = bk.create_ledger(3, 2, 2)
    lh.add_entries([b"p%d" % i for i in range(12)])
    rh = bk.open_ledger(lh.ledger_id)          # fencing open
    assert rh.last_add_confirmed == 11 and rh.metadata.state == lm.CLOSED
    with pytest.raises(errors.LedgerFenced) as ei:
        lh.add_entry(b"late")
    assert ei.value.outcome_known is False
    lh.close()       # CLOSED at the writer's own LAC: the protocol says success
    assert bk.get_ledger_metadata(lh.ledger_id).last_entry_id == 11


def test_recovery_rewrites_partial_entry(env):
    bk, _, pool = env
    lh = bk.create_ledger(3, 2, 2)
    lh.add_entries([b"p%d" % i for i in range(12)])
    md = lh.metadata
    # entry 12 reached only one bookie of its write set (partial write)
    from pybk_spark.protocol.distribution import write_set
    from pybk_spark.wire.digest import Digester
    from pybk_spark.wire.entries import make_batch, batch_to_bytes
    slot = write_set(12, 3, 2)[0]
    length = lh.length + 3
    d = Digester("crc32c").compute(lh.ledger_id, [12], [11], [length], [b"p12"])
    pool.bookies[md.current_ensemble[slot]].add(
        lh.ledger_id, lm.master_key(b""),
        batch_to_bytes(make_batch(lh.ledger_id, [12], [11], [length], [b"p12"], d)), False)
    rh = bk.open_ledger(lh.ledger_id)
    assert rh.last_add_confirmed == 12
    assert rh.metadata.length == length == sum(len(b"p%d" % i) for i in range(13))
    assert rh.read(12, 12)[0].payload == b"p12"
    other = md.current_ensemble[write_set(12, 3, 2)[1]]
    assert 12 in pool.bookies[other].ledgers[lh.ledger_id].rows   # re-replicated
    assert bk.open_ledger(lh.ledger_id).last_add_confirmed == 12   # converges


def test_ensemble_change_on_failed_bookie(env):
    bk, _, pool = env
    lh = bk.create_ledger(3, 2, 2)
    lh.add_entries([b"a%d" % i for i in range(10)])
    victim = lh.metadata.current_ensemble[1]
    pool.down.add(victim)
    ids = lh.add_entries([b"b%d" % i for i in range(10)])
    assert ids == list(range(10, 20))
    md = lh.metadata
    assert victim not in md.current_ensemble and len(md.ensembles) == 2
    assert md.ensembles[1][0] == 10
    lh.close()
    rh = bk.open_ledger(lh.ledger_id)
    assert [e.payload for e in rh.read(0, 19)] == [b"a%d" % i for i in range(10)] + [b"b%d" % i for i in range(10)]


def test_non_recovery_open_reads_up_to_lac(env):
    bk, _, _ = env
    lh = bk.create_ledger(3, 2, 2)
    for _ in range(10):
        lh.add_entry(b"x")
    rh = bk.open_ledger(lh.ledger_id, recovery=False)
    # LAC carried by entries lags by one: entry 9 carries LAC 8
    assert rh.last_add_confirmed >= 8
    assert bk.get_ledger_metadata(lh.ledger_id).state == lm.OPEN
    lh.add_entry(b"y")
    assert lh.add_entry(b"z") == 11                       # writer not disturbed
    lh.tick(bk.clock() + 100)                              # idle -> explicit LAC
    assert rh.read_last_add_confirmed() == 11
    with pytest.raises(errors.NoSuchEntry):
        rh.read(0, 50)


def test_corrupt_replica_skipped_bad_digest_when_all(env):
    bk, _, pool = env
    lh = bk.create_ledger(3, 3, 2)
    lh.add_entries([b"v%d" % i for i in range(4)])
    lh.close()
    md = lh.metadata
    b0 = pool.bookies[md.current_ensemble[0]].ledgers[lh.ledger_id]
    b0.rows[2] = dict(b0.rows[2], payload=b"garbage")
    rh = bk.open_ledger(lh.ledger_id)
    for _ in range(3):   # whichever replica is tried first
        assert [e.payload for e in rh.read(0, 3)] == [b"v%d" % i for i in range(4)]
    for b in md.current_ensemble:
        led = pool.bookies[b].ledgers[lh.ledger_id]
        led.rows[2] = dict(led.rows[2], payload=b"garbage")
    with pytest.raises(errors.BadDigest):
        rh.read(2, 2)


def test_delete_list_custom(env):
    bk, _, _ = env
    lh = bk.create_ledger(3, 2, 2, custom_metadata={"app": "t"})
    assert lh.ledger_id in bk.list_ledgers()
    assert bk.is_writer_alive(lh.ledger_id)
    md = bk.set_custom_metadata(lh.ledger_id, {"k": "v"})
    assert md.custom == {"app": "t", "k": "v"}
    lh.close()
    assert not bk.is_writer_alive(lh.ledger_id)
    bk.delete_ledger(lh.ledger_id)
    assert lh.ledger_id not in bk.list_ledgers()
    with pytest.raises(errors.NoSuchLedger):
        bk.open_ledger(lh.ledger_id)


def test_speculative_read_and_fencing_ignore_stalled_bookie(env):
    bk, _, pool = env
    lh = bk.create_ledger(3, 3, 2)
    lh.add_entries([b"s%d" % i for i in range(20)])
    stalled = lh.metadata.current_ensemble[0]
    pool.stalled.add(stalled)
    # fencing open waits only for coverage (#1067): the stalled bookie never answers
    rh = bk.open_ledger(lh.ledger_id)
    assert rh.last_add_confirmed == 19
    for _ in range(3):     # whichever replica goes first, a speculative read completes it
        assert [e.payload for e in rh.read(0, 19)] == [b"s%d" % i for i in range(20)]
    pool.stalled.clear()


def test_client_conf_file_loads():
    import pathlib
    from pybk_spark.config import ClientConfig, load_client_conf
    path = pathlib.Path(__file__).resolve().parents[2] / "conf" / "client.conf"
    assert load_client_conf(str(path)) == ClientConfig()
    with pytest.raises(errors.IncorrectParameter):
        ClientConfig().with_overrides({"nope": 1})


def test_striped_sparse_read_with_bookie_down_and_corrupt_copy(env):
    bk, _, pool = env
    lh = bk.create_ledger(4, 2, 2)
    lh.add_entries([b"w%d" % i for i in range(50)])
    lh.close()
    md = lh.metadata
    led = pool.bookies[md.current_ensemble[1]].ledgers[lh.ledger_id]
    for e in list(led.rows)[:3]:
        led.rows[e] = dict(led.rows[e], payload=b"garbage")
    pool.down.add(md.current_ensemble[3])
    rh = bk.open_ledger(lh.ledger_id, recovery=False)
    got = [p for b in rh.read_batches(0, 49, max_entries=20) for p in b.column("payload").to_pylist()]
    assert got == [b"w%d" % i for i in range(50)]


def test_async_adds_are_coalesced_and_keep_call_order(env):
    """add_entry_async calls queued while earlier ones are sent go out as one
    batch; interleaved sync and batched adds never overtake them."""
    bk, _, _ = env
    lh = bk.create_ledger(3, 2, 2)
    futs = [lh.add_entry_async(b"a%d" % i) for i in range(500)]
    mid = lh.add_entry(b"sync")
    more = lh.add_entries([b"b0", b"b1"])
    futs += [lh.add_entry_async(b"c%d" % i) for i in range(100)]
    lh.close()                                   # queued adds are sent before the close
    ids = [f.result() for f in futs]
    assert ids[:500] == list(range(500)) and mid == 500 and more == [501, 502]
    assert ids[500:] == list(range(503, 603))
    rh = bk.open_ledger(lh.ledger_id, recovery=False)
    payloads = [e.payload for e in rh.read(0, 602)]
    assert payloads[499:503] == [b"a499", b"sync", b"b0", b"b1"] and payloads[-1] == b"c99"


def test_reserved_ledger_id_and_pending_cleanup_of_a_ledger_never_created(env):
    """A Spark task records its ledger as pending BEFORE creating it (reserved
    id): a task that dies in between leaves a pending key naming no ledger,
    which the driver's cleanup removes; a reserved id cannot be created twice."""
    from pybk_spark.spark import pending
    bk, store, _ = env
    lid = bk.reserve_ledger_id()
    assert bk.reserve_ledger_id() != lid
    pending.record(store, "lg", "job1", 0, 0, lid)          # the task died here
    other = bk.reserve_ledger_id()
    pending.record(store, "lg", "job1", 1, 0, other)
    lh = bk.create_ledger(3, 2, 2, ledger_id=other)
    assert lh.ledger_id == other
    lh.add_entry(b"x")
    lh.close()
    with pytest.raises(errors.LedgerExists):
        bk.create_ledger(3, 2, 2, ledger_id=other)
    assert sorted(pending.clean_job(bk, "lg", "job1", in_log=[])) == sorted([lid, other])
    assert store.list_prefix(pending.job_prefix("lg", "job1")) == []
    with pytest.raises(errors.NoSuchLedger):
        bk.get_ledger_metadata(other)


def test_close_after_an_aborted_ensemble_change_recovers_instead(env, monkeypatch):
    """An ensemble change that fails aborts the pending adds (unknown
    outcome); one of them is already on a bookie.  The writer's close must
    not end the ledger at its LAC: it fences and recovers,
    with its own context, not through the client's open path."""
    bk, store, pool = env
    lh = bk.create_ledger(3, 2, 2)
    lh.add_entries([b"a%d" % i for i in range(10)])
    ensemble = lh.metadata.current_ensemble
    spare = [f"b{i}" for i in range(5) if f"b{i}" not in ensemble]
    regs = {b: store.get(f"bookies/writable/{b}").value for b in spare}
    for b in spare:                         # no replacement: the change fails
        store.delete(f"bookies/writable/{b}")
    pool.hung.add(ensemble[1])              # entry 10's write set is slots (1, 2)
    with pytest.raises(errors.BKError) as info:
        lh.add_entry(b"a10")
    assert not info.value.outcome_known     # slot 2 stored it: it may be in the ledger
    for b, value in regs.items():
        store.put(f"bookies/writable/{b}", value)

    def no_reentry(*_a, **_kw):
        raise AssertionError("close() re-entered the client's open path")
    monkeypatch.setattr(bk, "open_ledger", no_reentry)
    lh.close()
    monkeypatch.undo()
    md = bk.get_ledger_metadata(lh.ledger_id)
    assert md.is_closed and md.last_entry_id == 10    # recovered, not closed at LAC 9
    assert pool.bookies[ensemble[2]].read_lac(lh.ledger_id, False, b"").fenced
    pool.hung.clear()
    rh = bk.open_ledger(lh.ledger_id, recovery=False)
    assert [e.payload for e in rh.read(0, 10)] == [b"a%d" % i for i in range(11)]


def test_a_bookie_lookup_that_raises_is_a_bookie_failure(env, monkeypatch):
    """transports.get reads the bookie's address from etcd; if that raises
    (etcd unreachable), the add must fail over like any bookie failure, not
    leave its assigned ids stranded (every later add would hang behind them)."""
    bk, _, pool = env
    lh = bk.create_ledger(3, 3, 2)
    lh.add_entries([b"x"] * 3)
    broken = lh.metadata.current_ensemble[0]
    real_get = pool.get

    def get(bookie_id):
        if bookie_id == broken:
            raise errors.MetadataUnavailable("etcd unreachable")
        return real_get(bookie_id)
    monkeypatch.setattr(pool, "get", get)
    assert lh.add_entry(b"y") == 3
    assert broken not in lh.metadata.current_ensemble
    assert lh.add_entry(b"z") == 4
    lh.close()
    assert bk.get_ledger_metadata(lh.ledger_id).last_entry_id == 4


def test_recovery_after_a_crashed_recovery_changed_the_ensemble(env):
    """Chaos seed 2026112207 (ledger 3537): a recovery replaced a
    failed bookie in a new fragment, then died before re-writing the entries
    beyond its boundary.  The next recovery read those entries from the new
    ensemble, where the replacement answered NoSuchEntry, and closed before
    acknowledged entries (I1).  It must also ask the writer's bookie."""
    bk, store, pool = env
    for bid in ("b5", "b6"):
        _register(store, pool, bid, "r0")
    lh = bk.create_ledger(4, 2, 2)
    lh.add_entries([b"e%d" % i for i in range(20)])    # bookies' LAC: 18; 19 is acked
    lid, writer_ensemble = lh.ledger_id, lh.metadata.current_ensemble
    spare = next(b for b in ("b4", "b5", "b6") if b not in writer_ensemble)
    # the crashed recovery: IN_RECOVERY, then a fragment at 19 replacing slot 3
    # (19's write set is slots 3, 0), and nothing re-written
    store.update(ledger_key(lid), lambda r: lm.to_in_recovery(lm.LedgerMetadata.from_json(r)).to_json())
    store.update(ledger_key(lid), lambda r: lm.replace_bookies(
        lm.LedgerMetadata.from_json(r), 19, {3: spare}, by_writer=False).to_json())
    pool.hung.add(writer_ensemble[0])       # 19's other copy answers nothing useful
    rh = bk.open_ledger(lid)
    assert rh.metadata.last_entry_id == 19, "closed before an acknowledged entry"
    pool.hung.clear()
    assert [e.payload for e in rh.read(0, 19)] == [b"e%d" % i for i in range(20)]


# -- the length a recovery closes at (each entry carries its cumulative length) --------------
def _sizes(payloads) -> int:
    return sum(len(p) for p in payloads)


def test_recovery_length_of_an_empty_ledger(env):
    bk, _, _ = env
    lh = bk.create_ledger(3, 2, 2)
    md = bk.open_ledger(lh.ledger_id).metadata
    assert (md.state, md.last_entry_id, md.length) == (lm.CLOSED, -1, 0)


def test_recovery_length_when_nothing_follows_the_lac(env):
    """Tail of 0 entries: every bookie knows the LAC (an explicit LAC), so
    recovery finds nothing after it and reads the LAC entry's length."""
    bk, _, pool = env
    decisions = []
    bk.recovery_listener = decisions.append
    lh = bk.create_ledger(3, 2, 2)
    payloads = [b"x" * (i + 1) for i in range(10)]
    lh.add_entries(payloads[:4])
    lh.add_entries(payloads[4:])                 # two chunks: lengths carry across them
    for b in lh.metadata.current_ensemble:
        pool.get(b).write_lac(lh.ledger_id, lm.master_key(b""), lh.last_add_confirmed)
    md = bk.open_ledger(lh.ledger_id).metadata
    assert [(d.start, d.last) for d in decisions] == [(9, 9)]
    assert (md.last_entry_id, md.length) == (9, _sizes(payloads))


def test_recovery_length_with_an_unconfirmed_tail(env):
    """Tail of 3 entries that reached two bookies of a Qa = Qw = 3 ledger
    (never acknowledged): recovery re-writes them, unchanged, and closes at
    the length the last one carries."""
    bk, _, pool = env
    decisions = []
    bk.recovery_listener = decisions.append
    lh = bk.create_ledger(3, 3, 3)
    acked, tail = [b"a" * (i + 1) for i in range(5)], [b"t" * (10 + i) for i in range(3)]
    lh.add_entries(acked)
    for b in lh.metadata.current_ensemble:       # the writer's explicit LAC while idle
        pool.get(b).write_lac(lh.ledger_id, lm.master_key(b""), lh.last_add_confirmed)
    paused = lh.metadata.current_ensemble[0]
    pool.stalled.add(paused)
    futs = lh.add_entries_async(tail)            # on the two others; never Qa acks
    pool.stalled.discard(paused)
    rh = bk.open_ledger(lh.ledger_id)
    md = rh.metadata
    assert not any(f.done() for f in futs)
    assert [(d.start, d.last) for d in decisions] == [(4, 7)]
    assert (md.last_entry_id, md.length) == (7, _sizes(acked + tail))
    got = rh.read(0, 7)
    assert [e.payload for e in got] == acked + tail
    assert [e.length for e in got] == [_sizes((acked + tail)[:i + 1]) for i in range(8)]


def test_handles_get_one_typed_context(env):
    """Handles, readers and recovery take their dependencies from the
    client's ClientContext; replacing a part of it replaces the context."""
    from pybk_spark.ledger.context import ClientContext
    bk, _, pool = env
    ctx = bk.context
    assert isinstance(ctx, ClientContext)
    assert (ctx.transports, ctx.metadata_store, ctx.placement, ctx.conf) == (
        bk.transports, bk.metadata_store, bk.placement, bk.conf)
    lh = bk.create_ledger(3, 2, 2)
    lh.add_entry(b"x")
    assert lh.ctx is ctx
    decisions = []
    bk.recovery_listener = decisions.append
    assert bk.context is not ctx and bk.context.recovery_listener == decisions.append
    rh = bk.open_ledger(lh.ledger_id)
    assert rh.ctx is bk.context and [d.last for d in decisions] == [0]


def test_a_writer_lease_whose_key_could_not_be_written_is_let_go():
    """The writer's liveness key is advisory: a create whose put of it fails
    still creates the ledger, and revokes the lease it had granted for it
    (a lease left behind would be kept alive by its thread for the life of
    the process)."""
    class NoWriterKeys(MemoryMetadataStore):
        def put(self, key, value, lease=None):
            if key.startswith("writers/"):
                raise errors.MetadataUnavailable("etcd went away")
            return super().put(key, value, lease)

    store, pool = NoWriterKeys(), MemoryTransportPool()
    for i in range(3):
        _register(store, pool, f"b{i}", "r")
    with BookKeeper(store=store, transports=pool, rng=random.Random(1), background=False) as bk:
        lh = bk.create_ledger(3, 2, 2)
        assert lh.add_entry(b"x") == 0
        assert store._shared.leases == {}
        lh.close()
