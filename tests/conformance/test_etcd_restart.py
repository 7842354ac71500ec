"""The etcd adapter survives an etcd restart on the same data dir, and while
etcd is away it reports MetadataUnavailable (outcome unknown), never a
definite failure.  Uses its own etcd so the shared one is never disturbed."""
from __future__ import annotations

import time

import pytest

from pybk_spark import errors
from pybk_spark.metadata import open_store
from pybk_spark.cluster.etcd_process import EtcdProcess

HANG_GUARD = 60.0


def eventually(fn, what):
    deadline = time.monotonic() + HANG_GUARD
    while True:
        try:
            return fn()
        except errors.MetadataUnavailable:
            if time.monotonic() > deadline:
                pytest.fail(f"etcd store did not reconnect for {what}")
            time.sleep(0.1)


@pytest.fixture
def own_etcd(tmp_path):
    proc = EtcdProcess(tmp_path / "etcd").start()
    try:
        yield proc
    finally:
        proc.stop()


def test_store_reconnects_after_etcd_restart(own_etcd):
    store = open_store(own_etcd.uri("restart"))
    try:
        v = store.put_if_absent("ledgers/1", b"md")
        lease = store.grant_lease(10)
        store.put("bookies/writable/b1", b"reg", lease=lease)

        own_etcd.stop()
        with pytest.raises(errors.MetadataUnavailable) as info:
            store.compare_and_swap("ledgers/1", b"md2", v)
        assert info.value.outcome_known is False

        own_etcd.start()
        assert eventually(lambda: store.get("ledgers/1"), "get").value == b"md"
        v2 = eventually(lambda: store.compare_and_swap("ledgers/1", b"md2", v), "cas")
        assert store.get("ledgers/1").version == v2
        # the refreshing lease outlived the restart, so the registration is still there
        assert store.get("bookies/writable/b1") is not None
        assert store.wait_for_change("ledgers/", v2 - 1, 5.0) is True
        lease.revoke()
        assert store.get("bookies/writable/b1") is None
    finally:
        store.close()


def test_store_reconnects_after_etcd_crash(own_etcd):
    store = open_store(own_etcd.uri("crash"))
    try:
        store.put_if_absent("k", b"v")
        own_etcd.kill()
        own_etcd.start()
        assert eventually(lambda: store.get("k"), "get after SIGKILL").value == b"v"
        assert eventually(lambda: store.next_id(), "next_id") == 1
    finally:
        store.close()
