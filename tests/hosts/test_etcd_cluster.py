"""A 3-member etcd on 3 hosts and 3 bookies on 3 more; the test process (root
namespace) is the client, through ``etcd://e1:2379,e2:2379,e3:2379/scope``.

Scenarios: write and read back; the etcd leader SIGKILLed in the
middle of writes (writers carry on, no acknowledged entry lost, metadata
works again through the survivors); the leader partitioned from the other
members during writes and a fencing recovery (the majority carries on, the
cut-off member takes no write); a rolling restart of every member under
writes; every member down -> ``MetadataUnavailable`` naming the endpoints
within the operation's bound (and likewise with one member: no quorum), then
recovery by itself once the members are back.  Waits are on progress and
readiness; the only time bounds are the ones the store promises.
"""
from __future__ import annotations

import threading
import time

import pytest

from pybk_spark import errors
from pybk_spark.ledger.client import BookKeeper

pytestmark = pytest.mark.slow


def _bk(cluster):
    return BookKeeper(cluster.metadata_uri, conf={"explicit_lac_interval_ms": 0})


def _until(pred, timeout: float, what: str):
    """Poll ``pred`` (readiness, not a sleep-for-effect) until it returns truthy."""
    deadline = time.monotonic() + timeout
    while True:
        got = pred()
        if got:
            return got
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(0.05)


def _retry_metadata(fn, timeout: float = 60.0):
    """Run a metadata-touching call until it succeeds (unknown outcomes tolerated)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            return fn()
        except errors.MetadataUnavailable:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)


class Writers:
    """N threads, each adding to its own ledger until stopped; records acks."""

    def __init__(self, bk, n: int = 2):
        self.handles = [bk.create_ledger(3, 2, 2) for _ in range(n)]
        self.acked: dict[int, dict[int, bytes]] = {lh.ledger_id: {} for lh in self.handles}
        self.failures: list[BaseException] = []
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._run, args=(lh,), daemon=True)
                         for lh in self.handles]

    def _run(self, lh) -> None:
        i = 0
        while not self._stop.is_set():
            payload = b"%d:%d" % (lh.ledger_id, i)
            try:
                eid = lh.add_entry(payload)
            except BaseException as exc:        # noqa: BLE001 - reported by the test
                self.failures.append(exc)
                return
            self.acked[lh.ledger_id][eid] = payload
            i += 1

    def count(self) -> int:
        return sum(len(a) for a in self.acked.values())

    def wait_more(self, n: int, timeout: float = 120.0) -> None:
        target = self.count() + n
        _until(lambda: self.count() >= target or self.failures, timeout, f"{n} more acks")
        assert not self.failures, self.failures

    def __enter__(self) -> "Writers":
        for t in self._threads:
            t.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(120)

    def verify(self, cluster) -> None:
        """Close the ledgers, reopen them from a fresh client: every acked entry is there."""
        assert not self.failures, self.failures
        for lh in self.handles:
            _retry_metadata(lh.close)
        reader = _bk(cluster)
        try:
            for lid, acked in self.acked.items():
                assert acked, f"ledger {lid}: nothing was acknowledged"
                rh = _retry_metadata(lambda: reader.open_ledger(lid))
                assert rh.last_add_confirmed >= max(acked)
                got = {e.entry_id: e.payload for e in rh.read(0, max(acked))}
                assert {e: got.get(e) for e in acked} == acked
        finally:
            reader.close()


def test_write_and_read_back_across_hosts(host_cluster):
    regs = [host_cluster.wait_registered(b) for b in host_cluster.bookie_ids]
    hosts = {b.host.address for b in host_cluster.bookies.values()}
    assert {r["address"].rsplit(":", 1)[0] for r in regs} == hosts
    assert host_cluster.metadata_uri.count(",") == 2
    bk = _bk(host_cluster)
    try:
        lh = bk.create_ledger(3, 2, 2)
        assert lh.add_entries(b"entry-%d" % i for i in range(500)) == list(range(500))
        lh.close()
        rh = bk.open_ledger(lh.ledger_id)
        got = rh.read(0, 499)
        assert [e.payload for e in got] == [b"entry-%d" % i for i in range(500)]
    finally:
        bk.close()


def test_etcd_leader_killed_mid_writes(host_cluster):
    etcd = host_cluster.etcd
    bk = _bk(host_cluster)
    leader = None
    try:
        with Writers(bk) as writers:
            writers.wait_more(200)
            leader = etcd.leader()
            before = writers.count()
            leader.kill()
            new_leader = etcd.leader()
            print(f"killed leader {leader.name}; new leader {new_leader.name}")
            assert new_leader is not leader
            writers.wait_more(500)                     # writers carry on
            lh = _retry_metadata(lambda: bk.create_ledger(3, 2, 2))   # metadata via survivors
            lh.add_entry(b"after the failover")
            _retry_metadata(lh.close)
        print(f"acks: {before} before the kill, {writers.count()} at the end")
        writers.verify(host_cluster)
    finally:
        bk.close()
        if leader is not None:
            leader.start()
        etcd.wait_healthy()


def test_rolling_restart_of_every_member(host_cluster):
    etcd = host_cluster.etcd
    bk = _bk(host_cluster)
    try:
        with Writers(bk) as writers:
            writers.wait_more(100)
            for member in etcd.members:
                member.stop()                          # SIGTERM
                writers.wait_more(100)
                member.start()                         # waits for /health (quorum, leader)
                etcd.wait_healthy()
                _retry_metadata(lambda: bk.create_ledger(3, 2, 2)).close()
            writers.wait_more(100)
        writers.verify(host_cluster)
    finally:
        bk.close()


def _bounded_unavailable(what: str, op, bound: float) -> errors.MetadataUnavailable:
    t0 = time.monotonic()
    with pytest.raises(errors.MetadataUnavailable) as caught:
        op()
    took = time.monotonic() - t0
    print(f"{what}: MetadataUnavailable after {took:.2f}s: {caught.value}")
    assert took < bound
    assert "endpoints=" in str(caught.value)
    return caught.value


def test_no_quorum_then_all_down_is_unavailable_then_recovers(host_cluster):
    from pybk_spark.metadata.etcd_store import EtcdMetadataStore
    etcd = host_cluster.etcd
    timeout, read_retry = 2.0, 1.0
    bound = read_retry + timeout + 5.0                 # the store's promise + slack for load
    store = EtcdMetadataStore(etcd.endpoints, host_cluster.scope, timeout=timeout,
                              read_retry=read_retry)
    ops = {"get": lambda: store.get("hosts-test/probe"),
           "put_if_absent": lambda: store.put_if_absent("hosts-test/new", b"x"),
           "list_prefix": lambda: store.list_prefix("hosts-test/")}
    try:
        # readiness: right after the rolling restart above, the first request to
        # the member restarted last can still fail to connect, and a put is
        # not retried by the store
        assert _retry_metadata(lambda: store.put("hosts-test/probe", b"1")) > 0
        survivor, *others = etcd.members
        for m in others:                               # one member left: no quorum; it
            m.kill()                                   # still serves, requests wait there
        for name, op in ops.items():
            _bounded_unavailable(f"no quorum, {name}", op, bound)
        survivor.kill()
        for name, op in ops.items():
            _bounded_unavailable(f"all down, {name}", op, bound)
        err = _bounded_unavailable("all down, get again", ops["get"], bound)
        assert all(ep in str(err) for ep in etcd.endpoints)    # every endpoint was tried
    finally:
        for m in etcd.members:
            m.start(wait=False)
        for m in etcd.members:
            m.wait_ready()
    t0 = time.monotonic()
    got = _retry_metadata(lambda: store.get("hosts-test/probe"))   # the same store recovers
    print(f"recovered {time.monotonic() - t0:.2f}s after the members were ready")
    assert got is not None and got.value == b"1"
    store.close()
    for bid in host_cluster.bookie_ids:
        host_cluster.wait_registered(bid)
    bk = _bk(host_cluster)
    try:
        lh = _retry_metadata(lambda: bk.create_ledger(3, 2, 2))
        assert lh.add_entries([b"a", b"b"]) == [0, 1]
        _retry_metadata(lh.close)
        assert [e.payload for e in bk.open_ledger(lh.ledger_id).read(0, 1)] == [b"a", b"b"]
    finally:
        bk.close()


def _leader_among(members):
    """The member that ``members`` themselves report as leader (a cut-off
    old leader may still believe it leads: ask only these)."""
    for m in members:
        try:
            st = m.status()
        except (OSError, ValueError, KeyError):
            continue
        if st["leader"] and st["leader"] == st["member_id"]:
            return m
    return None


def _refusal(store) -> str:
    try:
        store.get("hosts-test/minority")
    except errors.MetadataUnavailable as exc:
        return str(exc)
    raise AssertionError("a member cut off from the majority served a linearizable read")


def test_leader_partitioned_from_the_other_members(host_cluster):
    """The etcd leader's host cut off from the other two members (the client
    still reaches all three): the majority elects a new leader and carries on
    (writes, ledger creation and a fencing recovery through it); a store
    that can reach only the cut-off member fails typed, and no CAS succeeds
    there; after the heal the old leader rejoins and nothing acked is lost."""
    from pybk_spark.metadata.etcd_store import EtcdMetadataStore
    from pybk_spark.cluster import link_faults
    reason = link_faults.unavailable_reason()
    if reason is not None:
        pytest.skip(f"link faults unavailable: {reason}")
    etcd = host_cluster.etcd
    faults = host_cluster.network.faults
    for bid in host_cluster.bookie_ids:        # readiness after the all-down test above
        host_cluster.wait_registered(bid)
    bk = _bk(host_cluster)
    fault = None
    try:
        abandoned = bk.create_ledger(3, 2, 2)          # its writer "dies": recovered below
        abandoned.add_entries([b"a0", b"a1", b"a2"])
        with Writers(bk) as writers:
            writers.wait_more(100)
            old = etcd.leader()
            host_of = {m.name: h for m, h in zip(etcd.members, etcd.hosts)}
            others = [m for m in etcd.members if m is not old]
            fault = faults.partition([host_of[old.name]], [host_of[m.name] for m in others])
            new = _until(lambda: _leader_among(others), 60, "a leader on the majority side")
            print(f"partitioned leader {old.name}; majority elected {new.name}")
            writers.wait_more(300)                     # writers carry on
            lh = _retry_metadata(lambda: bk.create_ledger(3, 2, 2))
            lh.add_entry(b"during the partition")
            _retry_metadata(lh.close)
            rh = _retry_metadata(lambda: bk.open_ledger(abandoned.ledger_id))
            assert rh.last_add_confirmed >= 2          # recovered through the majority
            # the minority side: a store that reaches only the cut-off member
            lone = EtcdMetadataStore([old.endpoint], host_cluster.scope, timeout=2.0,
                                     read_retry=1.0)
            try:
                with pytest.raises(errors.MetadataUnavailable):
                    lone.put_if_absent("hosts-test/minority", b"x")
                # once it knows it has no leader, the member refuses at once,
                # rather than holding requests until their deadline
                _until(lambda: "no leader" in _refusal(lone), 60, "a no-leader refusal")
                # its watches end at once too: a lost hint ("may have changed"),
                # not an error; the read that follows is what fails, typed
                assert lone.wait_for_change("hosts-test/", 1 << 40, 30.0) is True
                with pytest.raises(errors.MetadataUnavailable):
                    lone.get("hosts-test/minority")
            finally:
                lone.close()
            faults.heal(fault)
            fault = None
            etcd.wait_healthy()
            writers.wait_more(100)
        writers.verify(host_cluster)
        store = EtcdMetadataStore(etcd.endpoints, host_cluster.scope)
        try:
            assert _retry_metadata(lambda: store.get("hosts-test/minority")) is None
        finally:
            store.close()
    finally:
        if fault is not None:
            faults.heal(fault)
        bk.close()
        etcd.wait_healthy()
