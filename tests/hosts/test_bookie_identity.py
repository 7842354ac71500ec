"""Bookie network identity on separate hosts (docs/deployment.md, "Bookie
identity"): bookies listening on 0.0.0.0 and advertising their host's address
are reached by the client in the root namespace; with no advertised address
a wildcard bind registers the address of the route to etcd; a loopback
address with etcd on other hosts is refused at start; a bookie advertising
an address nothing answers at is a failed bookie for the client (an ensemble
change, not a hang).  Health and readiness are probed from the root namespace.

Every address used is loopback or inside the namespaces our launcher made.
"""
from __future__ import annotations

import json
import random
import subprocess
import time
import urllib.request

import grpc
import pytest

from pybk_spark.ledger.client import BookKeeper
from pybk_spark.cluster import procs
from pybk_spark.cluster.host_cluster import BOOKIE_PORT, bookie_command
from tests.hosts.conftest import need_hosts

pytestmark = pytest.mark.slow
METRICS_PORT = 8000          # each bookie is alone on its host: one port for all
HANG_GUARD = 90.0


@pytest.fixture(scope="module")
def hcluster(tmp_path_factory):
    need_hosts(etcd=True, bookies=True)
    from pybk_spark.cluster.host_cluster import HostCluster
    c = HostCluster(tmp_path_factory.mktemp("identity"),
                    bookie_conf={"journal_prealloc_bytes": 4 << 20,
                                 "metrics_port": METRICS_PORT})
    try:
        c.start()
        yield c
    finally:
        c.close()


def _until(pred, what: str, timeout: float = HANG_GUARD):
    deadline = time.monotonic() + timeout
    while True:
        got = pred()
        if got:
            return got
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(0.05)     # poll interval


def _grpc_health(address: str, service: str = "") -> str:
    from grpc_health.v1 import health_pb2, health_pb2_grpc
    with grpc.insecure_channel(address) as ch:
        r = health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(service=service),
                                                  timeout=5)
    return health_pb2.HealthCheckResponse.ServingStatus.Name(r.status)


def _argv(hcluster, host, bind: str, advertised: str, bookie_id: str) -> list[str]:
    return bookie_command(str(hcluster.data_dir / "bookie.conf"), BOOKIE_PORT, bind, advertised,
                          str(hcluster.data_dir / bookie_id), hcluster.metadata_uri, bookie_id)


def test_wildcard_bind_advertised_host_address_reached_from_root(hcluster):
    for bid, b in hcluster.bookies.items():
        reg = hcluster.wait_registered(bid)
        assert reg["address"] == f"{b.host.address}:{BOOKIE_PORT}"
        assert reg["add_lane_address"].rsplit(":", 1)[0] == b.host.address
        assert _grpc_health(reg["address"]) == "SERVING"
        assert _grpc_health(reg["address"], "bookie.ready") == "SERVING"
        url = f"http://{b.host.address}:{METRICS_PORT}"
        with urllib.request.urlopen(url + "/ready", timeout=5) as r:
            assert r.status == 200 and json.loads(r.read())["ready"] is True
        with urllib.request.urlopen(url + "/health", timeout=5) as r:
            assert r.status == 200
    bk = BookKeeper(hcluster.metadata_uri, conf={"explicit_lac_interval_ms": 0})
    try:
        lh = bk.create_ledger(3, 3, 2)
        assert lh.add_entries(b"e%d" % i for i in range(50)) == list(range(50))
        lh.close()
        assert [e.payload for e in bk.open_ledger(lh.ledger_id).read(0, 49)] == \
            [b"e%d" % i for i in range(50)]
    finally:
        bk.close()


def test_wildcard_bind_without_advertised_address_registers_route_to_etcd(hcluster):
    host = hcluster.network.add_host("derived")
    proc = host.spawn(_argv(hcluster, host, "0.0.0.0", "", "derived"),
                      stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        got = _until(lambda: proc.poll() is not None or hcluster.store.get(
            "bookies/writable/derived"), "registration of 'derived'")
        assert got is not True and proc.poll() is None, f"exited {proc.returncode}"
        assert json.loads(got.value)["address"] == f"{host.address}:{BOOKIE_PORT}"
    finally:
        procs.terminate(proc, grace=15)


def test_loopback_advertised_with_etcd_on_other_hosts_is_refused(hcluster):
    host = hcluster.network.add_host("loop")
    res = host.run(_argv(hcluster, host, "127.0.0.1", "", "loop"), check=False,
                   timeout=HANG_GUARD)
    assert res.returncode == 2, res.stderr
    line = res.stderr.strip().splitlines()[-1]
    assert "loopback" in line and "advertised_address" in line, line
    assert hcluster.store.get("cookies/loop") is None       # nothing written


def _replaced(hcluster, bad: str, seed: int) -> float:
    """Write 40 entries to a ledger whose ensemble holds ``bad``; check it was
    replaced and everything reads back.  Returns the seconds the adds took."""
    bk = BookKeeper(hcluster.metadata_uri, conf={"explicit_lac_interval_ms": 0},
                    rng=random.Random(seed))
    try:
        for _ in range(50):      # placement is random: find a ledger that picked ``bad``
            lh = bk.create_ledger(3, 3, 2)
            if bad in lh.metadata.current_ensemble:
                break
            lh.close()
        else:
            pytest.fail(f"placement never chose {bad}")
        t0 = time.monotonic()
        assert lh.add_entries(b"x%d" % i for i in range(40)) == list(range(40))
        took = time.monotonic() - t0
        lh.close()
        md = bk.get_ledger_metadata(lh.ledger_id)
        # replaced (at entry 0 the new ensemble takes the first one's place)
        assert bad not in md.ensembles[-1][1], md.ensembles
        assert [e.payload for e in bk.open_ledger(lh.ledger_id).read(0, 39)] == \
            [b"x%d" % i for i in range(40)]
        return took
    finally:
        bk.close()


def test_bookie_advertising_a_closed_port_is_replaced(hcluster):
    """bookie-4 listens on its own host but advertises etcd-1's address,
    where nothing listens on the bookie's ports: connections are refused,
    and the writer replaces it (ensemble change) instead of hanging."""
    elsewhere = hcluster.network["etcd-1"].address
    hcluster.add_bookie("bookie-4", advertised_address=elsewhere)
    try:
        assert hcluster.wait_registered("bookie-4")["address"] == f"{elsewhere}:{BOOKIE_PORT}"
        took = _replaced(hcluster, "bookie-4", seed=7)
        print(f"closed port: 40 adds with one ensemble change took {took:.2f}s")
    finally:
        hcluster.kill_bookie("bookie-4")


def test_bookie_advertising_a_host_that_went_down_is_replaced(hcluster):
    """bookie-5 advertises the address of host 'ghost', which our launcher
    made and then took off the bridge (its root-side veth down): nothing
    answers there at all (no ARP reply, no RST), so only the client's connect
    timeout ends the attempt; the writer still replaces the bookie."""
    ghost = hcluster.network.add_host("ghost")
    subprocess.run(["ip", "link", "set", ghost.link, "down"], check=True)
    hcluster.add_bookie("bookie-5", advertised_address=ghost.address)
    try:
        took = _replaced(hcluster, "bookie-5", seed=11)
        print(f"host down: 40 adds with one ensemble change took {took:.2f}s")
    finally:
        hcluster.kill_bookie("bookie-5")
