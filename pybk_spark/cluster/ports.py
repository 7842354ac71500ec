"""Free loopback ports for test and standalone processes."""
from __future__ import annotations

import random
import socket

_HANDED_OUT: set[int] = set()


def port_is_free(port: int, host: str = "127.0.0.1") -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
            return True
        except OSError:
            return False


_PICK = (20000, 30999)      # below Linux's default ephemeral range (32768-60999)


def _pick_range() -> tuple[int, int]:
    """Where ``free_port`` picks: ``_PICK``, or above the kernel's
    ephemeral range where this machine's range overlaps it."""
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            low, high = (int(v) for v in f.read().split())
    except (OSError, ValueError):
        return _PICK
    if high < _PICK[0] or low > _PICK[1]:
        return _PICK
    if high > 65535 - 2000:       # no room above it either: the odds of a collision stay
        return _PICK
    return high + 1, 65535


def free_port(avoid: set[int] | None = None, host: str = "127.0.0.1") -> int:
    """A port that is free now and was not handed out before in this process.

    Picks at random outside the kernel's ephemeral range rather than asking
    the kernel for an ephemeral port: ephemeral ports get reused by outgoing
    connections, which makes a port chosen now collide with a client socket
    later.
    """
    avoid = (avoid or set()) | _HANDED_OUT
    rng = random.Random()
    low, high = _pick_range()
    for _ in range(1000):
        port = rng.randint(low, high)
        if port in avoid:
            continue
        if port_is_free(port, host):
            _HANDED_OUT.add(port)
            return port
    raise RuntimeError("no free port found")
