"""Ports handed to test and standalone processes lie outside the kernel's
ephemeral range: an outgoing connection can take an ephemeral port between
the moment it is chosen and the moment the process binds it."""
from __future__ import annotations

from pybk_spark.cluster import ports
from pybk_spark.testing import bookie_process


def _ephemeral_range() -> tuple[int, int]:
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            low, high = (int(v) for v in f.read().split())
    except OSError:
        low, high = 32768, 60999          # Linux's default
    return low, high


def test_the_ports_handed_out_are_free_distinct_and_outside_the_ephemeral_range():
    low, high = _ephemeral_range()
    got = [bookie_process.free_port() for _ in range(20)] + [ports.free_port() for _ in range(20)]
    assert len(set(got)) == len(got), "a port is handed out once per process"
    assert all(not low <= p <= high for p in got), (got, (low, high))


def test_the_bookie_test_harness_uses_the_one_port_chooser():
    assert bookie_process.free_port is ports.free_port
