"""Link faults between test hosts (``pybk_spark.cluster.hosts``): partitions,
one-way drops, random loss, and netem delay; each one healed by id or all
at once.

Mechanism.  Every host is its own network namespace, so a fault is a set of
packet-filter rules INSIDE the namespaces involved (``ip netns exec NS
iptables ...``), never in the root namespace and never naming an address
outside the network's own /24:

  drop(src, dst)        in each src host: ``OUTPUT -d <dst> -j DROP``.  Packets
                        from src to dst vanish, established connections
                        included; dst -> src still flows (an add reaches the
                        bookie, its reply is lost: the unknown outcome).
  partition(A, B)       drop(A, B) + drop(B, A).
  isolate(h, hosts)     partition({h}, hosts): a long stall of h.
  loss(h, p, peers)     in h: ``INPUT/OUTPUT -m statistic --probability p``
                        (random loss both ways, optionally only with peers).
  netem(h, delay_ms, jitter_ms, loss, reorder)
                        ``tc qdisc add dev <h.link> root netem ...`` on the
                        host's root-side veth (traffic toward h).  Needs the
                        kernel's netem qdisc: ``netem_unavailable_reason()``
                        says whether it is there (the probe runs in a
                        throw-away namespace); callers skip with the reason.

Each rule carries the comment ``pbk-fault-<id>``; ``heal(id)`` deletes that
fault's rules (``iptables -D`` with the same spec), ``heal_all()`` every
fault of the network.  The rules also vanish with the namespace, so
``HostNetwork.close()``, a SIGTERM and the next run's leftover sweep remove
them too: nothing outlives the run.  Rules are made with ``iptables -w``
(the xtables lock), one call per rule.

Capability.  ``unavailable_reason()``: None, or why rules cannot be made
(no ``iptables`` binary: ``make chaos`` / ``make test`` install it with
apt-get, like the benchmark's redis).  Tests skip with that reason.
"""
from __future__ import annotations

import itertools
import os
import shutil
import subprocess
import threading
from dataclasses import dataclass, field
from typing import Iterable, Optional

_IPTABLES = ("/usr/sbin/iptables", "/sbin/iptables")


class LinkFaultsUnavailable(RuntimeError):
    """A link fault cannot be made here (the message says what is missing)."""


def _iptables_binary() -> Optional[str]:
    return shutil.which("iptables") or next((p for p in _IPTABLES if os.access(p, os.X_OK)),
                                            None)


def _tc_binary() -> Optional[str]:
    return shutil.which("tc") or next((p for p in ("/usr/sbin/tc", "/sbin/tc")
                                       if os.access(p, os.X_OK)), None)


_REASONS: dict[str, Optional[str]] = {}


def unavailable_reason() -> Optional[str]:
    """None if drop/partition/loss rules can be made, else what is missing."""
    if "iptables" not in _REASONS:
        from pybk_spark.cluster import hosts  # why: hosts imports this module (a cycle)
        reason = hosts.unavailable_reason()
        if reason is None and _iptables_binary() is None:
            reason = ("no 'iptables' command (link faults need it: "
                      "apt-get install iptables, as 'make chaos' does)")
        _REASONS["iptables"] = reason
    return _REASONS["iptables"]


def netem_unavailable_reason() -> Optional[str]:
    """None if ``tc ... netem`` works here (probed in a throw-away namespace)."""
    if "netem" not in _REASONS:
        from pybk_spark.cluster import hosts  # why: hosts imports this module (a cycle)
        reason = hosts.unavailable_reason()
        if reason is None and _tc_binary() is None:
            reason = "no 'tc' command (install iproute2)"
        if reason is None:
            reason = _probe_netem(hosts)
        _REASONS["netem"] = reason
    return _REASONS["netem"]


def _probe_netem(hosts) -> Optional[str]:
    ns = f"{hosts.PREFIX}-0-probe{os.getpid()}"
    ip = hosts.ip_binary() or "ip"
    subprocess.run([ip, "netns", "add", ns], capture_output=True)
    try:
        subprocess.run([ip, "-n", ns, "link", "set", "lo", "up"], capture_output=True)
        res = subprocess.run([ip, "netns", "exec", ns, _tc_binary() or "tc", "qdisc", "add", "dev",
                              "lo", "root", "netem", "delay", "1ms"],
                             capture_output=True, text=True)
        if res.returncode != 0:
            return (f"the kernel has no netem qdisc ('tc qdisc add ... netem': "
                    f"{res.stderr.strip() or res.returncode}); delay/jitter/reorder faults "
                    f"need CONFIG_NET_SCH_NETEM")
        return None
    finally:
        subprocess.run([ip, "netns", "del", ns], capture_output=True)


def require() -> None:
    reason = unavailable_reason()
    if reason:
        raise LinkFaultsUnavailable(reason)


@dataclass
class Fault:
    """One applied fault: what it is and the commands that undo it."""
    fault_id: int
    kind: str
    description: str
    undo: list = field(default_factory=list)     # argv lists, run in reverse order


class LinkFaults:
    """The link faults of one ``HostNetwork`` (thread-safe)."""

    def __init__(self, network):
        self.network = network
        self._lock = threading.Lock()
        self._ids = itertools.count(1)
        self.active: dict[int, Fault] = {}

    # -- faults -------------------------------------------------------------------------
    def drop(self, src: Iterable, dst: Iterable) -> int:
        """Packets from every host in ``src`` to every host in ``dst`` are dropped."""
        src, dst = self._hosts(src), self._hosts(dst)
        desc = f"{_names(src)} -> {_names(dst)} dropped"
        return self._apply("drop", desc, [
            (s, "OUTPUT", ["-d", d.address]) for s in src for d in dst if s is not d])

    def partition(self, a: Iterable, b: Iterable) -> int:
        """No packet between a host of ``a`` and a host of ``b``, either way."""
        a, b = self._hosts(a), self._hosts(b)
        desc = f"{_names(a)} | {_names(b)}"
        return self._apply("partition", desc, [
            (x, "OUTPUT", ["-d", y.address]) for x, y in
            [(s, d) for s in a for d in b] + [(s, d) for s in b for d in a] if x is not y])

    def isolate(self, host, others: Iterable | None = None) -> int:
        """``host`` cut off from ``others`` (default: every other host)."""
        host = self._hosts([host])[0]
        others = [h for h in self._hosts(others if others is not None
                                         else self.network.hosts.values()) if h is not host]
        return self.partition([host], others)

    def loss(self, host, probability: float, peers: Iterable | None = None) -> int:
        """Each packet into or out of ``host`` (only with ``peers`` when given)
        is dropped with ``probability``."""
        if not 0.0 < probability <= 1.0:
            raise ValueError(f"loss probability {probability}: want (0, 1]")
        host = self._hosts([host])[0]
        stat = ["-m", "statistic", "--mode", "random", "--probability", f"{probability:.4f}"]
        if peers is None:
            rules = [(host, "OUTPUT", stat), (host, "INPUT", stat)]
            desc = f"{host.name} loses {probability:.0%}"
        else:
            peers = [p for p in self._hosts(peers) if p is not host]
            rules = [(host, "OUTPUT", ["-d", p.address, *stat]) for p in peers] + \
                    [(host, "INPUT", ["-s", p.address, *stat]) for p in peers]
            desc = f"{host.name} loses {probability:.0%} with {_names(peers)}"
        return self._apply("loss", desc, rules)

    def netem(self, host, *, delay_ms: float = 0.0, jitter_ms: float = 0.0,
              loss: float = 0.0, reorder: float = 0.0) -> int:
        """tc netem on ``host``'s root-side veth: traffic toward ``host`` is
        delayed (± jitter), lost and reordered.  One netem per host."""
        reason = netem_unavailable_reason()
        if reason:
            raise LinkFaultsUnavailable(reason)
        host = self._hosts([host])[0]
        spec = ["delay", f"{delay_ms:g}ms"]
        if jitter_ms:
            spec += [f"{jitter_ms:g}ms"]
        if loss:
            spec += ["loss", f"{loss * 100:g}%"]
        if reorder:
            spec += ["reorder", f"{reorder * 100:g}%"]
        tc = _tc_binary() or "tc"
        with self._lock:
            fid = next(self._ids)
            _run([tc, "qdisc", "replace", "dev", host.link, "root", "netem", *spec])
            self.active[fid] = Fault(fid, "netem", f"{host.name} netem {' '.join(spec)}",
                                     [[tc, "qdisc", "del", "dev", host.link, "root"]])
        return fid

    # -- healing --------------------------------------------------------------------------
    def heal(self, fault_id: int) -> bool:
        """Undo one fault; False if it was already healed."""
        with self._lock:
            fault = self.active.pop(fault_id, None)
        if fault is None:
            return False
        for argv in reversed(fault.undo):
            _run(argv, check=False)         # a namespace gone with its rules is healed
        return True

    def heal_all(self) -> int:
        """Undo every fault; returns how many there were."""
        with self._lock:
            ids = list(self.active)
        return sum(self.heal(fid) for fid in ids)

    def forget(self) -> None:
        """The namespaces are gone (close()): their rules went with them."""
        with self._lock:
            self.active.clear()

    def rules(self, host) -> list[str]:
        """The fault rules inside ``host`` now (``iptables -S`` lines with our tag)."""
        host = self._hosts([host])[0]
        out = _run(host.command([_iptables_binary() or "iptables", "-w", "-S"])).stdout
        return [ln for ln in out.splitlines() if "pbk-fault-" in ln]

    # -- internals ------------------------------------------------------------------------
    def _hosts(self, hosts: Iterable) -> list:
        out = []
        for h in hosts:
            host = self.network.hosts.get(h) if isinstance(h, str) else h
            if host is None or self.network.hosts.get(host.name) is not host:
                raise ValueError(f"{h!r} is not a host of this network")
            out.append(host)
        return out

    def _apply(self, kind: str, desc: str, rules: list) -> int:
        require()
        ipt = _iptables_binary()
        with self._lock:
            fid = next(self._ids)
            fault = Fault(fid, kind, desc)
            self.active[fid] = fault
            tag = ["-m", "comment", "--comment", f"pbk-fault-{fid}", "-j", "DROP"]
            for host, chain, match in rules:
                spec = [chain, *match, *tag]
                _run(host.command([ipt, "-w", "-A", *spec]))
                fault.undo.append(host.command([ipt, "-w", "-D", *spec]))
        return fid


def _names(hosts) -> str:
    return ",".join(h.name for h in hosts) or "-"


def _run(argv: list, check: bool = True) -> subprocess.CompletedProcess:
    res = subprocess.run([str(a) for a in argv], capture_output=True, text=True, timeout=30)
    if check and res.returncode != 0:
        raise LinkFaultsUnavailable(f"{' '.join(map(str, argv))}: {res.stderr.strip()}")
    return res
