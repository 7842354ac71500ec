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


def free_port(avoid: set[int] | None = None, host: str = "127.0.0.1") -> int:
    """A port that is free now and was not handed out before in this process.

    Picks from a random high range rather than asking the kernel for an
    ephemeral port: ephemeral ports get reused by outgoing connections, which
    makes a port chosen now collide with a client socket later.
    """
    avoid = (avoid or set()) | _HANDED_OUT
    rng = random.Random()
    for _ in range(1000):
        port = rng.randint(20000, 30999)
        if port in avoid:
            continue
        if port_is_free(port, host):
            _HANDED_OUT.add(port)
            return port
    raise RuntimeError("no free port found")
