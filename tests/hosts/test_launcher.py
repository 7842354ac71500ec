"""The test-host launcher itself: addresses, reachability, loopback, clean-up
(on close, on SIGTERM, and of a SIGKILLed run's leftovers)."""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import textwrap

import pytest

from tests.hosts.conftest import need_hosts

PY = sys.executable


def _names() -> tuple[list[str], list[str]]:
    ns = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout.split()
    links = subprocess.run(["ip", "-o", "link", "show"], capture_output=True, text=True).stdout
    return ns, [ln.split(":")[1].strip().split("@")[0] for ln in links.splitlines()]


def _echo_server(host, port: int) -> subprocess.Popen:
    code = textwrap.dedent(f"""
        import socket, sys
        s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind(("{host.address}", {port})); s.listen()
        print("ready", flush=True)
        while True:
            c, _ = s.accept(); c.sendall(c.recv(64)); c.close()
    """)
    proc = host.spawn([PY, "-c", code], stdout=subprocess.PIPE)
    assert proc.stdout.readline().strip() == b"ready"
    return proc


def test_hosts_reach_each_other_and_the_root(tmp_path):
    need_hosts()
    from pybk_spark.cluster.hosts import HostNetwork
    with HostNetwork() as net:
        a, b = net.add_hosts("a", "b")
        assert a.address != b.address and a.netns.startswith("pbk-")
        _echo_server(b, 7000)
        # root namespace -> host b
        with socket.create_connection((b.address, 7000), timeout=5) as s:
            s.sendall(b"root")
            assert s.recv(64) == b"root"
        # host a -> host b, and loopback is up inside host a
        probe = textwrap.dedent(f"""
            import socket
            with socket.create_connection(("{b.address}", 7000), timeout=5) as s:
                s.sendall(b"a"); assert s.recv(8) == b"a"
            l = socket.socket(); l.bind(("127.0.0.1", 0)); l.listen()
            socket.create_connection(l.getsockname(), timeout=5).close()
            print("ok")
        """)
        assert a.run([PY, "-c", probe]).stdout.strip() == "ok"
        netns = [h.netns for h in (a, b)]
        links = [net.bridge, a.link, b.link]
        pids = b.pids()
        assert pids
    ns_after, links_after = _names()
    assert not set(netns) & set(ns_after)
    assert not set(links) & set(links_after)
    assert not any(os.path.exists(f"/proc/{p}/cmdline") and open(f"/proc/{p}/cmdline").read()
                   for p in pids)


_RUN_AND_DIE = textwrap.dedent("""
    import os, signal, subprocess, sys, time
    from pybk_spark.cluster.hosts import HostNetwork
    net = HostNetwork().start()
    host = net.add_host("victim")
    host.spawn(["sleep", "600"])
    print(host.netns, net.bridge, flush=True)
    if sys.argv[1] == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    time.sleep(600)
""")


@pytest.mark.parametrize("how", ["sigterm", "sigkill"])
def test_a_run_that_dies_leaves_nothing_behind(how):
    need_hosts()
    from pybk_spark.cluster.hosts import clear_leftovers
    env = dict(os.environ, PYTHONPATH=os.getcwd() + os.pathsep + os.environ.get("PYTHONPATH", ""))
    proc = subprocess.Popen([PY, "-c", _RUN_AND_DIE, "kill" if how == "sigkill" else "wait"],
                            stdout=subprocess.PIPE, env=env)
    try:
        netns, bridge = proc.stdout.readline().decode().split()
        ns_now, links_now = _names()
        assert netns in ns_now and bridge in links_now
        if how == "sigterm":
            proc.send_signal(signal.SIGTERM)      # the run cleans up after itself
            assert proc.wait(60) == 128 + signal.SIGTERM
        else:
            proc.wait(60)                         # SIGKILLed: the next start cleans up
            assert netns in _names()[0]
            removed = clear_leftovers()
            assert netns in removed and bridge in removed
        ns_after, links_after = _names()
        assert netns not in ns_after and bridge not in links_after
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_missing_capability_skips_or_fails_naming_it(monkeypatch):
    from pybk_spark.cluster import hosts
    monkeypatch.setattr(hosts, "_REASON", ["no CAP_NET_ADMIN: run as root"])
    with pytest.raises(hosts.HostsUnavailable, match="CAP_NET_ADMIN"):
        hosts.require()
    assert hosts.main(["--check"]) == 1
    monkeypatch.delenv("PYBK_REQUIRE_HOSTS", raising=False)
    with pytest.raises(pytest.skip.Exception, match="unavailable: no CAP_NET_ADMIN"):
        need_hosts()
    monkeypatch.setenv("PYBK_REQUIRE_HOSTS", "1")
    with pytest.raises(pytest.fail.Exception, match="required but unavailable"):
        need_hosts()
