"""Client configuration: defaults, and a loader for conf/client.conf; the
conf-file syntax both conf files use (``conf_pairs``) and the read of a file
a setting names (``read_setting_file``: TLS and etcd files, client and
bookie alike)."""
from __future__ import annotations

from dataclasses import dataclass, fields, replace
from typing import Mapping

from pybk_spark import errors


def read_setting_file(path: str, setting: str) -> bytes:
    """The bytes of the file ``path`` that the setting ``setting`` names;
    IncorrectParameter naming the setting when it cannot be read."""
    try:
        with open(path, "rb") as fh:
            return fh.read()
    except OSError as exc:
        raise errors.IncorrectParameter(
            f"cannot read {setting} = {path}: {exc.strerror or exc}") from None


@dataclass(frozen=True)
class ClientConfig:
    add_timeout_s: float = 5.0
    read_timeout_s: float = 5.0
    metadata_timeout_s: float = 5.0
    speculative_read_timeout_ms: int = 500
    explicit_lac_interval_ms: int = 100
    add_batch_entries: int = 1000
    add_batch_bytes: int = 16 << 20
    max_inflight_adds: int = 64
    async_add_window: int = 8
    add_stream_idle_close_s: float = 30.0
    add_transport: str = "lane"
    read_transport: str = "lane"
    read_batch_entries: int = 1000
    read_batch_bytes: int = 16 << 20
    read_windows_in_flight: int = 3
    max_message_bytes: int = 64 << 20
    max_entry_size_bytes: int = 5 << 20
    add_overload_backoff_ms: int = 10
    add_overload_backoff_max_ms: int = 1000
    add_overload_retry_s: float = 60.0
    placement_policy: str = "random"
    writer_lease_ttl_s: int = 10
    metadata_retries: int = 100
    # TLS to bookies (pybk_spark/transport/tls.py): tls_ca_file set = TLS on
    tls_ca_file: str = ""
    tls_cert_file: str = ""
    tls_key_file: str = ""
    tls_server_name: str = ""
    # operator: recovery adds and fencing without ledger passwords (needs an
    # identity in the bookies' tls_operator_identities; protocol/access.py)
    operator: bool = False
    # etcd TLS / authentication (pybk_spark/metadata/security.py; also accepted
    # as query parameters of the metadata URI)
    etcd_ca_file: str = ""
    etcd_cert_file: str = ""
    etcd_key_file: str = ""
    etcd_user: str = ""
    etcd_password_file: str = ""

    def with_overrides(self, values: Mapping[str, object]) -> "ClientConfig":
        known = {f.name: f.type for f in fields(self)}
        conv: dict = {}
        for key, raw in values.items():
            if key not in known:
                raise errors.IncorrectParameter(f"unknown client config key {key!r}")
            default = getattr(self, key)
            try:
                conv[key] = _bool(raw) if isinstance(default, bool) else type(default)(raw)
            except (TypeError, ValueError):
                raise errors.IncorrectParameter(f"bad value for {key}: {raw!r}") from None
        return replace(self, **conv)


def _bool(raw) -> bool:
    if isinstance(raw, bool):
        return raw
    text = str(raw).strip().lower()
    if text in ("1", "true", "yes", "on"):
        return True
    if text in ("0", "false", "no", "off", ""):
        return False
    raise ValueError(raw)


def conf_pairs(text: str, bad_line) -> list[tuple[int, str, str]]:
    """``(line number, key, value)`` of every ``key = value`` line of a conf
    file (``#`` starts a comment; blank lines are skipped); any other line
    raises ``bad_line(line number, line)``.  The client's and the bookie's
    conf files share this syntax."""
    out = []
    for n, line in enumerate(text.splitlines(), 1):
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        if "=" not in line:
            raise bad_line(n, line)
        k, v = line.split("=", 1)
        out.append((n, k.strip(), v.strip()))
    return out


def _bad_client_conf_line(n: int, _line: str) -> errors.BKError:
    return errors.IncorrectParameter(f"client.conf line {n}: expected key = value")


def load_client_conf(path: str | None = None, **overrides) -> ClientConfig:
    cfg = ClientConfig()
    if path:
        with open(path, encoding="utf-8") as f:
            cfg = cfg.with_overrides({k: v for _n, k, v in conf_pairs(f.read(),
                                                                        _bad_client_conf_line)})
    return cfg.with_overrides(overrides) if overrides else cfg


# what a client may be given as its configuration: nothing (the defaults), a
# ClientConfig, the path of a client.conf, or {key: value} overrides
ClientConfLike = ClientConfig | Mapping[str, object] | str | None


def as_config(conf: ClientConfLike) -> ClientConfig:
    if conf is None:
        return ClientConfig()
    if isinstance(conf, ClientConfig):
        return conf
    if isinstance(conf, str):
        return load_client_conf(conf)
    return ClientConfig().with_overrides(conf)
