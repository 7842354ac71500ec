"""Twin-only: leases on an injected clock expire deterministically (what the
simulation tests rely on)."""
from pybk_spark import errors
from pybk_spark.metadata.memory_store import MemoryMetadataStore

import pytest


class FakeClock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self):
        return self.now


def test_lease_expires_exactly_when_clock_passes_ttl():
    clock = FakeClock()
    store = MemoryMetadataStore("sim", clock=clock)
    lease = store.grant_lease(5, keepalive=False)
    store.put("reg", b"x", lease=lease)
    clock.now += 4.9
    assert store.get("reg") is not None
    lease.refresh()
    clock.now += 4.9
    assert store.get("reg") is not None
    clock.now += 0.2
    assert store.get("reg") is None
    assert lease.lost.is_set()
    with pytest.raises(errors.MetadataError):
        lease.refresh()


def test_expiry_bumps_revision_and_wakes_waiters():
    clock = FakeClock()
    store = MemoryMetadataStore("sim", clock=clock)
    lease = store.grant_lease(1, keepalive=False)
    store.put("bookies/writable/b", b"x", lease=lease)
    rev = store.current_revision()
    clock.now += 2
    assert store.wait_for_change("bookies/", rev, 1.0) is True
    assert store.current_revision() == rev + 1
