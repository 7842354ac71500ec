"""TLS on a real bookie-server: gRPC and the lane with client certificates,
roles, the operator's key-less path, a SIGHUP certificate reload, HTTPS
probes, and bad input (plaintext against TLS and the reverse, an unknown
CA, expired certificates, a wrong host name, an identity not allowed, a
handshake that never completes, garbage instead of a ClientHello): each a
typed error naming what to fix, with the bookie serving on."""
from __future__ import annotations

import datetime
import socket
import ssl
import time
import urllib.request

import pytest

from pybk_spark import errors
from pybk_spark.config import ClientConfig
from pybk_spark.testing.bookie_process import entries_bytes, free_port
from pybk_spark.cluster.certs import OPERATOR, WRITER, issue, make_ca, make_cert_files
from pybk_spark.transport.grpc_bookie import BookieClient
from pybk_spark.transport.tls import ClientTls

pytest.importorskip("trustme")
pytestmark = pytest.mark.slow
KEY = b"k" * 32
STRANGER = "pybk-stranger"
HELLO_TIMEOUT_S = 2.0


@pytest.fixture(scope="module")
def certs(tmp_path_factory):
    files = make_cert_files(tmp_path_factory.mktemp("certs"), clients=(WRITER, OPERATOR, STRANGER))
    d = files.dir
    past = datetime.datetime.now(datetime.timezone.utc) - datetime.timedelta(days=1)
    files.expired_client = issue(files.ca, d, "expired-client", WRITER, not_after=past)
    files.expired_bookie = issue(files.ca, d, "expired-bookie", "127.0.0.1", not_after=past)
    other = make_ca()
    files.other_ca_file = d / "other-ca.pem"
    other.cert_pem.write_to_path(str(files.other_ca_file))
    files.foreign_client = issue(other, d, "foreign-client", WRITER)
    return files


def _tls(certs, identity=WRITER, **changes) -> ClientTls:
    conf = {**certs.client_conf(identity), **changes}
    return ClientTls.from_conf(ClientConfig().with_overrides(conf))


@pytest.fixture(scope="module")
def tls_bookie(certs, tmp_path_factory):
    from pybk_spark.testing.bookie_process import BookieProcess
    lane, metrics = free_port(), free_port()
    bp = BookieProcess(str(tmp_path_factory.mktemp("tlsb") / "b1"),
                       conf={**certs.bookie_conf(writers=f"{WRITER},{OPERATOR}"),
                             "add_lane_port": lane, "metrics_port": metrics,
                             "metrics_tls": "true", "lane_hello_timeout_s": HELLO_TIMEOUT_S},
                       client_tls=_tls(certs))
    bp.start()
    yield bp
    bp.kill()


def _lane(bp) -> str:
    return f"127.0.0.1:{bp.conf['add_lane_port']}"


def _client(bp, tls, lane=True, timeout=10.0) -> BookieClient:
    return BookieClient(bp.address, bookie_id=bp.bookie_id, default_timeout=timeout,
                        add_lane_address=_lane(bp) if lane else "",
                        read_lane_address=_lane(bp) if lane else "", tls=tls)


def _add(client, ledger, ids, key=KEY, recovery=False):
    return client.add(ledger, key, entries_bytes(ledger, ids), recovery=recovery).result(30)


_fresh = iter(range(100000, 200000))


def _still_serving(bp, certs):
    """The bookie takes and serves a new ledger over both paths."""
    for lane in (True, False):
        ledger = next(_fresh)
        c = _client(bp, _tls(certs), lane=lane)
        try:
            assert _add(c, ledger, [0, 1]) == (0, 1)
            assert c.read(ledger, 0, 1).result(30).batch.num_rows == 2
        finally:
            c.close()


# -- the happy paths ----------------------------------------------------------------------------
@pytest.mark.parametrize("lane", [True, False], ids=["lane", "grpc"])
def test_writer_adds_and_reads_over_tls(tls_bookie, certs, lane):
    ledger = 10 if lane else 11
    c = _client(tls_bookie, _tls(certs), lane=lane)
    try:
        assert _add(c, ledger, range(0, 50)) == (0, 49)
        got = c.read(ledger, 0, 49).result(30)
        assert got.batch.num_rows == 50 and got.end == "COMPLETE"
        assert c.reads_over_lane is lane
    finally:
        c.close()


def test_operator_fences_and_copies_without_the_password(tls_bookie, certs):
    writer, op = _client(tls_bookie, _tls(certs)), _client(tls_bookie, _tls(certs, OPERATOR))
    try:
        assert _add(writer, 20, range(0, 3)) == (0, 2)
        # a writer without the key: refused, as in BookKeeper
        with pytest.raises(errors.Unauthorized):
            writer.read_lac(20, fence=True, master_key=b"").result(30)
        with pytest.raises(errors.Unauthorized):
            _add(writer, 20, [3], key=b"", recovery=True)
        # an operator learns the recorded key; a writer does not
        assert op.read_lac(20, master_key=b"").result(30).master_key == KEY
        assert writer.read_lac(20, master_key=b"").result(30).master_key == b""
        # an operator: recovery adds and fencing with the empty key
        assert _add(op, 20, [3], key=b"", recovery=True) == (3, 3)
        assert op.read_lac(20, fence=True, master_key=b"").result(30).fenced
        # ... but a plain add still needs the key
        with pytest.raises(errors.Unauthorized):
            _add(op, 20, [4], key=b"")
        # copies onto a bookie that never saw the ledger record no key: the
        # writer's key is still the one that counts afterwards
        assert _add(op, 21, range(0, 2), key=b"", recovery=True) == (0, 1)
        assert _add(writer, 21, [2], recovery=True) == (2, 2)
        with pytest.raises(errors.Unauthorized):
            _add(writer, 21, [3], key=b"other" * 7, recovery=True)
    finally:
        writer.close()
        op.close()


def test_identity_not_allowed_is_unauthorized_naming_the_setting(tls_bookie, certs):
    for lane in (True, False):
        c = _client(tls_bookie, _tls(certs, STRANGER), lane=lane)
        try:
            with pytest.raises(errors.Unauthorized, match="tls_writer_identities"):
                _add(c, 30, [0])
            with pytest.raises(errors.Unauthorized, match=STRANGER):
                c.read(20, 0, 0).result(30)
        finally:
            c.close()
    _still_serving(tls_bookie, certs)


def test_https_probes(tls_bookie, certs):
    ctx = ssl.create_default_context(cafile=str(certs.ca_file))
    url = f"https://127.0.0.1:{tls_bookie.conf['metrics_port']}/health"
    with urllib.request.urlopen(url, context=ctx, timeout=30) as resp:
        assert resp.status == 200
    with pytest.raises(OSError):          # plain HTTP on the HTTPS port: no answer
        urllib.request.urlopen(url.replace("https", "http"), timeout=30)


# -- bad input -------------------------------------------------------------------------------------
def test_plaintext_client_against_tls_bookie(tls_bookie, certs):
    for lane in (True, False):
        c = _client(tls_bookie, None, lane=lane, timeout=5.0)
        try:
            with pytest.raises(errors.BookieUnavailable):
                _add(c, 40, [0])
        finally:
            c.close()
    _still_serving(tls_bookie, certs)


def test_tls_client_against_plaintext_bookie(bookies, certs):
    bp = bookies("plain", conf={"add_lane_port": free_port()}).start()
    for lane in (True, False):
        c = _client(bp, _tls(certs), lane=lane, timeout=5.0)
        try:
            with pytest.raises(errors.TlsError):
                _add(c, 41, [0])
        finally:
            c.close()
    plain = _client(bp, None)
    try:
        assert _add(plain, 41, [0]) == (0, 0)
    finally:
        plain.close()


def test_certificates_the_other_side_does_not_accept(tls_bookie, certs):
    cases = [  # (client settings, what the message must name)
        (dict(tls_ca_file=str(certs.other_ca_file)), "tls_ca_file"),      # unknown CA
        (dict(tls_server_name="wrong.example"), "tls_server_name"),       # wrong host name
    ]
    for changes, named in cases:
        for lane in (True, False):
            c = _client(tls_bookie, _tls(certs, **changes), lane=lane, timeout=5.0)
            try:
                with pytest.raises(errors.TlsError, match=named):
                    _add(c, 42, [0])
            finally:
                c.close()
    # client certificates the bookie refuses: another CA's, an expired one
    for cert, key in (certs.foreign_client, certs.expired_client):
        for lane in (True, False):
            c = _client(tls_bookie, _tls(certs, tls_cert_file=str(cert), tls_key_file=str(key)),
                        lane=lane, timeout=5.0)
            try:
                with pytest.raises(errors.BookieUnavailable):
                    _add(c, 43, [0])
            finally:
                c.close()
    _still_serving(tls_bookie, certs)


def test_expired_bookie_certificate(bookies, certs):
    cert, key = certs.expired_bookie
    bp = bookies("expired", conf={**certs.bookie_conf(), "tls_cert_file": str(cert),
                                  "tls_key_file": str(key), "add_lane_port": free_port()})
    bp.start(wait=False)
    wait_for_log(bp, "bookie-server ready")
    c = _client(bp, _tls(certs), timeout=5.0)
    try:
        with pytest.raises(errors.TlsError, match="expired"):
            _add(c, 44, [0])
    finally:
        c.close()


def test_handshake_that_never_completes_is_cut_and_frees_its_thread(tls_bookie, certs):
    host, port = _lane(tls_bookie).split(":")
    silent = socket.create_connection((host, int(port)), timeout=60)
    silent.settimeout(60)
    t0 = time.monotonic()
    assert silent.recv(1) == b""            # the bookie closed it
    assert time.monotonic() - t0 < 60
    silent.close()
    wait_for_log(tls_bookie, "no TLS handshake within lane_hello_timeout_s")
    wait_for_metric(tls_bookie, certs, "bookie_add_lane_connections", 0.0)
    _still_serving(tls_bookie, certs)


def test_garbage_instead_of_a_client_hello(tls_bookie, certs):
    host, port = _lane(tls_bookie).split(":")
    for junk in (b"\x00" * 64, b"GET / HTTP/1.1\r\n\r\n", bytes(range(256)) * 4):
        with socket.create_connection((host, int(port)), timeout=60) as s:
            s.sendall(junk)
            try:
                while s.recv(4096):
                    pass
            except ConnectionResetError:
                pass
    wait_for_log(tls_bookie, "TLS handshake failed")
    _still_serving(tls_bookie, certs)


# -- reload ------------------------------------------------------------------------------------------
def test_sighup_reloads_the_certificate(bookies, certs, tmp_path):
    import shutil
    import signal
    cert, key = tmp_path / "bookie.pem", tmp_path / "bookie-key.pem"
    shutil.copy(certs.bookie_cert, cert)
    shutil.copy(certs.bookie_key, key)
    bp = bookies("reload", conf={**certs.bookie_conf(), "tls_cert_file": str(cert),
                                 "tls_key_file": str(key), "add_lane_port": free_port()},
                 client_tls=_tls(certs))
    bp.start()
    renamed = _tls(certs, tls_server_name="renamed.example")
    for lane in (True, False):
        c = _client(bp, renamed, lane=lane, timeout=5.0)
        try:
            with pytest.raises(errors.TlsError):
                _add(c, 50, [0])
        finally:
            c.close()
    new_cert, new_key = issue(certs.ca, tmp_path, "renamed", "renamed.example", "127.0.0.1")
    shutil.copy(new_cert, cert)
    shutil.copy(new_key, key)
    bp.signal(signal.SIGHUP)
    wait_for_log(bp, "event=tls_reloaded")
    for ledger, lane in ((51, True), (52, False)):
        c = _client(bp, renamed, lane=lane)
        try:
            assert _add(c, ledger, [0]) == (0, 0)
        finally:
            c.close()
    # a reload that fails keeps the old certificate
    key.write_text("not a key")
    bp.signal(signal.SIGHUP)
    wait_for_log(bp, "event=tls_reload_failed")
    c = _client(bp, renamed)
    try:
        assert _add(c, 53, [0]) == (0, 0)
    finally:
        c.close()


# -- helpers -------------------------------------------------------------------------------------------
def wait_for_log(bp, text: str, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while text not in bp.log_tail(200_000):
        assert time.monotonic() < deadline, f"{text!r} not logged:\n{bp.log_tail()}"
        time.sleep(0.05)                # poll interval, not synchronisation


def wait_for_metric(bp, certs, name: str, value: float, timeout: float = 60.0) -> None:
    ctx = ssl.create_default_context(cafile=str(certs.ca_file))
    url = f"https://127.0.0.1:{bp.conf['metrics_port']}/metrics"
    deadline = time.monotonic() + timeout
    while True:
        with urllib.request.urlopen(url, context=ctx, timeout=30) as resp:
            lines = resp.read().decode().splitlines()
        got = [float(ln.split()[-1]) for ln in lines if ln.startswith(name + " ")]
        if got and got[0] == value:
            return
        assert time.monotonic() < deadline, f"{name} = {got}, not {value}"
        time.sleep(0.05)                # poll interval, not synchronisation
