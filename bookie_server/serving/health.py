"""Health and readiness of one bookie, for process supervisors and probes.

Two views of one ``Readiness`` state (``serving``, ``registered``,
``read_only``, ``stopping``), set by ``bookie_server.__main__``:

* HTTP on the metrics port (``metrics_port``), bound with the other ports
  before anything is written to the metadata store (HTTPS with
  ``metrics_tls``: server certificate only; each connection's handshake runs
  on its own request thread, bounded by ``_TLS_HANDSHAKE_S``, so a client
  that never finishes it holds up nobody):
    ``/metrics``  Prometheus text (the bookie's own registry);
    ``/health``   200 while the process answers (liveness);
    ``/ready``    200 when serving, registered (or standalone) and writable;
                  503 otherwise, the JSON body listing ``reasons``
                  (``starting``, ``not registered``, ``read-only``,
                  ``stopping``);
    ``/api/v1/...`` the admin API, when an ``admin`` object is given
                  (bookie_server/serving/admin_http.py).
* The standard gRPC health service (``grpc.health.v1.Health``) on the gRPC
  port, with these service names:
    ``""`` and ``pybk.wire.v1.Bookie``  SERVING while the bookie serves reads
                                         (from start of service until stop);
    ``bookie.writable``                  SERVING while it also takes adds
                                         (NOT_SERVING when read-only);
    ``bookie.ready``                     SERVING exactly when ``/ready`` is 200.
  Stopping sets every name NOT_SERVING before the registration is removed.
"""
from __future__ import annotations

import json
import socket
import ssl
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import TYPE_CHECKING, Any, Callable, Optional

from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

if TYPE_CHECKING:
    import grpc

    from bookie_server.serving.admin_http import AdminApi

SERVICE = "pybk.wire.v1.Bookie"
WRITABLE = "bookie.writable"
READY = "bookie.ready"


class Readiness:
    def __init__(self, needs_registration: bool = True):
        self._lock = threading.Lock()
        self._state = {"serving": False, "registered": not needs_registration,
                       "read_only": False, "stopping": False}
        self._listeners: list[Callable[["Readiness"], None]] = []

    def set(self, **changes: bool) -> None:
        with self._lock:
            self._state.update(changes)
            listeners = list(self._listeners)
        for listener in listeners:
            listener(self)

    def on_change(self, listener: Callable[["Readiness"], None]) -> None:
        self._listeners.append(listener)
        listener(self)

    def state(self) -> dict[str, Any]:
        with self._lock:
            return dict(self._state)

    def reasons(self) -> list[str]:
        s = self.state()
        out = []
        if s["stopping"]:
            out.append("stopping")
        elif not s["serving"]:
            out.append("starting")
        if not s["registered"]:
            out.append("not registered")
        if s["read_only"]:
            out.append("read-only")
        return out

    def alive(self) -> bool:
        s = self.state()
        return s["serving"] and not s["stopping"]

    def writable(self) -> bool:
        return self.alive() and not self.state()["read_only"]

    def ready(self) -> bool:
        return not self.reasons()


# -- HTTP -----------------------------------------------------------------------------------
_TLS_HANDSHAKE_S = 10.0


def serve_http(port: int, addr: str, registry: CollectorRegistry, readiness: Optional[Readiness],
               admin: Optional[AdminApi] = None,
               tls_context: Optional[Callable[[], ssl.SSLContext]] = None) -> ThreadingHTTPServer:
    """Bind and serve ``/metrics``, ``/health``, ``/ready`` and, with
    ``admin`` (an ``admin_http.AdminApi``), ``/api/v1/...`` (OSError if the
    port is taken); returns the server (``shutdown()`` stops it).
    ``tls_context()``: the current ``ssl.SSLContext`` for HTTPS (asked per
    connection, so a reloaded certificate serves the next one)."""
    ready = readiness or Readiness(needs_registration=False)

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - http.server's name
            if admin is not None and admin.dispatch(self, "GET"):
                return
            path = self.path.split("?", 1)[0]
            if path == "/metrics":
                self._send(200, generate_latest(registry), CONTENT_TYPE_LATEST)
            elif path == "/health":
                self._json(200, {"alive": True})
            elif path == "/ready":
                reasons = ready.reasons()
                self._json(503 if reasons else 200,
                           {"ready": not reasons, "reasons": reasons, **ready.state()})
            else:
                self._json(404, {"error": f"no such path {path!r}: try /metrics, /health, "
                                          "/ready"})

        def do_PUT(self) -> None:  # noqa: N802
            if admin is None or not admin.dispatch(self, "PUT"):
                self._json(405, {"error": "only GET here (PUT: /api/v1/... admin routes)"})

        def _json(self, code: int, body: dict[str, Any]) -> None:
            self._send(code, json.dumps(body).encode(), "application/json")

        def _send(self, code: int, body: bytes, ctype: str) -> None:
            self.send_response(code)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: Any) -> None:   # probes poll often: no line per request
            pass

    class _Server(ThreadingHTTPServer):
        address_family = socket.AF_INET6 if ":" in addr else socket.AF_INET

        def finish_request(self, request: Any, client_address: Any) -> None:   # socketserver's types
            if tls_context is not None:
                request.settimeout(_TLS_HANDSHAKE_S)
                try:
                    tls = tls_context().wrap_socket(request, server_side=True)
                except (OSError, ssl.SSLError):
                    return             # not TLS, or too slow: closed by the caller
                try:
                    super().finish_request(tls, client_address)
                finally:
                    tls.close()
                return
            super().finish_request(request, client_address)

    server = _Server((addr, port), Handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, name="http-health", daemon=True).start()
    return server


# -- gRPC -----------------------------------------------------------------------------------
def add_grpc_health(server: grpc.Server, readiness: Readiness) -> Any:   # its HealthServicer
    """Register ``grpc.health.v1.Health`` on ``server`` (before it starts),
    its statuses following ``readiness``."""
    servicer = health.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(servicer, server)
    serving, not_serving = (health_pb2.HealthCheckResponse.SERVING,
                            health_pb2.HealthCheckResponse.NOT_SERVING)

    def update(r: Readiness) -> None:
        for name, ok in (("", r.alive()), (SERVICE, r.alive()), (WRITABLE, r.writable()),
                         (READY, r.ready())):
            servicer.set(name, serving if ok else not_serving)

    readiness.on_change(update)
    return servicer
