"""Every port a bookie listens on, bound first: gRPC, add lane, metrics.

A bookie binds its ports right after locking its data dir and before it
writes anything to the metadata store (cookie, registration), so a start
that fails on a taken port leaves nothing behind: no cookie, no
registration, no "lost bookie" for the auditor.  A taken port is reported
as ``errors.PortInUse`` naming the port and the setting that chose it.

The gRPC port is probed with a plain socket first (same SO_REUSEADDR as
gRPC), so the common case is refused without gRPC's C-level error line;
gRPC's own bind failure is still caught (the port may be taken in between).
"""
from __future__ import annotations

import errno
import socket
from dataclasses import dataclass
from typing import TYPE_CHECKING, Optional

from bookie_server.config import BookieConfig
from bookie_server.serving.lane_server import bind_listener
from bookie_server.serving.service import bind_server
from pybk_spark import errors

if TYPE_CHECKING:
    from http.server import ThreadingHTTPServer

    import grpc

    from bookie_server.serving.admin_http import AdminApi
    from bookie_server.serving.health import Readiness
    from bookie_server.serving.metrics import BookieMetrics
    from bookie_server.serving.tls import ServerTls


@dataclass
class Listeners:
    server: grpc.Server                 # bound, no service yet, not started
    port: int
    lane_listener: Optional[socket.socket]
    metrics_port: int                   # 0 = none
    http: Optional[ThreadingHTTPServer] = None     # the metrics/health/ready HTTP server, if any


def bind_all(cfg: BookieConfig, metrics: BookieMetrics, readiness: Optional[Readiness] = None,
             admin: Optional[AdminApi] = None, tls: Optional[ServerTls] = None) -> Listeners:
    """Bind gRPC (``port``), the add lane (``add_lane_port``) and the
    HTTP endpoint (``metrics_port``: Prometheus ``/metrics``, ``/health``,
    ``/ready`` from ``readiness``, the admin API ``admin``; serving at once,
    over HTTPS with ``metrics_tls``).  ``tls``: the bookie_server.serving.tls.ServerTls
    of a TLS bookie (gRPC is bound with its credentials; the lane wraps each
    connection it accepts).  Raises ``errors.PortInUse``; on failure nothing
    stays bound."""
    _probe(cfg.bind_address, cfg.port, "port / --port")
    try:
        server, port = bind_server(cfg, tls)
    except OSError as exc:
        raise _in_use(cfg.bind_address, cfg.port, "port / --port", exc) from None
    lane = http = None
    try:
        if cfg.add_lane_port >= 0:
            try:
                lane = bind_listener(cfg)
            except OSError as exc:
                raise _in_use(cfg.bind_address, cfg.add_lane_port,
                              "add_lane_port / --add-lane-port", exc) from None
        if cfg.metrics_port:
            try:
                http = metrics.serve(cfg.metrics_port, cfg.bind_address, readiness, admin,
                                     tls.http_context if tls is not None and cfg.metrics_tls
                                     else None)
            except OSError as exc:
                raise _in_use(cfg.bind_address, cfg.metrics_port,
                              "metrics_port / --metrics-port", exc) from None
    except BaseException:
        if lane is not None:
            lane.close()
        server.stop(None)
        raise
    return Listeners(server, port, lane, cfg.metrics_port, http)


def _probe(address: str, port: int, setting: str) -> None:
    if port == 0:
        return
    family = socket.AF_INET6 if ":" in address else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((address, port))
        except OSError as exc:
            raise _in_use(address, port, setting, exc) from None


def _in_use(address: str, port: int, setting: str, exc: OSError) -> errors.PortInUse:
    why = "already in use" if getattr(exc, "errno", None) in (errno.EADDRINUSE, None) \
        else f"cannot be bound ({exc.strerror or exc})"
    return errors.PortInUse(f"port {port} on {address} (setting {setting}) is {why}; "
                            f"stop whatever holds it or choose another {setting.split()[0]}")
