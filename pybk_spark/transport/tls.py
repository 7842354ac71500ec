"""Client TLS: credentials for gRPC channels and contexts for lane connections.

Theory of operation
-------------------
TLS is on for a client when ``tls_ca_file`` is set (client.conf, the Spark
option ``tls.caFile``, or ``conf=`` of ``BookKeeper``): then every
connection to every bookie is TLS, verified against that CA bundle, and a
client never falls back to plaintext.  ``tls_cert_file`` + ``tls_key_file``
are its own certificate, presented to bookies that want one (mutual TLS):
its subject common name or a subject alternative name is the identity the
bookie's roles are given to (protocol/access.py).

Host names.  A client reaches a bookie at the address the bookie registered
(``advertised_address``: usually an IP address), and checks the bookie's
certificate against it: a bookie certificate must carry that address as a
subject alternative name (an IP SAN for an IP address, a DNS SAN for a
name).  ``tls_server_name`` replaces the checked name for every bookie (one
certificate shared by all bookies, e.g. ``bookies.example``): gRPC's
``grpc.ssl_target_name_override`` and the lane's ``server_hostname``.

Failures.  A handshake that fails (an unknown CA, an expired certificate, a
name that does not match, a plaintext bookie) is ``errors.TlsError``, a
``BookieUnavailable``: the bookie is treated as unreachable by this client
(an ensemble change for an add), and the message says what to fix
(translated in wire/codes.py).  A bookie whose registration says ``tls``
while this client has no ``tls_ca_file`` (or the reverse) is refused before
any connection, naming the setting (transport/grpc_bookie.py).
"""
from __future__ import annotations

import ssl
from dataclasses import dataclass
from functools import cached_property
from typing import Optional

import grpc

from pybk_spark import errors
from pybk_spark.config import read_setting_file

TLS_SETTINGS = "tls_ca_file / tls_cert_file / tls_key_file / tls_server_name"


@dataclass(frozen=True)
class ClientTls:
    ca: bytes
    cert: Optional[bytes]
    key: Optional[bytes]
    ca_file: str
    cert_file: str = ""
    key_file: str = ""
    server_name: str = ""

    @classmethod
    def from_conf(cls, conf) -> Optional["ClientTls"]:
        """From a ClientConfig; None when ``tls_ca_file`` is empty (plaintext)."""
        if not conf.tls_ca_file:
            if conf.tls_cert_file or conf.tls_key_file:
                raise errors.IncorrectParameter(
                    "tls_cert_file / tls_key_file need tls_ca_file (the CA bundle bookie "
                    "certificates are verified against)")
            return None
        if bool(conf.tls_cert_file) != bool(conf.tls_key_file):
            raise errors.IncorrectParameter("a client certificate needs both tls_cert_file "
                                            "and tls_key_file")
        tls = cls(read_setting_file(conf.tls_ca_file, "tls_ca_file"),
                  read_setting_file(conf.tls_cert_file, "tls_cert_file") if conf.tls_cert_file else None,
                  read_setting_file(conf.tls_key_file, "tls_key_file") if conf.tls_key_file else None,
                  conf.tls_ca_file, conf.tls_cert_file, conf.tls_key_file,
                  conf.tls_server_name)
        tls.lane_context()          # a key that does not match its certificate: say so now
        return tls

    # -- gRPC ------------------------------------------------------------------------------
    def channel_credentials(self) -> grpc.ChannelCredentials:
        return grpc.ssl_channel_credentials(root_certificates=self.ca,
                                            private_key=self.key, certificate_chain=self.cert)

    def channel_options(self) -> list:
        return ([("grpc.ssl_target_name_override", self.server_name)]
                if self.server_name else [])

    # -- lane ----------------------------------------------------------------------------------
    @cached_property
    def context(self) -> ssl.SSLContext:
        """The lane's context, built once per client (loading a CA costs ms)."""
        return self.lane_context()

    def lane_context(self) -> ssl.SSLContext:
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        ctx.minimum_version = ssl.TLSVersion.TLSv1_2
        try:
            ctx.load_verify_locations(cadata=self.ca.decode("ascii", errors="replace"))
        except ssl.SSLError as exc:
            raise errors.IncorrectParameter(f"tls_ca_file = {self.ca_file}: {exc}") from None
        if self.cert_file:
            try:
                ctx.load_cert_chain(self.cert_file, self.key_file)
            except (OSError, ssl.SSLError) as exc:
                raise errors.IncorrectParameter(
                    f"tls_cert_file = {self.cert_file} / tls_key_file = {self.key_file}: "
                    f"{exc}") from None
        return ctx

    def server_hostname(self, host: str) -> str:
        return self.server_name or host
