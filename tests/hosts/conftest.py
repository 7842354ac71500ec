"""Fixtures for tests on separate test hosts (network namespaces).

Where namespaces cannot be made (not root, no ``ip``, no CAP_NET_ADMIN) these
tests SKIP with the reason; under ``PYBK_REQUIRE_HOSTS=1`` (``make
test-hosts``) they FAIL with it instead, so that target never passes quietly.
"""
from __future__ import annotations

import os

import pytest


def need_hosts(*, etcd: bool = False, bookies: bool = False, java: bool = False) -> None:
    """Skip (or fail under PYBK_REQUIRE_HOSTS=1) naming what is missing."""
    from pybk_spark.cluster import hosts
    reason = hosts.unavailable_reason()
    if reason is None and etcd:
        from pybk_spark.cluster.etcd_process import EtcdNotFound, find_etcd_binary
        try:
            find_etcd_binary()
        except EtcdNotFound as exc:
            reason = str(exc)
    if reason is None and bookies:
        from pybk_spark.testing.fixtures import bookie_server_available
        if not bookie_server_available():
            reason = "bookie_server is not importable"
    if reason is None and java:
        import shutil
        if shutil.which("java") is None:
            reason = "no 'java' on PATH (Spark needs a JRE 17+)"
    if reason is None:
        return
    if os.environ.get("PYBK_REQUIRE_HOSTS") == "1":
        pytest.fail(f"test hosts required but unavailable: {reason}", pytrace=False)
    pytest.skip(f"test hosts unavailable: {reason}")


@pytest.fixture(scope="module")
def host_cluster(tmp_path_factory):
    """3 etcd members on hosts etcd-1..3, 3 bookies on hosts bookie-1..3."""
    need_hosts(etcd=True, bookies=True)
    from pybk_spark.cluster.host_cluster import HostCluster
    cluster = HostCluster(tmp_path_factory.mktemp("hosts"),
                          bookie_conf={"journal_prealloc_bytes": 4 << 20})
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.close()
