"""The delay fault without netem (tcp_relay.py) between two test hosts: a
connection open before the fault is reset, a new one goes through the relay
and its round trip is at least twice the delay (lower bound only: the relay
holds each direction's bytes); bytes sent during a stall arrive only once
the stall is over, never lost; the heal removes the rules and ends the
relay, and connections then go direct.  Skips, naming what is missing,
where test hosts or iptables are unavailable."""
from __future__ import annotations

import pytest

from tests.hosts.conftest import need_hosts
from tests.hosts.test_link_faults import _client, _got, _root_rules, _server

from . import tcp_relay


@pytest.fixture
def net():
    need_hosts()
    from pybk_spark.cluster import link_faults
    reason = link_faults.unavailable_reason()
    if reason:
        pytest.skip(f"link faults unavailable: {reason}")
    from pybk_spark.cluster.hosts import HostNetwork
    with HostNetwork() as network:
        yield network


def _nat_rules(host) -> list[str]:
    out = host.run(["iptables", "-w", "-t", "nat", "-S"]).stdout
    return [ln for ln in out.splitlines() if "pbk-fault-" in ln]


def test_relay_delays_resets_old_connections_and_heals(net, tmp_path):
    a, b = net.add_hosts("a", "b")
    srv = _server(b)
    ask = _client(a, b)
    log = tmp_path / "relay.log"
    try:
        assert ask("connect 10") == ["connected"]
        assert ask("send one 10")[:2] == ["echo", "one"]
        fid = tcp_relay.apply(net.faults, a, [b], seed=3, delay_ms=150, jitter_ms=20,
                              log_path=log)
        assert len(_nat_rules(a)) == 1 and len(net.faults.rules(a)) == 1
        assert ask("send two 10")[0] == "error"            # the old connection is reset
        assert ask("connect 10") == ["connected"]           # a new one: through the relay
        echo = ask("send three 10")
        assert echo[:2] == ["echo", "three"] and float(echo[2]) >= 2 * 0.130
        assert net.faults.heal(fid)
        assert _nat_rules(a) == [] and net.faults.rules(a) == []
        assert ask("connect 10") == ["connected"]           # direct again
        assert ask("send four 10")[:2] == ["echo", "four"]
        assert "pbk-fault" not in _root_rules()
        assert "'connections': 1" in log.read_text()        # counters printed on SIGTERM
    finally:
        ask.proc.kill()
        srv.kill()


def test_a_stall_holds_bytes_then_delivers_them(net, tmp_path):
    a, b = net.add_hosts("a", "b")
    srv = _server(b)
    ask = _client(a, b)
    log = tmp_path / "relay.log"
    try:
        fid = tcp_relay.apply(net.faults, a, [b], seed=4, delay_ms=1, stall_s=6.0,
                              log_path=log)
        assert ask("connect 10") == ["connected"]
        assert ask("send held 60")[:2] == ["echo", "held"]  # delivered late, not lost
        assert _got(srv, "held", 5.0)
        net.faults.heal(fid)
    finally:
        ask.proc.kill()
        srv.kill()
    counts = log.read_text()
    assert "'held_chunks': 0" not in counts and "'held_chunks'" in counts
