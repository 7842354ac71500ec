"""Link faults between test hosts: a partition cuts a TCP echo and heal
restores it; a one-way drop loses replies (the request still arrives) or
requests; loss 100% is a cut; netem delay shows in a socket round trip
(lower bound only); every rule is gone after heal and after close, and none
is ever made in the root namespace."""
from __future__ import annotations

import subprocess
import sys
import textwrap
import time

import pytest

from tests.hosts.conftest import need_hosts

PY = sys.executable
PORT = 7100

# A server that echoes each line on a connection and reports every line it got
# on stdout ("got <line>"), so a test sees a request arrive even when its reply
# is lost.
_SERVER = textwrap.dedent("""
    import socket, sys, threading
    s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind((sys.argv[1], int(sys.argv[2]))); s.listen()
    print("ready", flush=True)
    def serve(c):
        f = c.makefile("rb")
        for line in f:
            print("got", line.decode().strip(), flush=True)
            c.sendall(line)
    while True:
        c, _ = s.accept()
        threading.Thread(target=serve, args=(c,), daemon=True).start()
""")

# A client driven by stdin lines: "connect", "send WORD T" (send, wait up to T
# seconds for the echo), "recv T"; answers one line each.
_CLIENT = textwrap.dedent("""
    import socket, sys, time
    addr = (sys.argv[1], int(sys.argv[2]))
    conn = None
    for cmd in sys.stdin:
        parts = cmd.split()
        try:
            if parts[0] == "connect":
                conn = socket.create_connection(addr, timeout=float(parts[1]))
                print("connected", flush=True)
            elif parts[0] == "send":
                t0 = time.monotonic()
                conn.sendall(parts[1].encode() + b"\\n")
                conn.settimeout(float(parts[2]))
                got = conn.recv(64).decode().strip()
                print("echo", got, f"{time.monotonic() - t0:.4f}", flush=True)
            elif parts[0] == "recv":
                conn.settimeout(float(parts[1]))
                print("echo", conn.recv(64).decode().strip(), "0", flush=True)
        except OSError as exc:
            print("error", type(exc).__name__, flush=True)
""")


def _client(host, server):
    proc = subprocess.Popen(host.command([PY, "-c", _CLIENT, server.address, str(PORT)]),
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)

    def ask(line: str) -> list[str]:
        proc.stdin.write(line + "\n")
        proc.stdin.flush()
        return proc.stdout.readline().split()
    ask.proc = proc
    return ask


def _server(host):
    proc = host.spawn([PY, "-c", _SERVER, host.address, str(PORT)], stdout=subprocess.PIPE)
    assert proc.stdout.readline().strip() == b"ready"
    return proc


def _got(server, word: str, within: float) -> bool:
    """Did the server report ``word`` (bounded wait on its stdout)?"""
    import select
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        ready, _, _ = select.select([server.stdout], [], [], deadline - time.monotonic())
        if not ready:
            return False
        line = server.stdout.readline().decode().split()
        if line[-1:] == [word]:
            return True
    return False


def _root_rules() -> str:
    return subprocess.run(["iptables", "-w", "-S"], capture_output=True, text=True).stdout


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


def test_partition_cuts_and_heal_restores(net):
    a, b, c = net.add_hosts("a", "b", "c")
    srv = _server(b)
    ask = _client(a, b)
    try:
        assert ask("connect 10") == ["connected"]
        assert ask("send one 10")[:2] == ["echo", "one"]
        fid = net.faults.partition([a], [b, c])
        assert len(net.faults.rules(a)) == 2 and len(net.faults.rules(b)) == 1
        assert ask("send two 2") == ["error", "TimeoutError"]   # established: cut
        assert not _got(srv, "two", 1.0)                        # never arrived
        assert ask("connect 2")[0] == "error"                   # new: cut too
        assert net.faults.heal(fid) and not net.faults.heal(fid)
        assert net.faults.rules(a) == [] and net.faults.rules(b) == []
        assert ask("connect 10") == ["connected"]
        assert ask("send three 10")[:2] == ["echo", "three"]
        assert "pbk-fault" not in _root_rules()
    finally:
        ask.proc.kill()


def test_one_way_drop_loses_replies_but_requests_arrive(net):
    a, b = net.add_hosts("a", "b")
    srv = _server(b)
    ask = _client(a, b)
    try:
        assert ask("connect 10") == ["connected"]
        net.faults.drop([b], [a])                     # replies lost
        assert ask("send req 2") == ["error", "TimeoutError"]
        assert _got(srv, "req", 30.0)                 # ... but the request arrived
        assert net.faults.heal_all() == 1
        assert ask("recv 60")[:2] == ["echo", "req"]  # retransmitted after the heal
        net.faults.drop([a], [b])                     # requests lost
        assert ask("send lost 2") == ["error", "TimeoutError"]
        assert not _got(srv, "lost", 1.0)
        net.heal()
        assert _got(srv, "lost", 60.0)
    finally:
        ask.proc.kill()


def test_total_loss_is_a_cut_and_rules_vanish_on_close(net):
    a, b = net.add_hosts("a", "b")
    _server(b)
    ask = _client(a, b)
    try:
        net.faults.loss(a, 1.0, peers=[b])
        assert ask("connect 2")[0] == "error"
        assert len(net.faults.rules(a)) == 2
    finally:
        ask.proc.kill()
    net.close()                                   # with the fault still applied
    assert not net.faults.active and "pbk-fault" not in _root_rules()
    with pytest.raises(ValueError):
        net.faults.partition([a], [b])            # hosts of a closed network


def test_faults_name_only_hosts_of_this_network(net):
    a, = net.add_hosts("a")
    with pytest.raises(ValueError, match="not a host"):
        net.faults.drop([a], ["nobody"])
    with pytest.raises(ValueError, match="probability"):
        net.faults.loss(a, 1.5)


def test_netem_delay_shows_in_the_round_trip(net):
    from pybk_spark.cluster import link_faults
    reason = link_faults.netem_unavailable_reason()
    if reason:
        pytest.skip(f"netem unavailable: {reason}")
    a, b = net.add_hosts("a", "b")
    _server(b)
    ask = _client(a, b)
    try:
        assert ask("connect 10") == ["connected"]
        fid = net.faults.netem(b, delay_ms=200)
        echo = ask("send slow 30")
        assert echo[:2] == ["echo", "slow"] and float(echo[2]) >= 0.2   # lower bound only
        net.faults.heal(fid)
        assert ask("send fast 30")[:2] == ["echo", "fast"]
    finally:
        ask.proc.kill()
