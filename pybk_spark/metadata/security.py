"""How a process authenticates to etcd: TLS files and an etcd user.

Theory of operation:
  * One vocabulary, five settings, spelt the same everywhere - conf keys in
    conf/client.conf and conf/bookie.conf, query parameters of the metadata
    URI (``etcd://h:2379/pybk?etcd_ca_file=/etc/pybk/ca.pem&etcd_user=client
    &etcd_password_file=/etc/pybk/client.pw``), and the error messages:
      etcd_ca_file        CA bundle that signed etcd's --cert-file; set = TLS
      etcd_cert_file      client certificate (etcd --client-cert-auth)
      etcd_key_file       its private key (both or neither)
      etcd_user           etcd user (etcd RBAC; docs/operations.md)
      etcd_password_file  file holding that user's password (first line)
  * A password never travels in a URI or on a command line: only the path of
    a file holding it (``etcd_password`` in a URI is refused).
  * The URI form reaches every place that only has a URI (Spark executors,
    ``pybk`` commands, jobs); conf keys suit long-lived processes.  Both may
    be given: they merge, and the same setting with two different values is
    an error naming it.
  * Pure: parsing and validation only.  Files are read when the store opens
    (``password()``); every error names the setting to fix.
"""
from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Mapping
from urllib.parse import parse_qsl, quote

from pybk_spark import errors
from pybk_spark.config import read_setting_file

SETTINGS = ("etcd_ca_file", "etcd_cert_file", "etcd_key_file", "etcd_user",
            "etcd_password_file")


@dataclass(frozen=True)
class EtcdSecurity:
    etcd_ca_file: str = ""
    etcd_cert_file: str = ""
    etcd_key_file: str = ""
    etcd_user: str = ""
    etcd_password_file: str = ""

    # -- construction ---------------------------------------------------------
    @classmethod
    def from_mapping(cls, values: Mapping[str, object], *, where: str = "") -> "EtcdSecurity":
        """The etcd_* entries of ``values`` (other keys ignored); validated."""
        out = cls(**{k: str(values.get(k) or "").strip() for k in SETTINGS})
        out.validate(where)
        return out

    @classmethod
    def from_config(cls, conf) -> "EtcdSecurity":
        """From a ClientConfig / BookieConfig (their etcd_* attributes)."""
        return cls.from_mapping({k: getattr(conf, k, "") for k in SETTINGS}, where="conf")

    @classmethod
    def from_query(cls, query: str) -> "EtcdSecurity":
        """From a metadata URI's query string; unknown parameters are refused."""
        values: dict[str, str] = {}
        for key, value in parse_qsl(query, keep_blank_values=True, strict_parsing=False):
            if key == "etcd_password":
                raise errors.IncorrectParameter(
                    "a password does not belong in the metadata URI: put it in a file "
                    "and pass etcd_password_file=<path>")
            if key not in SETTINGS:
                raise errors.IncorrectParameter(
                    f"unknown metadata URI parameter {key!r} (known: {', '.join(SETTINGS)})")
            values[key] = value
        return cls.from_mapping(values, where="metadata URI")

    def merged(self, other: "EtcdSecurity | None") -> "EtcdSecurity":
        """Both sources together; the same setting set differently is an error."""
        if other is None:
            return self
        values = {}
        for k in SETTINGS:
            a, b = getattr(self, k), getattr(other, k)
            if a and b and a != b:
                raise errors.IncorrectParameter(
                    f"{k} given twice with different values ({a!r} in the metadata URI, "
                    f"{b!r} in the conf): keep one")
            values[k] = a or b
        return EtcdSecurity.from_mapping(values)

    # -- views ----------------------------------------------------------------
    @property
    def tls(self) -> bool:
        return bool(self.etcd_ca_file or self.etcd_cert_file)

    @property
    def empty(self) -> bool:
        return not any(getattr(self, f.name) for f in fields(self))

    def query(self) -> str:
        """The URI query form ("" when nothing is set)."""
        return "&".join(f"{k}={quote(getattr(self, k), safe='/')}" for k in SETTINGS
                        if getattr(self, k))

    def validate(self, where: str = "") -> None:
        src = f" ({where})" if where else ""
        if bool(self.etcd_cert_file) != bool(self.etcd_key_file):
            raise errors.IncorrectParameter(
                f"etcd_cert_file and etcd_key_file go together: set both or neither{src}")
        if bool(self.etcd_user) != bool(self.etcd_password_file):
            raise errors.IncorrectParameter(
                f"etcd_user and etcd_password_file go together: set both or neither{src}")

    def password(self) -> str:
        """The first line of ``etcd_password_file``; IncorrectParameter naming it."""
        try:
            with open(self.etcd_password_file, encoding="utf-8") as fh:
                text = fh.readline().rstrip("\r\n")
        except OSError as exc:
            raise errors.IncorrectParameter(
                f"cannot read etcd_password_file {self.etcd_password_file!r}: "
                f"{exc.strerror or exc}") from None
        if not text:
            raise errors.IncorrectParameter(
                f"etcd_password_file {self.etcd_password_file!r} is empty")
        return text

    def read_file(self, setting: str) -> bytes | None:
        """The bytes of the file ``setting`` names (None when unset)."""
        path = getattr(self, setting)
        return read_setting_file(path, setting) if path else None
