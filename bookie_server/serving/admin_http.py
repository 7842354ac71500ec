"""The bookie's admin HTTP API: ``/api/v1/...`` on the metrics port.

Names follow BookKeeper's REST API (bookkeeper-server ``.../server/http``);
bodies are typed JSON in this project's snake_case (docs/operations.md,
"Admin HTTP API", has the table of routes and shapes):

  GET  /api/v1/bookie/state                 serving, registered, read_only (+ why), stopping
  GET  /api/v1/bookie/state/readonly        {"read_only": bool, "admin_read_only": bool}
  PUT  /api/v1/bookie/state/readonly        body {"read_only": bool}: the operator's switch
  PUT  /api/v1/bookie/gc                    run the ledger GC now (answers at once)
  GET  /api/v1/bookie/gc                    {"is_in_force_gc": bool}
  GET  /api/v1/bookie/gc_details            the GC's runs (last start/end, deleted ledgers)
  GET  /api/v1/bookie/info                  ledger count, disk usage, journal position,
                                            checkpoint, lost (damaged) ranges
  GET  /api/v1/bookie/cluster_info          bookies registered / read-only / missing,
                                            autorecovery leader and switch (from etcd)
  GET  /api/v1/autorecovery/status          autorecovery switches + leader (from etcd)
  PUT  /api/v1/autorecovery/status          body {"enabled": bool}
  PUT  /api/v1/autorecovery/trigger_audit   ask the autorecovery leader for a round now
  GET|PUT /api/v1/autorecovery/lost_bookie_recovery_delay
                                            body {"delay_seconds": float | null}

Authorization (``auth``, bookie_server/tls.admin_policy): when the HTTP
port speaks TLS and asks for client certificates (``metrics_tls`` with
``tls_client_auth`` required or optional), every route checks the caller's
certificate with protocol/access.admin_refusal, the rule the gRPC and lane
ports use for roles: ``PUT`` routes need the operator role, ``GET`` routes
an identity with a role; 401 ``unauthenticated`` (no certificate) or 403
``forbidden`` (not the role), the body naming what is ``missing``.  Loopback
peers get no free pass then.  Otherwise (plain HTTP, or no client
certificates) nobody can be authenticated and the routes answer only
loopback peers (403 otherwise) unless ``admin_http_allow_remote = true``.
The API object exists before the bookie (ports are bound first): until
``attach`` the routes answer 503 ``starting``.  Errors are JSON
``{"error": ..., "message": ...}`` with 400 (bad body), 401, 403, 404, 405, 503
(starting, standalone, metadata store unavailable).  A request never
crashes the bookie.
"""
from __future__ import annotations

import ipaddress
import json
import logging
import os
import socket
import time
from typing import TYPE_CHECKING, Any, Callable, Optional, TypeVar

from bookie_server.checkpoint_file import CHECKPOINT
from bookie_server.serving.tls import cert_peer
from pybk_spark import errors
from pybk_spark.metadata import audit_control as ctl
from pybk_spark.metadata import keys
from pybk_spark.protocol import access

if TYPE_CHECKING:
    from http.server import BaseHTTPRequestHandler

    from bookie_server.background import GarbageCollector
    from bookie_server.bookie import Bookie
    from bookie_server.serving.health import Readiness
    from pybk_spark.metadata.store import MetadataStore

log = logging.getLogger("bookie.admin_http")
T = TypeVar("T")
PREFIX = "/api/v1/"


class HttpError(Exception):
    def __init__(self, code: int, error: str, message: str, **extra: object) -> None:
        super().__init__(message)
        self.code, self.error, self.extra = code, error, extra


def is_loopback(host: str) -> bool:
    try:
        ip = ipaddress.ip_address(host.split("%", 1)[0])
    except ValueError:
        return False
    mapped = getattr(ip, "ipv4_mapped", None)
    return (mapped or ip).is_loopback


class AdminApi:
    def __init__(self, *, allow_remote: bool = False, auth: Optional[access.Policy] = None,
                 clock: Callable[[], float] = time.time):
        self.allow_remote = allow_remote
        self.auth = auth                # roles checked per request (None: loopback rule)
        self.clock = clock
        self.bookie: Any = None
        self.bookie_id = ""
        self.store: Optional[MetadataStore] = None
        self.gc: Optional[GarbageCollector] = None
        self.readiness: Optional[Readiness] = None
        self.disk_full: Callable[[], bool] = lambda: False
        self._routes = {
            ("GET", "bookie/state"): self._state,
            ("GET", "bookie/state/readonly"): self._readonly_get,
            ("PUT", "bookie/state/readonly"): self._readonly_put,
            ("PUT", "bookie/gc"): self._gc_put,
            ("GET", "bookie/gc"): self._gc_get,
            ("GET", "bookie/gc_details"): self._gc_details,
            ("GET", "bookie/info"): self._info,
            ("GET", "bookie/cluster_info"): self._cluster_info,
            ("GET", "autorecovery/status"): self._ar_status,
            ("PUT", "autorecovery/status"): self._ar_status_put,
            ("PUT", "autorecovery/trigger_audit"): self._ar_trigger,
            ("GET", "autorecovery/lost_bookie_recovery_delay"): self._ar_delay_get,
            ("PUT", "autorecovery/lost_bookie_recovery_delay"): self._ar_delay_put,
        }

    def attach(self, bookie: Bookie, bookie_id: str, store: Optional[MetadataStore] = None,
               gc: Optional[GarbageCollector] = None, readiness: Optional[Readiness] = None,
               disk_full: Optional[Callable[[], bool]] = None) -> None:
        self.bookie_id, self.store, self.gc, self.readiness = bookie_id, store, gc, readiness
        if disk_full is not None:
            self.disk_full = disk_full
        self.bookie = bookie            # last: routes need everything above

    # -- HTTP glue (called by health.py's handler) ---------------------------------------
    def dispatch(self, handler: Any, method: str) -> bool:    # health.py's Handler
        """Answer ``handler``'s request if it is an admin route; False if not."""
        path = handler.path.split("?", 1)[0]
        if not path.startswith(PREFIX):
            return False
        try:
            length = int(handler.headers.get("Content-Length") or 0)
            body = handler.rfile.read(length) if length > 0 else b""
            code, doc = self.handle(method, path, body, handler.client_address[0],
                                    _peer_of(handler))
        except Exception as exc:  # noqa: BLE001 - a request never kills the bookie
            log.exception("event=admin_http_error path=%s", path)
            code, doc = 500, {"error": "internal", "message": f"{type(exc).__name__}: {exc}"}
        handler._json(code, doc)
        return True

    def handle(self, method: str, path: str, body: bytes, peer: str,
               identity: access.Peer = access.ANONYMOUS) -> tuple[int, dict[str, Any]]:
        try:
            if self.auth is not None:
                refusal = access.admin_refusal(self.auth, identity, mutating=method != "GET")
                if refusal is not None:
                    raise HttpError(401 if refusal.reason == "unauthenticated" else 403,
                                    refusal.reason, refusal.message, missing=refusal.missing)
            elif not self.allow_remote and not is_loopback(peer):
                raise HttpError(403, "forbidden", f"admin API answers loopback peers only, not "
                                f"{peer}; set admin_http_allow_remote = true in bookie.conf "
                                "to allow remote peers (callers are authenticated only over "
                                "HTTPS with client certificates: metrics_tls = true)")
            route = path[len(PREFIX):].rstrip("/")
            fn = self._routes.get((method, route))
            if fn is None:
                allowed = sorted(m for m, r in self._routes if r == route)
                if allowed:
                    raise HttpError(405, "method_not_allowed",
                                    f"{method} {path}: use {' or '.join(allowed)}")
                raise HttpError(404, "not_found", f"no admin route {path}; see "
                                "docs/operations.md, 'Admin HTTP API'")
            if self.bookie is None:
                raise HttpError(503, "starting", "the bookie is still starting")
            return 200, fn(_body(body) if method == "PUT" else {})
        except HttpError as exc:
            return exc.code, {"error": exc.error, "message": str(exc), **exc.extra}
        except errors.MetadataError as exc:
            return 503, {"error": "metadata_unavailable", "message": f"{type(exc).__name__}: "
                         f"{exc}"}
        except errors.BKError as exc:
            return 400, {"error": type(exc).__name__, "message": str(exc)}

    # -- bookie ---------------------------------------------------------------------------
    def _state(self, _body: dict[str, Any]) -> dict[str, Any]:
        b = self.bookie
        st: dict[str, Any] = self.readiness.state() if self.readiness is not None else {}
        why = None
        if b.read_only:
            why = ("storage failed" if b.io_error is not None else
                   "admin" if b.admin_read_only else "disk full")
        return {"bookie_id": self.bookie_id, "serving": bool(st.get("serving", True)),
                "registered": bool(st.get("registered", False)), "read_only": b.read_only,
                "read_only_reason": why, "stopping": bool(st.get("stopping", False))}

    def _readonly_get(self, _body: dict[str, Any]) -> dict[str, Any]:
        return {"read_only": self.bookie.read_only, "admin_read_only": self.bookie.admin_read_only}

    def _readonly_put(self, body: dict[str, Any]) -> dict[str, Any]:
        value = _field(body, "read_only", bool)
        self.bookie.set_admin_read_only(value, disk_full=self.disk_full())
        log.warning("event=admin_read_only value=%s", value)
        return self._readonly_get({})

    def _gc_put(self, _body: dict[str, Any]) -> dict[str, Any]:
        if self.gc is None:
            raise HttpError(503, "standalone", "no ledger GC: the bookie runs without a "
                            "metadata store (metadata_uri)")
        self.gc.trigger()
        return {"triggered": True}

    def _gc_status(self) -> dict[str, Any]:
        if self.gc is None:
            raise HttpError(503, "standalone", "no ledger GC: the bookie runs without a "
                            "metadata store (metadata_uri)")
        return self.gc.status()

    def _gc_get(self, _body: dict[str, Any]) -> dict[str, Any]:
        st = self._gc_status()
        return {"is_in_force_gc": bool(st["running"] or st["forced_pending"])}

    def _gc_details(self, _body: dict[str, Any]) -> dict[str, Any]:
        return self._gc_status()

    def _info(self, _body: dict[str, Any]) -> dict[str, Any]:
        b = self.bookie
        free, total = b.disk_usage()
        applied = b.applied_position
        ckpt = _checkpoint_of(b)
        return {"bookie_id": self.bookie_id, "ledger_count": len(b.ledger_ids()),
                "free_bytes": free, "total_bytes": total,
                "disk_usage": round((total - free) / total, 4) if total else None,
                "journal_position": {"seq": applied.seq, "offset": applied.offset},
                "checkpoint": ckpt,
                "lost_ranges": [{"ledger": l, "first": f, "last": t}
                                for l, f, t in b.lost.ranges()],
                "lost_unattributed": bool(b.lost.unattributed),
                "read_only": b.read_only, "host": socket.gethostname()}

    # -- autorecovery (etcd) -----------------------------------------------------------------
    def _need_store(self) -> MetadataStore:
        if self.store is None:
            raise HttpError(503, "standalone", "no metadata store: the bookie runs standalone "
                            "(metadata_uri is empty)")
        return self.store

    def _ar_status(self, _body: dict[str, Any]) -> dict[str, Any]:
        return ctl.status(self._need_store())

    def _cluster_info(self, _body: dict[str, Any]) -> dict[str, Any]:
        """BookKeeper's ClusterInfoService, from the registry, cookies and audit keys."""
        store = self._need_store()
        writable = {k.rsplit("/", 1)[1] for k, _ in store.list_prefix(keys.bookies_prefix("writable"))}
        readonly = {k.rsplit("/", 1)[1] for k, _ in store.list_prefix(keys.bookies_prefix("readonly"))}
        known = {k.rsplit("/", 1)[1] for k, _ in store.list_prefix(keys.COOKIES_PREFIX)}
        damaged = sorted(k.rsplit("/", 1)[1] for k, _ in store.list_prefix(keys.DAMAGED_PREFIX))
        st = ctl.status(store)
        return {"auditor_elected": st["leader"] is not None, "auditor_id": st["leader"],
                "autorecovery_enabled": st["enabled"],
                "total_bookies": len(known | writable | readonly),
                "writable_bookies": len(writable), "readonly_bookies": len(readonly),
                "unavailable_bookies": sorted(known - writable - readonly),
                "damaged_bookies": damaged}

    def _ar_status_put(self, body: dict[str, Any]) -> dict[str, Any]:
        store = self._need_store()
        ctl.set_enabled(store, _field(body, "enabled", bool))
        return ctl.status(store)

    def _ar_trigger(self, _body: dict[str, Any]) -> dict[str, Any]:
        version = ctl.trigger(self._need_store(), self.clock(), f"bookie {self.bookie_id}")
        return {"triggered": True, "version": version}

    def _ar_delay_get(self, _body: dict[str, Any]) -> dict[str, Any]:
        conf = ctl.read_config(self._need_store())
        return {"delay_seconds": conf["lost_bookie_recovery_delay_s"]}

    def _ar_delay_put(self, body: dict[str, Any]) -> dict[str, Any]:
        if "delay_seconds" not in body:
            raise HttpError(400, "bad_request", 'body must be {"delay_seconds": number | null}')
        value = body["delay_seconds"]
        if value is not None and (isinstance(value, bool) or
                                  not isinstance(value, (int, float))):
            raise HttpError(400, "bad_request", "delay_seconds must be a number or null")
        conf = ctl.set_lost_bookie_delay(self._need_store(),
                                         None if value is None else float(value))
        return {"delay_seconds": conf["lost_bookie_recovery_delay_s"]}


def _peer_of(handler: BaseHTTPRequestHandler) -> access.Peer:
    """Identities of the request's verified client certificate (TLS only)."""
    getpeercert = getattr(handler.connection, "getpeercert", None)
    if getpeercert is None:
        return access.ANONYMOUS
    try:
        return cert_peer(getpeercert())
    except ValueError:                 # handshake not done: no identity
        return access.ANONYMOUS


def _body(raw: bytes) -> dict[str, Any]:
    try:
        doc = json.loads(raw or b"{}")
    except ValueError:
        raise HttpError(400, "bad_request", "the body is not JSON") from None
    if not isinstance(doc, dict):
        raise HttpError(400, "bad_request", "the body must be a JSON object")
    return doc


def _field(body: dict[str, Any], name: str, kind: type[T]) -> T:
    value = body.get(name)
    if not isinstance(value, kind):
        raise HttpError(400, "bad_request", f'body must be {{"{name}": {kind.__name__}}}')
    return value


def _checkpoint_of(bookie: Bookie) -> Optional[dict[str, Any]]:
    try:
        with open(os.path.join(bookie.data_dir, CHECKPOINT), encoding="utf-8") as fh:
            doc = json.load(fh)
        return {"seq": int(doc["journal_seq"]), "offset": int(doc["journal_offset"]),
                "generation": int(doc["generation"])}
    except (OSError, ValueError, KeyError):
        return None
