"""Fixtures for bookie tests: real bookie-server processes (and etcd when the
metadata adapter exists), always torn down."""
from __future__ import annotations

import uuid

import pytest

from pybk_spark.testing.bookie_process import BookieProcess


@pytest.fixture
def bookies(tmp_path):
    started: list[BookieProcess] = []

    def make(name: str = "b1", **kw) -> BookieProcess:
        bp = BookieProcess(str(tmp_path / name), **kw)
        started.append(bp)
        return bp

    try:
        yield make
    finally:
        for bp in started:
            bp.kill()


def _have_etcd_store() -> bool:
    try:
        from pybk_spark.metadata import open_store  # noqa: F401
        return True
    except ImportError:
        return False


@pytest.fixture(scope="module")
def bookie_etcd(tmp_path_factory):
    if not _have_etcd_store():
        pytest.skip("pybk_spark.metadata.open_store not available yet")
    from pybk_spark.cluster.etcd_process import EtcdProcess
    etcd = EtcdProcess(str(tmp_path_factory.mktemp("etcd") / "data")).start()
    try:
        yield etcd
    finally:
        etcd.stop()


@pytest.fixture
def etcd_scope(bookie_etcd):
    """(uri, store) of a fresh scope in the module's etcd."""
    from pybk_spark.metadata import open_store
    uri = bookie_etcd.uri(f"bk{uuid.uuid4().hex[:8]}")
    store = open_store(uri)
    try:
        yield uri, store
    finally:
        store.close()
