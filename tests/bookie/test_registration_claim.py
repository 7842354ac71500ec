"""The registration claim (bookie_server/serving/registration.py) against the
in-memory metadata store twin, with an injected clock: one id, one live
bookie; a crashed predecessor on the same data dir is replaced at once; an
unprovable one is waited out, boundedly."""
from __future__ import annotations

import json

import pytest

from bookie_server.serving.registration import (FREE, REFUSE, REPLACE, WAIT, Registrar, decide_claim,
                                        registration_key)
from pybk_spark import errors
from pybk_spark.metadata.memory_store import MemoryMetadataStore
from pybk_spark.testing.fixtures import unique_scope

ME = {"token": "t-me", "host": "h1", "pid": 10, "data_dir": "/d/b0", "cookie_instance": "c1"}


def owner(**changes) -> dict:
    return {**ME, "token": "t-other", "pid": 20, **changes}


@pytest.mark.parametrize("existing,expected", [
    (None, FREE),
    ({"owner": ME}, FREE),                                              # our own key
    ({"owner": owner()}, REPLACE),                                      # crashed predecessor
    ({"address": "x"}, WAIT),                                           # no owner recorded
    ({"owner": owner(host="h2")}, WAIT),                                # same cookie elsewhere
    ({"owner": owner(data_dir="/d/copy")}, WAIT),
    ({"owner": owner(host="h2", cookie_instance="c2")}, REFUSE),        # another bookie
    ({"owner": owner(data_dir="/d/b9", cookie_instance="")}, REFUSE),
])
def test_decide_claim(existing, expected):
    assert decide_claim(existing, ME) == expected


class Clock:
    def __init__(self):
        self.now = 1000.0
        self.on_sleep = lambda: None

    def __call__(self) -> float:
        return self.now

    def sleep(self, s: float) -> None:
        self.now += s
        self.on_sleep()


@pytest.fixture
def env():
    clock = Clock()
    store = MemoryMetadataStore(unique_scope("reg"), clock=clock)
    started: list[Registrar] = []

    def make(own: dict, ttl: int = 5) -> Registrar:
        r = Registrar(store, "b0", f"127.0.0.1:{own['pid']}", "/rack", 0, ttl, owner=own,
                      clock=clock, sleep=clock.sleep)
        started.append(r)
        return r
    try:
        yield store, clock, make
    finally:
        for r in started:
            r._stop.set()
        store.close()


def holder(store, read_only=False):
    got = store.get(registration_key("b0", read_only))
    return None if got is None else json.loads(got.value)["owner"]["token"]


def test_a_live_bookie_with_another_data_dir_keeps_the_id(env):
    store, _, make = env
    first = make(owner(data_dir="/d/other", cookie_instance="c9"))
    first.start()
    with pytest.raises(errors.BookieIdInUse, match="pid 20 on host h1"):
        make(ME).start()
    assert holder(store) == "t-other"


def test_crashed_predecessor_on_the_same_data_dir_is_replaced_at_once(env):
    store, clock, make = env
    dead = make(owner())
    dead.start()
    dead._stop.set()                       # "SIGKILL": no more refreshes, lease still alive
    t0 = clock()
    me = make(ME)
    me.start()
    assert holder(store) == "t-me" and clock() == t0          # no wait
    dead._reregister()                     # a zombie coming back must not take it back
    assert holder(store) == "t-me"


def test_unprovable_registration_is_waited_out_until_its_lease_expires(env):
    store, clock, make = env
    lease = store.grant_lease(5, keepalive=False)
    store.put_if_absent(registration_key("b0", False), b'{"address": "old"}', lease=lease)
    t0 = clock()
    me = make(ME)
    me.start()
    assert holder(store) == "t-me"
    assert 5 <= clock() - t0 <= me.wait_s


def test_unprovable_registration_that_stays_alive_is_refused_after_a_bounded_wait(env):
    store, clock, make = env
    lease = store.grant_lease(5, keepalive=False)
    store.put_if_absent(registration_key("b0", False), b'{"address": "old"}', lease=lease)
    clock.on_sleep = lease.refresh         # its bookie is alive
    t0 = clock()
    me = make(ME)
    with pytest.raises(errors.BookieIdInUse, match="still there after waiting"):
        me.start()
    assert me.wait_s <= clock() - t0 <= me.wait_s + 1
    assert json.loads(store.get(registration_key("b0", False)).value) == {"address": "old"}


def test_a_foreign_readonly_key_refuses_and_removes_our_writable_one(env):
    store, _, make = env
    lease = store.grant_lease(30, keepalive=False)
    store.put_if_absent(registration_key("b0", True),
                        json.dumps({"owner": owner(host="h2", cookie_instance="c2")}).encode(),
                        lease=lease)
    me = make(ME)
    with pytest.raises(errors.BookieIdInUse):
        me._lease = store.grant_lease(5, keepalive=False)
        me._claim()                        # the race: pre-check passed, then it appeared
    assert store.get(registration_key("b0", False)) is None


def test_mode_switch_and_stop_touch_only_our_keys(env):
    store, _, make = env
    me = make(ME)
    me.start()
    me.set_read_only(True)
    assert holder(store, True) == "t-me" and store.get(registration_key("b0", False)) is None
    me.stop()
    assert store.get(registration_key("b0", True)) is None


def test_a_failed_reregistration_keeps_the_lease_that_holds_the_key(env, monkeypatch):
    """A refresh failed (say one member restarting), a new lease was granted,
    but moving the key under it failed too: the earlier lease, still alive
    and still holding the key, must not be revoked, or a healthy bookie
    drops out of the registry until the next round (writers meet
    ``NotEnoughBookies`` right after every etcd member comes back)."""
    store, _, make = env
    me = make(ME)
    me.start()
    first = me._lease
    cas = store.compare_and_swap

    def unavailable(*args, **kwargs):
        raise errors.MetadataUnavailable("a member restarting")
    monkeypatch.setattr(store, "compare_and_swap", unavailable)
    me._reregister()
    assert holder(store) == "t-me" and not first.revoked       # still registered
    for _ in range(5):                 # failing on: the kept leases (threads) stay bounded
        me._reregister()
    assert holder(store) == "t-me" and len(me._retired) == 3
    monkeypatch.setattr(store, "compare_and_swap", cas)
    me._reregister()                                           # the next round moves it
    assert holder(store) == "t-me" and first.revoked and not me._lease.revoked
    assert me._retired == []
    me.stop()
    assert store.get(registration_key("b0", False)) is None


def test_a_slow_refresh_does_not_hold_up_a_mode_switch(env, monkeypatch):
    """The refresh round's RPCs run without the registrar's lock: a member
    that answers slowly (up to the store's RPC timeout) must not delay
    ``set_read_only``, which the disk checker and the admin API call.  The
    round that then finds its key gone (the switch moved it) leaves the new
    registration alone."""
    import threading

    store, _, make = env
    me = make(ME)
    me.start()
    lease = me._lease
    inside, release = threading.Event(), threading.Event()
    get = store.get

    def slow_get(key, *args, **kwargs):
        if threading.current_thread().name == "refresh-round":
            inside.set()
            release.wait()
        return get(key, *args, **kwargs)
    monkeypatch.setattr(store, "get", slow_get)
    refresh = threading.Thread(target=me.refresh_once, name="refresh-round")
    refresh.start()
    assert inside.wait(30)
    switch = threading.Thread(target=me.set_read_only, args=(True,))
    switch.start()
    switch.join(30)
    assert not switch.is_alive() and refresh.is_alive()      # switched while the round waits
    assert holder(store, True) == "t-me" and store.get(registration_key("b0", False)) is None
    release.set()
    refresh.join(30)
    assert me._lease is lease and me._retired == []          # no re-registration
    assert holder(store, True) == "t-me"
    me.stop()


def test_a_round_that_learns_nothing_keeps_the_lease_and_the_key(env, monkeypatch):
    """A keep-alive that ends unanswered (a hung or cut-off etcd member, an
    election) says nothing about the lease, whose own keep-alive moves to
    another member: the round neither grants a new lease nor moves the key;
    a round that learns the lease is gone re-registers at once."""
    store, _, make = env
    me = make(ME)
    me.start()
    lease, version = me._lease, me._version

    def unanswered():
        raise errors.MetadataUnavailable("a member that answers nothing")
    monkeypatch.setattr(lease, "refresh", unanswered)
    me.refresh_once()
    assert me._lease is lease and me._version == version and me._retired == []
    assert holder(store) == "t-me"

    def gone():
        raise errors.MetadataError("lease expired")
    monkeypatch.setattr(lease, "refresh", gone)
    me.refresh_once()
    assert me._lease is not lease and holder(store) == "t-me"
    me.stop()
