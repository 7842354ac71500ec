"""Options that become client settings: ``bk.<key>``, TLS to the bookies
and the operator flag.  Pure.

    .option("bk.read_timeout_s", "20")               # any conf/client.conf key
    .option("tls.caFile", "/etc/pybk/ca.pem")        # TLS on (never plaintext)
    .option("tls.certFile", "/etc/pybk/client.pem")  # client certificate (mutual TLS)
    .option("tls.keyFile", "/etc/pybk/client-key.pem")
    .option("tls.serverName", "bookies.example")     # instead of the registered address
    .option("operator", "true")                      # admin jobs only

The TLS options become the client settings ``tls_ca_file``,
``tls_cert_file``, ``tls_key_file``, ``tls_server_name`` and ``operator``
(conf/client.conf, pybk_spark/transport/tls.py) of every client the data
source opens, on the driver and in every task: the files must exist at the
same paths on every executor.  :func:`client_overrides` parses both kinds
into one tuple of (setting, value) pairs, hashable and picklable, carried by
ReadOptions / WriteOptions as ``client_conf``.
"""
from __future__ import annotations

from typing import Mapping, Optional

from pybk_spark import errors
from pybk_spark.config import ClientConfig
from pybk_spark.spark.option_values import option, parse_bool

CLIENT_PREFIX = "bk."        # bk.<client.conf key>: client settings, valid for every operation

TLS_OPTIONS = (("tls.caFile", "tls_ca_file"), ("tls.certFile", "tls_cert_file"),
               ("tls.keyFile", "tls_key_file"), ("tls.serverName", "tls_server_name"),
               ("operator", "operator"))
KNOWN_TLS_OPTIONS = tuple(name for name, _ in TLS_OPTIONS)

ClientSettings = tuple[tuple[str, str], ...]


def parse_client_options(options: Mapping[str, str]) -> ClientSettings:
    """The client settings the TLS / operator options name: ((setting, value), ...)."""
    out = []
    for name, setting in TLS_OPTIONS:
        value = option(options, name)
        if setting == "operator" and value is not None:     # a boolean: true/false only
            value = "true" if parse_bool(name, value, False) else "false"
        if value is None or not str(value).strip():
            continue
        out.append((setting, str(value).strip()))
    have = dict(out)
    if (have.get("tls_cert_file") or have.get("tls_key_file")) and not have.get("tls_ca_file"):
        raise errors.IncorrectParameter("options 'tls.certFile' / 'tls.keyFile' need "
                                        "'tls.caFile' (the CA bundle of the bookies' certificates)")
    if bool(have.get("tls_cert_file")) != bool(have.get("tls_key_file")):
        raise errors.IncorrectParameter("a client certificate needs both options 'tls.certFile' "
                                        "and 'tls.keyFile'")
    return tuple(out)


def client_settings(options: Mapping[str, str]) -> ClientSettings:
    """``bk.<key>`` options -> sorted ``(key, value)`` ClientConfig overrides,
    each key and value checked now (conf/client.conf documents the keys)."""
    out = {}
    for key, value in options.items():
        lowered = str(key).lower()
        if not lowered.startswith(CLIENT_PREFIX):
            continue
        out[lowered[len(CLIENT_PREFIX):]] = str(value).strip()
    valid = sorted(f for f in ClientConfig.__dataclass_fields__)
    for key, value in out.items():
        try:
            ClientConfig().with_overrides({key: value})
        except errors.IncorrectParameter:
            if key not in valid:
                close = errors.close_matches(key, valid, n=2)
                hint = f"; did you mean {' or '.join(repr('bk.' + c) for c in close)}?" \
                    if close else "; valid keys: " + ", ".join(valid)
                raise errors.IncorrectParameter(
                    f"option 'bk.{key}': unknown client setting{hint} "
                    "(conf/client.conf documents them)") from None
            raise errors.IncorrectParameter(
                f"option 'bk.{key}': bad value {value!r} (conf/client.conf documents "
                "the setting)") from None
    return tuple(sorted(out.items()))


def client_overrides(options: Mapping[str, str]) -> ClientSettings:
    """Every ClientConfig override the options carry: ``bk.<key>`` and the
    TLS / operator options.  One setting given both ways with different
    values is refused, naming both options."""
    merged = dict(client_settings(options))
    for key, value in parse_client_options(options):
        if key in merged and merged[key] != value:
            raise errors.IncorrectParameter(
                f"options 'bk.{key}' and its TLS option give different values "
                f"({merged[key]!r} and {value!r}); set one")
        merged[key] = value
    return tuple(sorted(merged.items()))


def client_conf(client: ClientSettings) -> Optional[dict[str, str]]:
    """``conf=`` for ``BookKeeper`` (None: the defaults)."""
    return dict(client) if client else None
