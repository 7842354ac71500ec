"""The bookie's admin HTTP API (bookie_server/serving/admin_http.py) on the metrics
port of the shared cluster's real bookie processes: every route, its typed
JSON, and the error answers.  The loopback-only rule is checked on the
handler itself (a test host has no second interface to call from)."""
import json
import urllib.error
import urllib.request

import pytest

from bookie_server.serving.admin_http import AdminApi, is_loopback
from pybk_spark.metadata import audit_control as ctl

from admin_helpers import wait_until


@pytest.fixture
def bk(cluster_bk):
    return cluster_bk


def call(port, method, path, body=None):
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", data=data, method=method,
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def metrics_port(bk, bookie_id):
    for mode in ("writable", "readonly"):
        got = bk.metadata_store.get(f"bookies/{mode}/{bookie_id}")
        if got is not None:
            return json.loads(got.value)["metrics_port"]
    raise AssertionError(f"{bookie_id} not registered")


def test_state_and_read_only_switch(cluster, bk):
    bid = cluster.bookie_ids[2]
    port = metrics_port(bk, bid)
    code, st = call(port, "GET", "/api/v1/bookie/state")
    assert code == 200 and st == {"bookie_id": bid, "serving": True, "registered": True,
                                  "read_only": False, "read_only_reason": None,
                                  "stopping": False}
    try:
        code, ro = call(port, "PUT", "/api/v1/bookie/state/readonly", {"read_only": True})
        assert code == 200 and ro == {"read_only": True, "admin_read_only": True}
        wait_until(lambda: bk.metadata_store.get(f"bookies/readonly/{bid}"), 30,
                   "registration moved to readonly")
        assert call(port, "GET", "/api/v1/bookie/state")[1]["read_only_reason"] == "admin"
        assert call(port, "GET", "/ready")[0] == 503
    finally:
        code, ro = call(port, "PUT", "/api/v1/bookie/state/readonly", {"read_only": False})
    assert code == 200 and ro == {"read_only": False, "admin_read_only": False}
    wait_until(lambda: bk.metadata_store.get(f"bookies/writable/{bid}"), 30, "writable again")
    assert call(port, "GET", "/api/v1/bookie/state/readonly")[1]["read_only"] is False
    code, err = call(port, "PUT", "/api/v1/bookie/state/readonly", {"readOnly": "yes"})
    assert code == 400 and err["error"] == "bad_request" and "read_only" in err["message"]


def test_gc_trigger_and_details(cluster, bk):
    bid = cluster.bookie_ids[0]
    port = metrics_port(bk, bid)
    lh = bk.create_ledger(3, 3, 3)
    lh.add_entries([b"gc-me"] * 3)
    lh.close()
    before = call(port, "GET", "/api/v1/bookie/gc_details")[1]
    assert {"running", "runs", "last_deleted", "deleted_total", "interval_s"} <= set(before)
    bk.delete_ledger(lh.ledger_id)
    code, body = call(port, "PUT", "/api/v1/bookie/gc")
    assert code == 200 and body == {"triggered": True}
    assert set(call(port, "GET", "/api/v1/bookie/gc")[1]) == {"is_in_force_gc"}

    def collected():
        d = call(port, "GET", "/api/v1/bookie/gc_details")[1]
        return d["runs"] > before["runs"] and not d["running"] and d
    details = wait_until(collected, 60, "a GC run after the trigger")
    assert lh.ledger_id in details["last_deleted"] or details["deleted_total"] > 0


def test_info(cluster, bk):
    port = metrics_port(bk, cluster.bookie_ids[1])
    code, info = call(port, "GET", "/api/v1/bookie/info")
    assert code == 200
    assert info["bookie_id"] == cluster.bookie_ids[1]
    assert isinstance(info["ledger_count"], int) and info["total_bytes"] > 0
    assert set(info["journal_position"]) == {"seq", "offset"}
    assert info["lost_ranges"] == [] and info["lost_unattributed"] is False
    assert info["checkpoint"] is None or set(info["checkpoint"]) == {"seq", "offset",
                                                                    "generation"}


def test_cluster_info(cluster, bk):
    port = metrics_port(bk, cluster.bookie_ids[1])
    code, ci = call(port, "GET", "/api/v1/bookie/cluster_info")
    assert code == 200
    assert ci["writable_bookies"] + ci["readonly_bookies"] >= len(cluster.bookie_ids)
    assert ci["total_bookies"] >= ci["writable_bookies"] + ci["readonly_bookies"]
    assert not set(ci["unavailable_bookies"]) & set(cluster.bookie_ids)
    assert isinstance(ci["auditor_elected"], bool) and ci["autorecovery_enabled"] in (True, False)


def test_autorecovery_routes(cluster, bk):
    port = metrics_port(bk, cluster.bookie_ids[0])
    store = bk.metadata_store
    try:
        code, st = call(port, "GET", "/api/v1/autorecovery/status")
        assert code == 200 and {"enabled", "leader", "lost_bookie_recovery_delay_s",
                                "missing_bookies"} <= set(st)
        code, st = call(port, "PUT", "/api/v1/autorecovery/status", {"enabled": False})
        assert code == 200 and st["enabled"] is False
        assert ctl.read_config(store)["enabled"] is False
        before = ctl.trigger_version(store)
        code, body = call(port, "PUT", "/api/v1/autorecovery/trigger_audit")
        assert code == 200 and body["triggered"] and ctl.trigger_version(store) > before
        code, body = call(port, "PUT", "/api/v1/autorecovery/lost_bookie_recovery_delay",
                          {"delay_seconds": 12})
        assert code == 200 and body == {"delay_seconds": 12.0}
        assert call(port, "GET", "/api/v1/autorecovery/lost_bookie_recovery_delay")[1] == \
            {"delay_seconds": 12.0}
        code, err = call(port, "PUT", "/api/v1/autorecovery/lost_bookie_recovery_delay",
                         {"delay_seconds": "soon"})
        assert code == 400
    finally:
        ctl.set_enabled(store, True)
        ctl.set_lost_bookie_delay(store, None)


def test_unknown_route_and_method(cluster, bk):
    port = metrics_port(bk, cluster.bookie_ids[0])
    code, err = call(port, "GET", "/api/v1/bookie/nothing")
    assert code == 404 and "docs/operations.md" in err["message"]
    code, err = call(port, "GET", "/api/v1/bookie/gc_details/")
    assert code == 200
    code, err = call(port, "PUT", "/api/v1/bookie/info", {})
    assert code == 405 and "GET" in err["message"]
    assert call(port, "GET", "/health") == (200, {"alive": True})


def test_remote_peers_refused_unless_allowed():
    assert is_loopback("127.0.0.1") and is_loopback("::1") and is_loopback("::ffff:127.0.0.1")
    assert not is_loopback("10.1.2.3") and not is_loopback("fe80::1%eth0")
    local_only = AdminApi()
    code, err = local_only.handle("GET", "/api/v1/bookie/state", b"", "10.1.2.3")
    assert code == 403 and "admin_http_allow_remote" in err["message"]
    code, err = local_only.handle("GET", "/api/v1/bookie/state", b"", "127.0.0.1")
    assert code == 503 and err["error"] == "starting"          # not attached yet
    remote_ok = AdminApi(allow_remote=True)
    assert remote_ok.handle("GET", "/api/v1/bookie/state", b"", "10.1.2.3")[0] == 503
