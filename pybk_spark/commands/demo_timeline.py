"""What ``make demo-cluster`` saw, host by host (pure: no I/O, clock injected).

``Timeline`` collects hosts (name, address, role), timestamped events per
host ("started", "leader", "SIGKILL", ...) and per-host figures (entries a
bookie acknowledged); ``format()`` renders them one block per host, in the
order the hosts were added, every event as ``+SECONDS  text`` relative to the
timeline's start, followed by the same events in time order.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable


@dataclass
class HostRecord:
    name: str
    address: str
    role: str
    events: list[tuple[float, str]] = field(default_factory=list)
    figures: dict[str, str] = field(default_factory=dict)


class Timeline:
    def __init__(self, clock: Callable[[], float] = time.monotonic):
        self.clock = clock
        self.t0 = clock()
        self.hosts: dict[str, HostRecord] = {}

    def add_host(self, name: str, address: str, role: str) -> HostRecord:
        rec = self.hosts[name] = HostRecord(name, address, role)
        return rec

    def event(self, host: str, text: str) -> float:
        """Record ``text`` on ``host`` now; returns seconds since the start."""
        at = self.clock() - self.t0
        self.hosts[host].events.append((at, text))
        return at

    def figure(self, host: str, key: str, value) -> None:
        self.hosts[host].figures[key] = str(value)

    def chronological(self) -> list[tuple[float, str, str]]:
        """Every event as (seconds, host, text), oldest first (stable for ties)."""
        rows = [(at, h.name, text) for h in self.hosts.values() for at, text in h.events]
        return sorted(rows, key=lambda r: r[0])

    def format(self) -> str:
        width = max((len(h.name) for h in self.hosts.values()), default=4)
        addr_w = max((len(h.address) for h in self.hosts.values()), default=7)
        out = ["hosts:"]
        for h in self.hosts.values():
            figures = "  ".join(f"{k}={v}" for k, v in h.figures.items())
            out.append(f"  {h.name:<{width}}  {h.address:<{addr_w}}  {h.role}"
                       + (f"  [{figures}]" if figures else ""))
            for at, text in h.events:
                out.append(f"  {'':<{width}}    {_secs(at)}  {text}")
        out.append("timeline:")
        for at, host, text in self.chronological():
            out.append(f"  {_secs(at)}  {host:<{width}}  {text}")
        return "\n".join(out)


def _secs(at: float) -> str:
    return f"+{at:7.1f}s"
