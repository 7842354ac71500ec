"""ONE conformance suite for the MetadataStore port, run against the real
etcd adapter (a real etcd process) and the in-memory twin.  If the twin
passes here, simulations built on it mean something for etcd."""
from __future__ import annotations

import threading
import time

import pytest

from pybk_spark import errors
from pybk_spark.metadata import open_store, parse_uri
from pybk_spark.metadata.memory_store import MemoryMetadataStore
from pybk_spark.testing.fixtures import unique_scope

HANG_GUARD = 30.0      # a deadline against hangs, never a performance threshold


@pytest.fixture(params=["memory", "etcd"])
def store(request):
    if request.param == "memory":
        s = MemoryMetadataStore(unique_scope("mem"))
    else:
        s = open_store(request.getfixturevalue("etcd").uri(unique_scope()))
    try:
        yield s
    finally:
        s.close()


def poll_until(predicate, what: str):
    deadline = time.monotonic() + HANG_GUARD
    while not predicate():
        if time.monotonic() > deadline:
            pytest.fail(f"gave up waiting for {what}")
        time.sleep(0.05)


# -- get / put_if_absent --------------------------------------------------------
def test_get_missing_is_none(store):
    assert store.get("nope") is None


def test_put_if_absent_creates_once(store):
    v = store.put_if_absent("k", b"one")
    got = store.get("k")
    assert got.value == b"one" and got.version == v
    with pytest.raises(errors.MetadataVersion) as info:
        store.put_if_absent("k", b"two")
    assert info.value.outcome_known
    assert store.get("k").value == b"one"


def test_versions_are_global_revisions(store):
    va = store.put_if_absent("a", b"1")
    vb = store.put_if_absent("b", b"1")
    assert vb > va
    assert store.current_revision() >= vb


# -- compare and swap -------------------------------------------------------------
def test_cas_succeeds_on_current_version(store):
    v1 = store.put_if_absent("k", b"1")
    v2 = store.compare_and_swap("k", b"2", v1)
    assert v2 > v1
    assert store.get("k") == store.get("k") and store.get("k").value == b"2"
    assert store.get("k").version == v2


def test_cas_conflict_on_stale_version(store):
    v1 = store.put_if_absent("k", b"1")
    store.compare_and_swap("k", b"2", v1)
    with pytest.raises(errors.MetadataVersion):
        store.compare_and_swap("k", b"stale", v1)
    assert store.get("k").value == b"2"


def test_cas_on_missing_key_conflicts_even_with_version_zero(store):
    for version in (0, 1, 12345):
        with pytest.raises(errors.MetadataVersion):
            store.compare_and_swap("ghost", b"x", version)
    assert store.get("ghost") is None


def test_plain_put_is_unconditional(store):
    v1 = store.put("own", b"1")
    v2 = store.put("own", b"2")
    assert v2 > v1 and store.get("own").value == b"2"


# -- delete -------------------------------------------------------------------------
def test_delete(store):
    assert store.delete("absent") is False
    v = store.put_if_absent("k", b"1")
    with pytest.raises(errors.MetadataVersion):
        store.delete("k", expected_version=v + 1000)
    assert store.get("k") is not None
    assert store.delete("k", expected_version=v) is True
    assert store.get("k") is None
    with pytest.raises(errors.MetadataVersion):
        store.delete("k", expected_version=v)
    store.put_if_absent("k", b"again")
    assert store.delete("k") is True


# -- list_prefix ----------------------------------------------------------------------
def test_list_prefix_sorted_and_scoped(store):
    for key in ["ledgers/00000000000000000003", "ledgers/00000000000000000001",
                "ledgers/00000000000000000002", "ledgersX", "logs/a"]:
        store.put_if_absent(key, key.encode())
    listed = store.list_prefix("ledgers/")
    assert [k for k, _ in listed] == ["ledgers/00000000000000000001",
                                      "ledgers/00000000000000000002",
                                      "ledgers/00000000000000000003"]
    assert all(v.value == k.encode() for k, v in listed)
    assert [k for k, _ in store.list_prefix("logs/")] == ["logs/a"]
    assert store.list_prefix("nothing/") == []


def test_scopes_are_isolated(store, etcd):
    store.put_if_absent("shared-name", b"mine")
    other = (MemoryMetadataStore(unique_scope("mem")) if isinstance(store, MemoryMetadataStore)
             else open_store(etcd.uri(unique_scope())))
    try:
        assert other.get("shared-name") is None
        assert other.list_prefix("") == []
    finally:
        other.close()


# -- leases ---------------------------------------------------------------------------
def test_lease_expiry_removes_keys(store):
    lease = store.grant_lease(2, keepalive=False)
    store.put("bookies/writable/b1", b"reg", lease=lease)
    assert store.get("bookies/writable/b1") is not None
    poll_until(lambda: store.get("bookies/writable/b1") is None, "lease expiry")


def test_lease_time_left_counts_down_to_expiry(store):
    lease = store.grant_lease(30, keepalive=False)
    store.put("leased", b"x", lease=lease)
    store.put_if_absent("plain", b"y")
    try:
        left = store.lease_time_left("leased")
        assert left is not None and 0 < left <= 30
        assert store.lease_time_left("plain") is None
        assert store.lease_time_left("absent") is None
    finally:
        lease.revoke()
    assert store.lease_time_left("leased") is None


def test_lease_keepalive_keeps_keys(store):
    lease = store.grant_lease(2)
    try:
        store.put("alive", b"x", lease=lease)
        until = time.monotonic() + 2 * lease.ttl + 1
        while time.monotonic() < until:           # outlive the TTL twice over
            assert store.get("alive") is not None
            time.sleep(0.2)
    finally:
        lease.revoke()


def test_revoke_removes_keys_and_lease_becomes_unusable(store):
    lease = store.grant_lease(30)
    store.put_if_absent("a", b"1", lease=lease)
    store.put("b", b"2", lease=lease)
    store.put_if_absent("unleased", b"3")
    lease.revoke()
    assert store.get("a") is None and store.get("b") is None
    assert store.get("unleased").value == b"3"
    with pytest.raises(errors.MetadataError):
        store.put("c", b"3", lease=lease)
    lease.revoke()                                   # idempotent


def test_bad_lease_ttl(store):
    with pytest.raises(errors.IncorrectParameter):
        store.grant_lease(0)


# -- update loop / next_id --------------------------------------------------------------
def test_update_rereads_and_redecides_on_conflict(store):
    store.put_if_absent("counter", b"0")
    calls = []

    def transform(value: bytes) -> bytes:
        calls.append(value)
        if len(calls) == 1:                       # a rival writer sneaks in
            current = store.get("counter")
            store.compare_and_swap("counter", b"10", current.version)
        return str(int(value) + 1).encode()

    value, version = store.update("counter", transform)
    assert calls == [b"0", b"10"]
    assert value == b"11" and store.get("counter") == type(store.get("counter"))(b"11", version)


def test_update_without_change_writes_nothing(store):
    v = store.put_if_absent("k", b"same")
    assert store.update("k", lambda b: b) == (b"same", v)
    assert store.get("k").version == v


def test_update_missing_key(store):
    with pytest.raises(errors.NoSuchLedger):
        store.update("missing", lambda b: b + b"x")


def test_next_id_unique_under_threads(store):
    got: list[int] = []
    lock = threading.Lock()
    failures = []

    def worker():
        try:
            for _ in range(15):
                i = store.next_id()
                with lock:
                    got.append(i)
        except Exception as exc:          # surfaced below
            failures.append(exc)

    threads = [threading.Thread(target=worker) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(HANG_GUARD)
    assert not failures
    assert sorted(got) == list(range(1, 61))


# -- wait_for_change ----------------------------------------------------------------------
def test_wait_for_change_times_out_without_change(store):
    rev = store.current_revision()
    store.put("elsewhere/x", b"1")                   # outside the watched prefix
    assert store.wait_for_change("watched/", rev, 0.2) is False


def test_wait_for_change_sees_past_and_future_changes(store):
    v = store.put("watched/a", b"1")
    assert store.wait_for_change("watched/", v - 1, 5.0) is True   # already happened
    rev = store.current_revision()
    timer = threading.Timer(0.1, lambda: store.put("watched/b", b"2"))
    timer.start()
    try:
        assert store.wait_for_change("watched/", rev, HANG_GUARD) is True
    finally:
        timer.join()


def test_wait_for_change_sees_deletes(store):
    store.put("watched/a", b"1")
    rev = store.current_revision()
    store.delete("watched/a")
    assert store.wait_for_change("watched/", rev, HANG_GUARD) is True


# -- URIs ------------------------------------------------------------------------------------
@pytest.mark.parametrize("uri", ["", "nope", "zk://h:1/s", "etcd://h:1", "etcd://h:1/",
                                 "etcd://h:notaport/s", "etcd:///s", "memory://"])
def test_bad_uri_is_incorrect_parameter(uri):
    with pytest.raises(errors.IncorrectParameter):
        open_store(uri)


def test_uri_parsing():
    assert parse_uri("etcd://127.0.0.1:1,127.0.0.1:2/pybk") == ("etcd", "127.0.0.1:1,127.0.0.1:2",
                                                               "pybk")
    assert parse_uri("memory://x") == ("memory", "x", "")


def test_multi_endpoint_uri_fails_over_from_a_dead_endpoint(etcd):
    """``etcd://dead,live/scope``: reads go on through the live endpoint
    whichever one the client tried first; a write that failed at the dead one
    is not retried (its outcome would be unknown) and names the endpoint."""
    from pybk_spark.cluster.ports import free_port
    scope = unique_scope()
    dead = f"127.0.0.1:{free_port()}"            # nothing listens there
    single = open_store(etcd.uri(scope))
    multi = open_store(f"etcd://{dead},{etcd.endpoint}/{scope}")
    try:
        assert multi.uri == f"etcd://{dead},{etcd.endpoint}/{scope}"
        single.put_if_absent("k", b"v")
        for _ in range(4):                         # every call after a failure fails over
            assert multi.get("k").value == b"v"
            assert [k for k, _ in multi.list_prefix("")] == ["k"]
        outcomes = set()
        for i in range(4):
            try:
                multi.put_if_absent(f"w{i}", b"x")
                outcomes.add("ok")
            except errors.MetadataUnavailable as exc:
                assert dead in str(exc)
                outcomes.add("unavailable")
        assert "ok" in outcomes
    finally:
        single.close()
        multi.close()


def test_memory_uri_shares_one_store_per_name():
    name = unique_scope("shared")
    a, b = open_store(f"memory://{name}"), open_store(f"memory://{name}")
    try:
        a.put_if_absent("k", b"v")
        assert b.get("k").value == b"v"
        a.close()
        assert b.get("k").value == b"v"          # closing one handle keeps the data
    finally:
        b.close()
        MemoryMetadataStore.forget(name)


# -- etcd's request limit ---------------------------------------------------------
def test_a_value_over_etcds_request_limit_is_refused_and_nothing_written(store):
    """etcd refuses a request over --max-request-bytes (1.5 MiB by default):
    MetadataTooLarge (outcome known), and the key keeps what it had."""
    big, fine = b"x" * (2 << 20), b"y" * (1 << 20)
    for over in (b"z" * (1600 << 10), big):     # etcd's own check; its gRPC message limit
        with pytest.raises(errors.MetadataTooLarge) as info:
            store.put_if_absent("big", over)
        assert info.value.outcome_known and "--max-request-bytes" in str(info.value)
    assert store.get("big") is None
    v = store.put_if_absent("big", fine)
    with pytest.raises(errors.MetadataTooLarge):
        store.compare_and_swap("big", big, v)
    with pytest.raises(errors.MetadataTooLarge) as info:
        store.update("big", lambda raw: raw + big)
    assert info.value.context["value_bytes"] == len(fine) + len(big)
    assert store.get("big").value == fine and store.get("big").version == v


# -- swap_with: one key's CAS with creates and deletes, atomically ------------------
def test_swap_with_is_one_atomic_step(store):
    v = store.put_if_absent("head", b"h1")
    store.put_if_absent("old", b"o")
    v2 = store.swap_with("head", b"h2", v, {"new/a": b"a", "new/b": b"b"}, ["old"])
    got = store.get("head")
    assert got.value == b"h2" and got.version == v2
    assert store.get("new/a").version == v2 == store.get("new/b").version   # one revision
    assert store.get("old") is None
    with pytest.raises(errors.MetadataVersion):             # stale version: nothing at all
        store.swap_with("head", b"h3", v, {"new/c": b"c"}, ["new/a"])
    with pytest.raises(errors.MetadataVersion):             # a create that exists: nothing
        store.swap_with("head", b"h3", v2, {"new/c": b"c", "new/a": b"x"}, ["new/b"])
    assert store.get("head").value == b"h2" and store.get("new/c") is None
    assert store.get("new/a").value == b"a" and store.get("new/b").value == b"b"
    with pytest.raises(errors.MetadataVersion):             # the key itself is gone
        store.swap_with("nope", b"x", v2, {})


def test_delete_all_deletes_the_keys_named_in_one_revision_per_transaction(store):
    from pybk_spark.metadata.store import MAX_TXN_OPS
    store.put_if_absent("keep", b"k")
    names = [f"many/{i:04d}" for i in range(MAX_TXN_OPS + 5)]
    for name in names:
        store.put_if_absent(name, b"v")
    before = store.current_revision()
    assert store.delete_all(names[:3] + ["many/absent", names[0]]) == 3   # a key named twice
    assert store.current_revision() == before + 1               # one transaction, one revision
    assert [store.get(n) for n in names[:3]] == [None] * 3
    assert store.delete_all(["many/absent", names[0]]) == 0
    assert store.current_revision() == before + 1               # nothing changed: no revision
    assert store.delete_all(iter(names)) == len(names) - 3      # over etcd's cap: more transactions
    assert store.list_prefix("many/") == [] and store.get("keep").value == b"k"
    assert store.delete_all([]) == 0


def _sibling(store, scope: str):
    """Another scope of the same keyspace (the same etcd, the same twin)."""
    if isinstance(store, MemoryMetadataStore):
        return MemoryMetadataStore(scope, _shared=store._shared)
    return open_store(store.uri.rsplit("/", 1)[0] + "/" + scope)


def test_scopes_with_names_every_scope_holding_the_prefix(store):
    base = unique_scope("sw")
    others = {name: _sibling(store, name) for name in (f"{base}a", f"{base}b/nested", f"{base}c")}
    try:
        others[f"{base}a"].put("bookies/writable/b1", b"{}")
        others[f"{base}b/nested"].put("bookies/writable/b2", b"{}")
        others[f"{base}c"].put("ledgers/00000000000000000001", b"{}")    # no bookies there
        found = store.scopes_with("bookies/writable/")
        assert {f"{base}a", f"{base}b/nested"} <= set(found), found
        assert f"{base}c" not in found
        assert found == sorted(found)
        assert others[f"{base}c"].scopes_with("ledgers/") == [
            s for s in store.scopes_with("ledgers/")]
    finally:
        for other in others.values():
            other.close()
