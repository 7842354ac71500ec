"""Fixtures for the operator-tool tests."""
import pytest


@pytest.fixture(scope="module")
def own_cluster(tmp_path_factory):
    """A private etcd + 4 bookies: destructive tests (wiped bookies) use it so
    the shared ``cluster`` stays healthy."""
    from pybk_spark.testing.fixtures import bookie_server_available, private_cluster
    if not bookie_server_available():
        pytest.skip("bookie_server is not available")
    yield from private_cluster(tmp_path_factory.mktemp("admin-cluster"), num_bookies=4)


@pytest.fixture(scope="module")
def bk(own_cluster):
    """A client of the module's private cluster."""
    from pybk_spark.ledger.client import BookKeeper
    client = BookKeeper(own_cluster.metadata_uri)
    try:
        yield client
    finally:
        client.close()


@pytest.fixture
def uri(cluster):
    """The shared cluster's metadata URI."""
    return cluster.metadata_uri


@pytest.fixture
def cluster_bk(cluster):
    """A client of the shared cluster, closed after the test."""
    from pybk_spark.ledger.client import BookKeeper
    client = BookKeeper(cluster.metadata_uri)
    try:
        yield client
    finally:
        client.close()
