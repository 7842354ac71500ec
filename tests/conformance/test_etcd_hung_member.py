"""A lease whose store lists a hung endpoint (TCP accepted, nothing ever
answered: a stopped or stalled etcd member) besides a live one stays alive:
each keep-alive round moves on to the live member within the round, sticks
to it afterwards, and the key under the lease never disappears."""
from __future__ import annotations

import socket
import threading
import time

import pytest

from pybk_spark.cluster.etcd_process import EtcdProcess
from pybk_spark.metadata.etcd_store import EtcdMetadataStore


class HungMember:
    """Accepts connections and never answers (keeps them open)."""

    def __init__(self):
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.endpoint = f"127.0.0.1:{self.sock.getsockname()[1]}"
        self.conns: list[socket.socket] = []
        self._thread = threading.Thread(target=self._accept, daemon=True)
        self._thread.start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.conns.append(conn)

    def close(self) -> None:
        self.sock.close()
        for c in self.conns:
            c.close()


@pytest.fixture
def etcd(tmp_path):
    proc = EtcdProcess(tmp_path / "etcd").start()
    try:
        yield proc
    finally:
        proc.stop()


def test_a_lease_outlives_a_hung_member_listed_first(etcd):
    hung = HungMember()
    store = EtcdMetadataStore(f"{hung.endpoint},{etcd.endpoint}", "hung", timeout=2.0)
    watcher = EtcdMetadataStore(etcd.endpoint, "hung")
    try:
        ttl = 6
        store.get("x")        # a read fails over: the store's other calls use the live member
        lease = store.grant_lease(ttl)
        store.put("bookies/writable/b1", b"reg", lease=lease)
        store.leases.preferred = hung.endpoint     # the worst start: the hung one first
        lease.refresh()                                # moves on within the round
        assert store.leases.preferred == etcd.endpoint
        lease.refresh()                                # and sticks to the live member
        seen = 0
        end = time.monotonic() + 3 * ttl               # the keep-alive thread's rounds
        while time.monotonic() < end:
            assert watcher.get("bookies/writable/b1") is not None
            seen += 1
            time.sleep(0.2)
        assert seen and not lease.lost.is_set()
        lease.revoke()
        assert watcher.get("bookies/writable/b1") is None
    finally:
        store.close()
        watcher.close()
        hung.close()
