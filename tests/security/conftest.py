"""Certificates (trustme) and secured etcd processes for the etcd security tests.

* ``certs``        module: a CA, etcd's server certificate (127.0.0.1,
                   localhost), a client certificate, and a foreign CA with its
                   own client certificate (files in a temp dir).
* ``tls_etcd``     module: an etcd serving TLS and requiring client certificates.
* ``secure_cluster`` module: LocalCluster with etcd TLS + client certificates +
                   authentication, 3 bookies running as the ``bookie`` user.
"""
from __future__ import annotations

from types import SimpleNamespace

import pytest

trustme = pytest.importorskip("trustme")


@pytest.fixture(scope="module")
def certs(tmp_path_factory):
    d = tmp_path_factory.mktemp("certs")
    ca, foreign = trustme.CA(), trustme.CA()
    server = ca.issue_cert("127.0.0.1", "localhost")
    client = ca.issue_cert("pybk-client")
    stranger = foreign.issue_cert("stranger")
    ca.cert_pem.write_to_path(str(d / "ca.pem"))
    foreign.cert_pem.write_to_path(str(d / "foreign-ca.pem"))
    for name, cert in (("server", server), ("client", client), ("stranger", stranger)):
        cert.private_key_pem.write_to_path(str(d / f"{name}.key"))
        cert.cert_chain_pems[0].write_to_path(str(d / f"{name}.pem"))
    p = {n: str(d / n) for n in ("ca.pem", "foreign-ca.pem", "server.pem", "server.key",
                                 "client.pem", "client.key", "stranger.pem", "stranger.key")}
    return SimpleNamespace(dir=d, ca=p["ca.pem"], foreign_ca=p["foreign-ca.pem"],
                           server_cert=p["server.pem"], server_key=p["server.key"],
                           client_cert=p["client.pem"], client_key=p["client.key"],
                           stranger_cert=p["stranger.pem"], stranger_key=p["stranger.key"])


def etcd_tls(certs):
    from pybk_spark.cluster.etcd_process import EtcdTLS
    return EtcdTLS(cert_file=certs.server_cert, key_file=certs.server_key, ca_file=certs.ca,
                   client_cert_auth=True, probe_cert_file=certs.client_cert,
                   probe_key_file=certs.client_key)


@pytest.fixture(scope="module")
def tls_etcd(tmp_path_factory, certs):
    from pybk_spark.cluster.etcd_process import EtcdProcess
    proc = EtcdProcess(tmp_path_factory.mktemp("tls-etcd") / "data", tls=etcd_tls(certs)).start()
    try:
        yield proc
    finally:
        proc.stop()


@pytest.fixture(scope="module")
def secure_cluster(tmp_path_factory, certs):
    from pybk_spark.cluster.local import LocalCluster
    from pybk_spark.testing.fixtures import bookie_server_available
    if not bookie_server_available():
        pytest.skip("bookie_server is not available")
    local = LocalCluster(tmp_path_factory.mktemp("secure-cluster"), num_bookies=3,
                         metrics=False, etcd_tls=etcd_tls(certs), etcd_auth=True)
    try:
        local.start()
        yield local
    finally:
        local.stop()
