"""A bookie's TLS material: certificates for gRPC, the lane and HTTP, reloadable.

Theory of operation
-------------------
TLS is on when ``tls_cert_file`` is set (with ``tls_key_file``); then every
port of the bookie speaks TLS: gRPC (grpcio's SSL credentials), the lane
(``ssl.SSLContext``, wire/tls_socket.py) and, with ``metrics_tls``, the
HTTP endpoint (which asks for, but does not require, a client certificate:
probes have none; the admin API authorizes by it, :func:`admin_policy`).  Client certificates (``tls_client_auth``):

* ``required``: a client must present a certificate signed by a CA of
  ``tls_ca_file`` (mutual TLS), on gRPC and on the lane;
* ``optional``: the lane verifies a certificate when one is presented;
  gRPC does not ask for one (grpcio offers no "verify if presented" mode),
  so gRPC peers are anonymous: operators need ``required``;
* ``none``: no client certificates; every client is anonymous.

Identities (protocol/access.py) are the subject common name and the
subject alternative names of a verified client certificate, read from
``context.auth_context()`` on gRPC and ``getpeercert()`` on the lane.

Reload (SIGHUP, bookie_server/__main__.py): :meth:`ServerTls.reload` reads
the three files again and, if they make a working context, swaps it in:
new lane connections use the new ``SSLContext``; gRPC asks
:meth:`_fetch` before each new handshake and gets the new certificate
configuration once.  Connections already open keep theirs.  A reload that
fails (a missing file, a key that does not match its certificate) keeps
the old material and reports why, naming the setting.
"""
from __future__ import annotations

import logging
import ssl
import threading
from typing import TYPE_CHECKING, Any, Optional

import grpc

from pybk_spark import errors
from pybk_spark.config import read_setting_file
from pybk_spark.protocol import access

if TYPE_CHECKING:
    from bookie_server.config import BookieConfig

log = logging.getLogger("bookie.tls")

CLIENT_AUTH_MODES = ("required", "optional", "none")


class TlsConfigError(ValueError):
    """Bad TLS settings or files; the message names the setting."""


def _read(path: str, setting: str) -> bytes:
    try:
        return read_setting_file(path, setting)
    except errors.IncorrectParameter as exc:     # start-up's error for bad TLS settings
        raise TlsConfigError(str(exc)) from None


def validate(cfg: BookieConfig) -> None:
    """Config-level checks (no file access)."""
    if not cfg.tls_cert_file and not cfg.tls_key_file:
        if cfg.metrics_tls:
            raise TlsConfigError("metrics_tls = true needs tls_cert_file and tls_key_file")
        return
    if not (cfg.tls_cert_file and cfg.tls_key_file):
        raise TlsConfigError("TLS needs both tls_cert_file and tls_key_file")
    if cfg.tls_client_auth not in CLIENT_AUTH_MODES:
        raise TlsConfigError(f"tls_client_auth must be one of {', '.join(CLIENT_AUTH_MODES)}, "
                             f"not {cfg.tls_client_auth!r}")
    if cfg.tls_client_auth != "none" and not cfg.tls_ca_file:
        raise TlsConfigError(f"tls_client_auth = {cfg.tls_client_auth} needs tls_ca_file "
                             "(the CA bundle client certificates are verified against)")
    if cfg.tls_client_auth != "none" and cfg.admin_http_allow_remote and not cfg.metrics_tls:
        raise TlsConfigError("admin_http_allow_remote = true on a bookie with client "
                             "certificates needs metrics_tls = true: over plain HTTP the admin "
                             "API cannot tell an operator from anyone else")


def admin_policy(cfg: BookieConfig) -> Optional[access.Policy]:
    """The roles the admin HTTP API checks (access.admin_refusal), or None
    when its port does not authenticate clients (plain HTTP, or no client
    certificates): then only the loopback rule applies."""
    if cfg.tls_cert_file and cfg.metrics_tls and cfg.tls_client_auth != "none":
        return policy_of(cfg)
    return None


def policy_of(cfg: BookieConfig) -> access.Policy:
    return access.Policy(tls=bool(cfg.tls_cert_file),
                         writers=access.parse_identities(cfg.tls_writer_identities),
                         operators=access.parse_identities(cfg.tls_operator_identities))


class ServerTls:
    def __init__(self, cfg: BookieConfig) -> None:
        validate(cfg)
        self.cfg = cfg
        self._lock = threading.Lock()
        self._generation = 0
        self._served_generation = 0         # what gRPC's fetcher last handed out
        self._load(cfg)

    def _load(self, cfg: BookieConfig) -> None:
        cert = _read(cfg.tls_cert_file, "tls_cert_file")
        key = _read(cfg.tls_key_file, "tls_key_file")
        ca = _read(cfg.tls_ca_file, "tls_ca_file") if cfg.tls_ca_file else None
        ctx = self._lane_context(cfg)
        grpc_config = grpc.ssl_server_certificate_configuration([(key, cert)],
                                                                root_certificates=ca)
        http_ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        http_ctx.minimum_version = ssl.TLSVersion.TLSv1_2
        http_ctx.load_cert_chain(cfg.tls_cert_file, cfg.tls_key_file)
        if ca is not None and cfg.tls_client_auth != "none":
            # asked, not required: probes (/health, /ready, /metrics) come without one;
            # the admin API checks the identity (access.admin_refusal)
            http_ctx.load_verify_locations(cadata=ca.decode())
            http_ctx.verify_mode = ssl.CERT_OPTIONAL
        with self._lock:
            self.cfg = cfg
            self._context, self._http_context = ctx, http_ctx
            self._grpc_config = grpc_config
            self._generation += 1

    @staticmethod
    def _lane_context(cfg: BookieConfig) -> ssl.SSLContext:
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.minimum_version = ssl.TLSVersion.TLSv1_2
        try:
            ctx.load_cert_chain(cfg.tls_cert_file, cfg.tls_key_file)
        except (OSError, ssl.SSLError) as exc:
            raise TlsConfigError(f"tls_cert_file = {cfg.tls_cert_file} / tls_key_file = "
                                 f"{cfg.tls_key_file}: {exc}") from None
        if cfg.tls_ca_file:
            try:
                ctx.load_verify_locations(cafile=cfg.tls_ca_file)
            except (OSError, ssl.SSLError) as exc:
                raise TlsConfigError(f"tls_ca_file = {cfg.tls_ca_file}: {exc}") from None
        ctx.verify_mode = {"required": ssl.CERT_REQUIRED, "optional": ssl.CERT_OPTIONAL,
                           "none": ssl.CERT_NONE}[cfg.tls_client_auth]
        return ctx

    def reload(self, cfg: Optional[BookieConfig] = None) -> None:
        """Read the files again (of ``cfg``, or the current settings); keep
        the old material and raise TlsConfigError if they do not work."""
        cfg = cfg or self.cfg
        validate(cfg)
        self._load(cfg)
        log.info("event=tls_reloaded cert=%s generation=%d", cfg.tls_cert_file, self._generation)

    # -- the three servers ------------------------------------------------------------------
    def lane_context(self) -> ssl.SSLContext:
        with self._lock:
            return self._context

    def http_context(self) -> ssl.SSLContext:
        with self._lock:
            return self._http_context

    def grpc_credentials(self) -> grpc.ServerCredentials:
        with self._lock:
            initial = self._grpc_config
            self._served_generation = self._generation
        return grpc.dynamic_ssl_server_credentials(
            initial, self._fetch,    # type: ignore[arg-type]  # None: keep the current one
            require_client_authentication=self.cfg.tls_client_auth == "required")

    def _fetch(self) -> Optional[grpc.ServerCertificateConfiguration]:
        """gRPC, before each handshake: the new configuration after a reload, else None."""
        with self._lock:
            if self._served_generation == self._generation:
                return None
            self._served_generation = self._generation
            return self._grpc_config


# -- identities -------------------------------------------------------------------------------
def grpc_peer(context: grpc.ServicerContext) -> access.Peer:
    """Identities of a gRPC peer: CN and SANs of its verified certificate."""
    try:
        auth = context.auth_context() or {}
    except Exception:  # noqa: BLE001 - no auth context: anonymous
        return access.ANONYMOUS
    names = set()
    for key in ("x509_common_name", "x509_subject_alternative_name"):
        for v in auth.get(key, ()):
            names.add(v.decode(errors="replace") if isinstance(v, bytes) else str(v))
    return access.Peer(frozenset(names))


def cert_peer(cert: Optional[dict[str, Any]]) -> access.Peer:
    """Identities from ``SSLSocket.getpeercert()`` (empty when none was verified)."""
    if not cert:
        return access.ANONYMOUS
    names = set()
    for rdn in cert.get("subject", ()):
        for k, v in rdn:
            if k == "commonName":
                names.add(v)
    for _kind, v in cert.get("subjectAltName", ()):
        names.add(v)
    return access.Peer(frozenset(names))
