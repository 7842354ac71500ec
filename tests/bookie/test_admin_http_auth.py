"""Authorization of the admin HTTP API on real bookie-server processes with
trustme certificates: over HTTPS with client certificates, PUT routes need
the operator role and GET routes an identity with a role, refusals are typed
JSON 401/403 naming what is missing, probes need no certificate; a bookie
whose HTTP port cannot authenticate keeps the loopback rule and refuses
admin_http_allow_remote at start."""
from __future__ import annotations

import json
import ssl
import urllib.error
import urllib.request

import pytest

from pybk_spark.testing.bookie_process import BookieProcess, free_port
from pybk_spark.cluster.certs import OPERATOR, WRITER, make_cert_files

pytest.importorskip("trustme")
pytestmark = pytest.mark.slow
STRANGER = "pybk-stranger"


@pytest.fixture(scope="module")
def certs(tmp_path_factory):
    return make_cert_files(tmp_path_factory.mktemp("certs"), clients=(WRITER, OPERATOR, STRANGER))


@pytest.fixture(scope="module")
def bookie(certs, tmp_path_factory):
    from pybk_spark.config import ClientConfig
    from pybk_spark.transport.tls import ClientTls
    bp = BookieProcess(str(tmp_path_factory.mktemp("adminauth") / "b1"),
                       conf={**certs.bookie_conf(writers=WRITER),
                             "add_lane_port": free_port(), "metrics_port": free_port(),
                             "metrics_tls": "true"},
                       client_tls=ClientTls.from_conf(
                           ClientConfig().with_overrides(certs.client_conf(WRITER))))
    bp.start()
    yield bp
    bp.kill()


def call(bp, certs, method, path, identity=None, body=None):
    ctx = ssl.create_default_context(cafile=str(certs.ca_file))
    if identity is not None:
        cert, key = certs.clients[identity]
        ctx.load_cert_chain(str(cert), str(key))
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(f"https://127.0.0.1:{bp.conf['metrics_port']}{path}",
                                 data=data, method=method)
    try:
        with urllib.request.urlopen(req, context=ctx, timeout=30) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def test_operator_changes_writer_reads_nobody_else(bookie, certs):
    state = "/api/v1/bookie/state/readonly"
    # no certificate: 401, even from loopback; probes are not affected
    code, err = call(bookie, certs, "GET", state)
    assert code == 401 and err["error"] == "unauthenticated"
    assert err["missing"] == "client certificate" and "tls_ca_file" in err["message"]
    assert call(bookie, certs, "GET", "/health")[0] == 200
    # an identity without a role: 403 naming it
    code, err = call(bookie, certs, "GET", state, STRANGER)
    assert code == 403 and err["error"] == "forbidden" and STRANGER in err["message"]
    # a writer reads, but may not change the bookie
    assert call(bookie, certs, "GET", state, WRITER) == (
        200, {"read_only": False, "admin_read_only": False})
    for path, body in ((state, {"read_only": True}), ("/api/v1/bookie/gc", None),
                       ("/api/v1/autorecovery/status", {"enabled": False})):
        code, err = call(bookie, certs, "PUT", path, WRITER, body)
        assert code == 403 and err["missing"] == "operator", path
        assert "tls_operator_identities" in err["message"]
    assert call(bookie, certs, "GET", state, WRITER)[1]["read_only"] is False
    # the operator does
    try:
        assert call(bookie, certs, "PUT", state, OPERATOR, {"read_only": True}) == (
            200, {"read_only": True, "admin_read_only": True})
    finally:
        code, st = call(bookie, certs, "PUT", state, OPERATOR, {"read_only": False})
    assert code == 200 and st["read_only"] is False
    # authorized, then the route's own answer (this bookie is standalone: no GC)
    assert call(bookie, certs, "PUT", "/api/v1/bookie/gc", OPERATOR)[1]["error"] == "standalone"


def test_remote_admin_over_plain_http_with_client_certificates_is_refused_at_start(
        certs, tmp_path):
    conf = {**certs.bookie_conf(), "metrics_port": free_port(), "add_lane_port": free_port(),
            "admin_http_allow_remote": "true"}
    bp = BookieProcess(str(tmp_path / "b2"), conf=conf)
    try:
        assert bp.start(wait=False).wait_exit(60) != 0
        tail = bp.log_tail()
        assert "admin_http_allow_remote" in tail and "metrics_tls = true" in tail
    finally:
        bp.kill()
