"""The store's reading of etcd's "no leader" refusal (pybk_spark/metadata/
etcd_errors.py, etcd_connection.EtcdConnection.call), with no etcd: a member
without a leader refuses a request in its gRPC interceptor before looking at it, so even a
write may be sent again (to another member); any other unavailability of a
write stays an unknown outcome and is not resent."""
from __future__ import annotations

import grpc
import pytest
from pyetcd import exceptions as etcd_exc

from pybk_spark import errors
from pybk_spark.metadata import etcd_errors
from pybk_spark.metadata.etcd_store import EtcdMetadataStore


class _Status(grpc.RpcError):
    def __init__(self, detail: str):
        self._detail = detail

    def code(self):
        return grpc.StatusCode.UNAVAILABLE

    def details(self):
        return self._detail


def _failing(detail: str, then=None):
    """A call that fails once as pyetcd fails (its exception raised while
    handling the RpcError), then returns ``then``; counts its calls."""
    calls = []

    def call():
        calls.append(1)
        if len(calls) == 1:
            try:
                raise _Status(detail)
            except grpc.RpcError:
                raise etcd_exc.ConnectionFailedError() from None
        return then
    return call, calls


@pytest.fixture
def store():
    s = EtcdMetadataStore("127.0.0.1:9", "unit", read_retry=5.0)   # never dialled
    yield s
    s.close()


def test_a_no_leader_refusal_is_typed_and_named():
    call, _ = _failing("etcdserver: no leader")
    with pytest.raises(errors.MetadataUnavailable) as caught:
        etcd_errors.translate(call)()
    assert etcd_errors.refused_without_leader(caught.value)
    assert "no leader" in str(caught.value)


def test_other_unavailability_is_not_a_refusal():
    call, _ = _failing("failed to connect to all addresses")
    with pytest.raises(errors.MetadataUnavailable) as caught:
        etcd_errors.translate(call)()
    assert not etcd_errors.refused_without_leader(caught.value)


def test_a_write_refused_for_want_of_a_leader_is_sent_again(store):
    call, calls = _failing("etcdserver: no leader", then=42)
    assert store.connection.call(call, idempotent=False) == 42
    assert len(calls) == 2


def test_a_write_that_failed_otherwise_is_an_unknown_outcome(store):
    call, calls = _failing("Socket closed", then=42)
    with pytest.raises(errors.MetadataUnavailable):
        store.connection.call(call, idempotent=False)
    assert len(calls) == 1                     # never resent: it may have landed


def test_every_request_asks_for_a_leader(store):
    assert ("hasleader", "true") in store._client.metadata


def test_a_failed_watch_is_a_lost_hint_not_an_error(store, monkeypatch):
    """A member that loses its leader ends the watch streams that asked for
    one (pyetcd hands the RpcError to the watch's callback); the caller then
    reads again, and that read fails over to another member or raises."""
    monkeypatch.setattr(store._client, "watch_prefix_once_response",
                        lambda *a, **kw: _Status("etcdserver: no leader"))
    assert store.wait_for_change("logs/", 7, 5.0) is True

    def broken(*a, **kw):
        try:
            raise _Status("failed to connect to all addresses")
        except grpc.RpcError:
            raise etcd_exc.ConnectionFailedError() from None
    monkeypatch.setattr(store._client, "watch_prefix_once_response", broken)
    assert store.wait_for_change("logs/", 7, 5.0) is True


def test_a_watch_that_saw_nothing_is_no_change(store, monkeypatch):
    def quiet(*a, **kw):
        raise etcd_exc.WatchTimedOut()
    monkeypatch.setattr(store._client, "watch_prefix_once_response", quiet)
    assert store.wait_for_change("logs/", 7, 0.5) is False
