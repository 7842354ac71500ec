"""Bookie network identity and health (docs/deployment.md, "Bookie identity",
"Health and readiness"): the advertised-address rules and the cookie's
address check (pure), then real bookie-server processes: gRPC health and HTTP
/health, /ready through read-only and back; an address change on an old data
dir refused with the command that fixes it, then fixed by that command."""
from __future__ import annotations

import json
import re
import shlex
import signal
import subprocess
import sys
import urllib.error
import urllib.request

import grpc
import pytest

from bookie_server import cookie
from bookie_server.serving import identity
from pybk_spark import errors
from pybk_spark.cluster import procs
from pybk_spark.testing.bookie_process import free_port
from pybk_spark.testing.fixtures import bookie_server_available
from pybk_spark.testing.waiting import wait_until

HANG_GUARD = 90.0
REMOTE = "etcd://10.1.2.3:2379,10.1.2.4:2379/s"



def until(pred, what, timeout=HANG_GUARD):
    return wait_until(pred, what, timeout)


# -- pure rules ----------------------------------------------------------------------------
def _no_dns(host):
    return []


def test_advertised_host_rules():
    def route(host):
        assert host == "10.1.2.3"
        return "10.1.2.99"
    kw = dict(resolve=_no_dns, route_source=route)
    assert identity.advertised_host("0.0.0.0", "10.9.9.9", REMOTE, **kw) == "10.9.9.9"
    assert identity.advertised_host("10.1.2.50", "", REMOTE, **kw) == "10.1.2.50"
    assert identity.advertised_host("0.0.0.0", "", REMOTE, **kw) == "10.1.2.99"
    assert identity.advertised_host("::", "", "etcd://127.0.0.1:2379/s", **kw) == "127.0.0.1"
    assert identity.advertised_host("0.0.0.0", "", "", **kw) == "127.0.0.1"


def test_wildcard_never_and_loopback_only_with_local_metadata():
    with pytest.raises(ValueError, match="advertised_address"):
        identity.check_advertised("0.0.0.0", "", resolve=_no_dns)
    with pytest.raises(ValueError, match="advertised_address"):
        identity.check_advertised("127.0.0.1", REMOTE, resolve=_no_dns)
    with pytest.raises(ValueError, match="advertised_address"):
        identity.check_advertised("localhost", "etcd://127.0.0.1:2379,10.1.2.4:2379/s",
                                  resolve=_no_dns)
    identity.check_advertised("127.0.0.1", "etcd://127.0.0.1:2379,localhost:2380/s",
                              resolve=_no_dns)
    identity.check_advertised("127.0.0.1", "", resolve=_no_dns)
    identity.check_advertised("10.1.2.50", REMOTE, resolve=_no_dns)


def test_cookie_address_decision():
    assert cookie.decide_address("b", None, "h:1") == cookie.RECORD
    assert cookie.decide_address("b", "h:1", "h:1") == cookie.OK
    with pytest.raises(errors.InvalidCookie, match="bookie-server updatecookie --conf x"):
        cookie.decide_address("b", "h:1", "g:1", "bookie-server updatecookie --conf x")


# -- processes -----------------------------------------------------------------------------
needs_bookie = pytest.mark.skipif(not bookie_server_available(),
                                  reason="bookie_server is not available")


def _http(port: int, path: str, host: str = "127.0.0.1") -> tuple[int, dict | str]:
    try:
        with urllib.request.urlopen(f"http://{host}:{port}{path}", timeout=5) as r:
            body = r.read().decode()
            code = r.status
    except urllib.error.HTTPError as exc:
        body, code = exc.read().decode(), exc.code
    try:
        return code, json.loads(body)
    except ValueError:
        return code, body


def _grpc_health(address: str, service: str = "") -> str:
    from grpc_health.v1 import health_pb2, health_pb2_grpc
    with grpc.insecure_channel(address) as ch:
        r = health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(service=service),
                                                  timeout=5)
    return health_pb2.HealthCheckResponse.ServingStatus.Name(r.status)


@needs_bookie
def test_health_and_ready_follow_read_only(bookies):
    mport = free_port()
    bp = bookies("b1", conf={"metrics_port": mport, "disk_usage_threshold": 0.00002,
                             "disk_usage_lwm": 0.00001, "disk_check_interval_s": 0.2,
                             "journal_prealloc_bytes": 0})
    bp.start()
    assert _http(mport, "/health") == (200, {"alive": True})
    assert _grpc_health(bp.address) == "SERVING"
    code, body = until(lambda: (r := _http(mport, "/ready"))[0] == 503 and r, "read-only 503")
    assert body["reasons"] == ["read-only"] and body["ready"] is False
    assert _grpc_health(bp.address, "bookie.writable") == "NOT_SERVING"
    assert _grpc_health(bp.address, "bookie.ready") == "NOT_SERVING"
    assert _grpc_health(bp.address, "pybk.wire.v1.Bookie") == "SERVING"   # reads still served
    bp.write_conf(disk_usage_threshold=0.999, disk_usage_lwm=0.998)
    bp.signal(signal.SIGHUP)
    assert until(lambda: _http(mport, "/ready")[0] == 200, "ready again")
    assert _grpc_health(bp.address, "bookie.writable") == "SERVING"
    assert _grpc_health(bp.address, "bookie.ready") == "SERVING"
    assert "bookie_add_requests" in _http(mport, "/metrics")[1]
    assert bp.terminate() == 0


def _registration(store, bookie_id):
    got = store.get(f"bookies/writable/{bookie_id}")
    return json.loads(got.value) if got is not None else None


def _until_registered(bp, store, what):
    """The bookie's writable registration; a bookie that exits or never registers
    fails with its log and what the store holds under bookies/."""
    def registered():
        if bp.proc.poll() is not None:
            raise AssertionError(f"bookie exited with {bp.proc.returncode} before "
                                 f"{what}:\n{bp.log_tail()}")
        return _registration(store, "b1")
    try:
        return until(registered, what)
    except TimeoutError as exc:
        keys = [(k, v.value.decode(errors="replace")) for k, v in store.list_prefix("bookies/")]
        raise AssertionError(f"{exc}; bookies/ holds {keys}\n{bp.log_tail()}") from exc


def _run(argv):
    proc = procs.spawn([sys.executable, "-m", "bookie_server", *argv], stdout=subprocess.PIPE,
                       stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True)
    try:
        out, err = proc.communicate(timeout=HANG_GUARD)
    finally:
        procs.terminate(proc, grace=0)
    return proc.returncode, out, err


@needs_bookie
def test_address_change_refused_then_updatecookie(bookies, etcd_scope):
    uri, store = etcd_scope
    mport = free_port()
    bp = bookies("b1", metadata_uri=uri, bookie_id="b1",
                 conf={"metrics_port": mport, "journal_prealloc_bytes": 0})
    bp.start()
    assert until(lambda: _http(mport, "/ready")[0] == 200, "ready")
    assert _registration(store, "b1")["address"] == f"127.0.0.1:{bp.port}"
    assert json.loads(store.get("cookies/b1").value)["address"] == f"127.0.0.1:{bp.port}"
    assert bp.terminate() == 0

    # a data dir from before addresses were recorded: recorded now, no refusal
    local = cookie.read_local(bp.data_dir)
    del local["address"]
    cookie.write_local(bp.data_dir, local)
    got = store.get("cookies/b1")
    remote = json.loads(got.value)
    del remote["address"]
    store.compare_and_swap("cookies/b1", json.dumps(remote).encode(), got.version)
    bp.start()
    assert cookie.read_local(bp.data_dir)["address"] == f"127.0.0.1:{bp.port}"
    assert json.loads(store.get("cookies/b1").value)["address"] == f"127.0.0.1:{bp.port}"
    assert bp.terminate() == 0

    # the bookie "moved" to 127.0.0.2: refused, naming the command that fixes it
    bp.write_conf(bind_address="127.0.0.2")
    bp.start(wait=False)
    assert bp.wait_exit(HANG_GUARD) == 2
    line = bp.log_tail().strip().splitlines()[-1]
    assert "registered at 127.0.0.1:" in line and "advertised_address" in line, line
    fix = shlex.split(re.search(r"record the new address with: (.*)$", line).group(1))
    assert fix[:2] == ["bookie-server", "updatecookie"]
    assert _registration(store, "b1") is None

    rc, _, err = _run(fix[1:])                       # not confirmed: nothing changes
    assert rc == 2 and "--yes" in err
    assert cookie.read_local(bp.data_dir)["address"] == f"127.0.0.1:{bp.port}"
    rc, out, err = _run([*fix[1:], "--yes"])
    assert rc == 0, err
    assert f"-> 127.0.0.2:{bp.port}" in out
    assert json.loads(store.get("cookies/b1").value)["address"] == f"127.0.0.2:{bp.port}"

    bp.start(wait=False)
    reg = _until_registered(bp, store, "registration at the new address")
    assert reg["address"] == f"127.0.0.2:{bp.port}"
    assert reg["add_lane_address"].startswith("127.0.0.2:")
    assert _grpc_health(reg["address"]) == "SERVING"
    assert bp.terminate() == 0
