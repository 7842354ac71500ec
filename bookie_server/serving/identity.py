"""A bookie's network identity: the address it listens on and the address it
registers (advertises) for other hosts to reach it, as BookKeeper has them.

Theory of operation
-------------------
A bookie listens on ``bind_address`` (one interface, or ``0.0.0.0`` / ``::``
for all of them) and registers ``<advertised host>:<port>`` for gRPC and
``<advertised host>:<lane port>`` for the add lane.  ``advertised_host(...)``
chooses the host, first rule that applies:

  1. ``advertised_address`` (``--advertised-address``) when set;
  2. ``bind_address`` when it is a specific address (not a wildcard);
  3. wildcard bind, metadata store on another host: the local address the
     kernel would use to reach the first metadata endpoint (the source of
     the route to it: a UDP ``connect``, which sends no packet).  The hosts
     that share the bookie's network with the metadata store are the ones
     that will read the registration, so that is the address they can reach;
  4. wildcard bind, standalone or metadata store on loopback: ``127.0.0.1``
     (everything is on this one machine).

``check_advertised(host, metadata_uri)`` refuses, with ``ValueError`` naming
``advertised_address``, a wildcard host always, and a loopback host whenever
the metadata store's endpoints are not all loopback: clients on other hosts
would read an address that points at themselves.  Name resolution and the
route lookup are injected (``resolve``, ``route_source``).
"""
from __future__ import annotations

import ipaddress
import socket
from typing import TYPE_CHECKING, Any, Callable, Optional

if TYPE_CHECKING:
    from bookie_server.config import BookieConfig

WILDCARDS = ("0.0.0.0", "::", "")
SETTING = "advertised_address / --advertised-address"


def is_wildcard(host: str) -> bool:
    return host.strip("[]") in WILDCARDS


def _resolve(host: str) -> list[str]:
    try:
        return [str(ai[4][0]) for ai in socket.getaddrinfo(host, None, proto=socket.IPPROTO_TCP)]
    except OSError:
        return []


def is_loopback(host: str, resolve: Callable[[str], list[str]] = _resolve) -> bool:
    """A literal loopback address, or a name that resolves only to loopback."""
    host = host.strip("[]")
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        pass
    if host == "localhost":
        return True
    addrs = resolve(host)
    return bool(addrs) and all(ipaddress.ip_address(a.split("%")[0]).is_loopback
                               for a in addrs)


def metadata_hosts(metadata_uri: str) -> list[str]:
    """The hosts of an ``etcd://`` URI's endpoints ([] for none / memory://)."""
    if not metadata_uri or not metadata_uri.startswith("etcd://"):
        return []
    where = metadata_uri[len("etcd://"):].partition("/")[0]
    return [ep.strip().rpartition(":")[0].strip("[]") for ep in where.split(",") if ep.strip()]


def metadata_is_remote(metadata_uri: str, resolve: Callable[[str], list[str]] = _resolve) -> bool:
    return any(not is_loopback(h, resolve) for h in metadata_hosts(metadata_uri))


def _route_source(host: str) -> str:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_DGRAM) as s:
        s.connect((host, 9))          # UDP connect: picks the route, sends nothing
        source: str = s.getsockname()[0]
        return source


def advertised_host(bind_address: str, advertised_address: str, metadata_uri: str, *,
                    resolve: Callable[[str], list[str]] = _resolve,
                    route_source: Callable[[str], str] = _route_source) -> str:
    """The host part of the address this bookie registers (rules 1-4 above)."""
    if advertised_address:
        return advertised_address
    if not is_wildcard(bind_address):
        return bind_address
    remote = [h for h in metadata_hosts(metadata_uri) if not is_loopback(h, resolve)]
    if remote:
        try:
            return route_source(remote[0])
        except OSError as exc:
            raise ValueError(f"cannot derive the address to advertise: no route to the "
                             f"metadata store at {remote[0]} ({exc}); set {SETTING}") from None
    return "127.0.0.1"


def check_advertised(host: str, metadata_uri: str, *,
                     resolve: Callable[[str], list[str]] = _resolve) -> None:
    """Raise ValueError (one line, naming the setting) for an address other
    hosts could not use."""
    if is_wildcard(host):
        raise ValueError(f"advertised address {host or '(empty)'!r} is a wildcard: other "
                         f"hosts cannot connect to it; set {SETTING} to this host's address")
    if is_loopback(host, resolve) and metadata_is_remote(metadata_uri, resolve):
        raise ValueError(f"advertised address {host!r} is loopback but the metadata store "
                         f"({metadata_uri}) is on another host, so clients elsewhere would "
                         f"connect to themselves; set {SETTING} to an address they can reach")


def effective_host(cfg: BookieConfig, resolve: Optional[Callable[[str], list[str]]] = None,
                   route_source: Optional[Callable[[str], str]] = None) -> str:
    """``advertised_host`` + ``check_advertised`` for a BookieConfig."""
    kw: dict[str, Any] = {}
    if resolve is not None:
        kw["resolve"] = resolve
    extra: dict[str, Any] = {"route_source": route_source} if route_source else {}
    host = advertised_host(cfg.bind_address, cfg.advertised_address, cfg.metadata_uri, **kw, **extra)
    check_advertised(host, cfg.metadata_uri, **kw)
    return host
