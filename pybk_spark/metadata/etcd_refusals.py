"""What an etcd refusal means, and which setting fixes it.

Theory of operation:
  * etcd_errors.py is the one place etcd / gRPC failures become
    ``pybk_spark.errors``; for refusals it asks these two pure functions,
    which see only a gRPC status name and its detail text (no grpc import):
      - ``refusal_for_transport``: a channel that never came up - a TLS
        handshake failure (untrusted server certificate -> etcd_ca_file;
        refused client certificate -> etcd_cert_file / etcd_key_file), or a
        socket closed on a plaintext client (etcd serves TLS -> etcd_ca_file);
      - ``refusal_for_status``: an RPC etcd answered with PERMISSION_DENIED
        (the user's role lacks the key range), INVALID_ARGUMENT
        "authentication failed" (wrong password / deleted user), or a stale
        token (UNAUTHENTICATED, "auth store is old") -> ``StaleToken``, which
        the store answers by authenticating again and repeating the call.
  * Every refusal is ``MetadataUnauthorized`` (outcome known: nothing was
    applied), except the plaintext hint, which stays ``MetadataUnavailable``
    (a closed socket may also be a member going down).
"""
from __future__ import annotations

from pybk_spark import errors
from pybk_spark.metadata.security import EtcdSecurity


class StaleToken(errors.MetadataUnauthorized):
    """etcd no longer accepts our auth token (expired, or the auth store
    changed): authenticate again and repeat the call (it was not applied)."""


def refusal_for_transport(detail: str, sec: EtcdSecurity) -> errors.BKError | None:
    """The error for a channel that never came up (``detail``), else None."""
    low = detail.lower()
    if "handshake failed" in low:
        short = detail.split("handshake failed", 1)[1].strip(" :()")[:160]
        if "certificate_verify_failed" in low or "peer name" in low:
            return errors.MetadataUnauthorized(
                f"etcd's TLS certificate is not trusted ({short}): set etcd_ca_file to the "
                f"CA that signed etcd's --cert-file (now {sec.etcd_ca_file!r}), and give "
                "etcd a certificate naming the host in the metadata URI")
        if "certificate" in low or "alert" in low:
            return errors.MetadataUnauthorized(
                f"etcd refused this client's TLS certificate ({short}): etcd runs with "
                "--client-cert-auth; set etcd_cert_file and etcd_key_file to a certificate "
                "signed by etcd's --trusted-ca-file (now etcd_cert_file="
                f"{sec.etcd_cert_file!r})")
        return errors.MetadataUnauthorized(
            f"TLS handshake with etcd failed ({short}): check etcd_ca_file, etcd_cert_file "
            "and etcd_key_file, and that etcd serves TLS (https) on this endpoint")
    # a TLS server answers a plaintext HTTP/2 preface by closing the socket, with
    # an HTTP/1.x "400", or a reset, depending on timing
    if not sec.tls and any(m in low for m in ("socket closed", "http1.x", "connection reset",
                                               "end of file", "eof")):
        return errors.MetadataUnavailable(
            f"etcd unavailable: {detail} (if etcd serves TLS - https client URLs - "
            "set etcd_ca_file)")
    return None


def refusal_for_status(code: str, detail: str, sec: EtcdSecurity) -> errors.BKError | None:
    """The error for an RPC etcd refused with status ``code``, else None."""
    who = f"etcd user {sec.etcd_user!r}" if sec.etcd_user else "a client without etcd_user"
    if code == "PERMISSION_DENIED":
        return errors.MetadataUnauthorized(
            f"etcd: permission denied for {who} ({detail}): set etcd_user / "
            "etcd_password_file to a user whose role grants this key range "
            "(docs/operations.md, 'Securing etcd')")
    if code == "UNAUTHENTICATED" or "auth store is old" in detail:
        return StaleToken(f"etcd rejected the auth token of {who} ({detail})")
    if code == "INVALID_ARGUMENT" and "authentication failed" in detail:
        return errors.MetadataUnauthorized(
            f"etcd refused {who} ({detail}): the password in etcd_password_file "
            f"{sec.etcd_password_file!r} is wrong, or the user was deleted; fix etcd_user / "
            "etcd_password_file")
    if code == "INVALID_ARGUMENT" and "user name is empty" in detail:
        return errors.MetadataUnauthorized(
            f"etcd requires authentication ({detail}): set etcd_user and etcd_password_file")
    return None
