"""Shared fixtures: a real etcd, a real local cluster, the in-memory twin.

* ``etcd``          session: one embedded etcd (EtcdProcess) for metadata tests.
* ``cluster``       session: LocalCluster = its own etcd + 3 ``bookie-server``
                    processes (skipped if bookie_server is not importable).
                    After every test that used it, ``cluster.heal()`` restarts
                    killed bookies, resumes frozen ones and restarts etcd, so
                    fault-injecting tests cannot poison later ones.
* ``memory_store``  function: a fresh MemoryMetadataStore.
* ``fresh_scope``   function: a metadata URI (str).  Without ``cluster`` it is a
                    new, empty scope on the shared etcd.  WITH ``cluster`` it is
                    the cluster's own URI: bookies register, allocate ledger ids
                    and garbage-collect against ONE scope, so a second scope on
                    the same bookies would collide; use per-test names there.
Everything is torn down in ``finally`` blocks, and pybk_spark.cluster.procs
kills any child still alive at interpreter exit.
"""
from __future__ import annotations

import pytest

from pybk_spark.testing.fixtures import bookie_server_available, unique_scope


@pytest.fixture(scope="session")
def etcd(tmp_path_factory):
    from pybk_spark.cluster.etcd_process import EtcdProcess
    proc = EtcdProcess(tmp_path_factory.mktemp("etcd") / "data").start()
    try:
        yield proc
    finally:
        proc.stop()


@pytest.fixture(scope="session")
def cluster(tmp_path_factory):
    if not bookie_server_available():
        pytest.skip("bookie_server is not available yet")
    from pybk_spark.cluster.local import LocalCluster
    local = LocalCluster(tmp_path_factory.mktemp("cluster"), num_bookies=3)
    try:
        local.start()
        yield local
    finally:
        local.stop()


@pytest.fixture(autouse=True)
def _heal_cluster_after_test(request):
    yield
    if "cluster" in request.fixturenames:
        request.getfixturevalue("cluster").heal()


@pytest.fixture
def memory_store():
    from pybk_spark.metadata.memory_store import MemoryMetadataStore
    store = MemoryMetadataStore(unique_scope("mem"))
    try:
        yield store
    finally:
        store.close()


@pytest.fixture
def fresh_scope(request):
    if "cluster" in request.fixturenames:
        return request.getfixturevalue("cluster").metadata_uri
    return request.getfixturevalue("etcd").uri(unique_scope())
