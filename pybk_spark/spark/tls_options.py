"""Spark options for TLS to the bookies and the operator flag.  Pure.

    .option("tls.caFile", "/etc/pybk/ca.pem")        # TLS on (never plaintext)
    .option("tls.certFile", "/etc/pybk/client.pem")  # client certificate (mutual TLS)
    .option("tls.keyFile", "/etc/pybk/client-key.pem")
    .option("tls.serverName", "bookies.example")     # instead of the registered address
    .option("operator", "true")                      # admin jobs only

They become the client settings ``tls_ca_file``, ``tls_cert_file``,
``tls_key_file``, ``tls_server_name`` and ``operator`` (conf/client.conf,
pybk_spark/transport/tls.py) of every client the data source opens, on the
driver and in every task: the files must exist at the same paths on every
executor.  Parsed into a tuple of (setting, value) pairs, hashable and
picklable, carried by ReadOptions / WriteOptions as ``client``.
"""
from __future__ import annotations

from typing import Mapping, Optional

from pybk_spark import errors

TLS_OPTIONS = (("tls.caFile", "tls_ca_file"), ("tls.certFile", "tls_cert_file"),
               ("tls.keyFile", "tls_key_file"), ("tls.serverName", "tls_server_name"),
               ("operator", "operator"))
KNOWN_TLS_OPTIONS = tuple(name for name, _ in TLS_OPTIONS)


def parse_client_options(options: Mapping[str, str]) -> tuple:
    """The client settings the options name: ((setting, value), ...)."""
    from pybk_spark.spark.options import option, parse_bool
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


def client_conf(client: tuple) -> Optional[dict]:
    """``conf=`` for ``BookKeeper`` (None: the defaults)."""
    return dict(client) if client else None
