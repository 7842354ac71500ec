"""Bookie configuration: defaults, conf-file parsing, CLI overrides.

``conf/bookie.conf`` is ``key = value`` lines with ``#`` comments; every key
of ``BookieConfig`` may appear there.  Command-line flags override the file.
Unknown keys are rejected (a typo must not silently fall back to a default).
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, fields
from typing import Any

from bookie_server.serving.tls import validate as validate_tls
from pybk_spark.config import conf_pairs
from pybk_spark.wire.add_validation import DEFAULT_MAX_BATCH_BYTES, DEFAULT_MAX_ENTRY_BYTES

MiB = 1024 * 1024


@dataclass
class BookieConfig:
    port: int = 3181
    bind_address: str = "127.0.0.1"       # 0.0.0.0 / :: = every interface
    advertised_address: str = ""         # registered host; empty = derived (bookie_server/serving/identity.py)
    data_dir: str = "./data/bookie"
    metadata_uri: str = ""               # empty = standalone (no registration, no GC)
    bookie_id: str = ""                  # empty = "<advertised address>:<port>"
    rack: str = "/default-rack"
    # journal / group commit
    journal_max_group_wait_ms: float = 2.0
    journal_max_group_bytes: int = 512 * 1024
    journal_flush_when_queue_empty: bool = True
    journal_lead_max_bytes: int = 64 * 1024
    journal_sync_data: bool = True
    journal_max_file_bytes: int = 256 * MiB
    journal_prealloc_bytes: int = 64 * MiB
    journal_page_cache_keep_mb: int = 1024  # -1: never drop; see conf/bookie.conf
    journal_direct_write_min_bytes: int = 1 * MiB  # groups this big: O_DIRECT; 0 = never
    # limits
    max_entry_bytes: int = DEFAULT_MAX_ENTRY_BYTES
    max_batch_bytes: int = DEFAULT_MAX_BATCH_BYTES
    max_read_entries: int = 10000
    max_read_bytes: int = 16 * MiB
    max_inflight_per_stream: int = 64
    # admission (overload): past either bound an add is answered TOO_MANY_REQUESTS
    max_adds_in_progress: int = 4096     # adds accepted, not yet durable; 0 = no bound
    max_add_memory_bytes: int = 512 * MiB  # in-progress add bytes + write cache; 0 = no bound
    # entry store
    segment_max_bytes: int = 256 * MiB
    write_cache_max_bytes: int = 128 * MiB
    checkpoint_sync_bytes: int = 1 * MiB    # a checkpoint syncs its segment writes this often
    read_buffers_at_start_mb: int = 96     # big-read buffers touched at start; 0 = on demand
    pull_buffers_at_start_mb: int = 128    # a pull's received answers, touched at start; 0 = on demand
    flush_interval_s: float = 5.0
    compaction_min_live_ratio: float = 0.5
    # scrubber: re-check stored batches' digests in the background (scrubber.py)
    scrub_interval_s: float = 86400.0    # seconds between passes; 0 = no scrubber
    scrub_rate_bytes_per_s: int = 32 * MiB
    # disk
    disk_usage_threshold: float = 0.95
    disk_usage_lwm: float = 0.90
    disk_check_interval_s: float = 2.0
    # gc / registration
    gc_interval_s: float = 60.0
    registration_ttl_s: int = 15         # > the longest etcd member stall survived (docs/operations.md)
    # service
    grpc_threads: int = 64
    add_lane_port: int = 0               # 0 = any free port (registered), -1 = no add lane
    lane_max_connections: int = 1024     # more open lane connections are refused at accept
    lane_hello_timeout_s: float = 10.0   # a connection must send magic + hello within this
    long_poll_max_timeout_ms: int = 60000
    metrics_port: int = 0                # 0 = no Prometheus endpoint
    # TLS (bookie_server/serving/tls.py; docs/operations.md, "Securing a cluster")
    tls_cert_file: str = ""              # PEM server certificate (chain); set = TLS on every port
    tls_key_file: str = ""               # PEM private key of tls_cert_file
    tls_ca_file: str = ""                # PEM CA bundle client certificates are verified against
    tls_client_auth: str = "required"    # required | optional | none
    tls_writer_identities: str = ""      # comma-separated CN/SANs; empty = any admitted client
    tls_operator_identities: str = ""    # comma-separated CN/SANs allowed the key-less path
    metrics_tls: bool = False            # serve /metrics /health /ready over HTTPS
    admin_http_allow_remote: bool = False  # admin API (/api/v1) answers loopback peers only
    # etcd TLS / authentication (pybk_spark/metadata/security.py; "" = unset)
    etcd_ca_file: str = ""
    etcd_cert_file: str = ""
    etcd_key_file: str = ""
    etcd_user: str = ""
    etcd_password_file: str = ""

    def effective_bookie_id(self) -> str:
        return self.bookie_id or f"{self.advertised_address or self.bind_address}:{self.port}"

    def grpc_message_limit(self) -> int:
        return self.max_batch_bytes + 4 * MiB


def _coerce(field_type: Any, raw: str, key: str) -> Any:
    text = raw.strip()
    kind = field_type if isinstance(field_type, str) else getattr(field_type, "__name__", str(field_type))
    try:
        if kind == "bool":
            if text.lower() in ("1", "true", "yes", "on"):
                return True
            if text.lower() in ("0", "false", "no", "off"):
                return False
            raise ValueError(text)
        if kind == "int":
            return int(float(text)) if "e" in text.lower() else int(text, 0)
        if kind == "float":
            return float(text)
        return text
    except ValueError:
        raise ValueError(f"bad value for {key}: {raw!r} (expected {kind})") from None


def _bad_line(lineno: int, line: str) -> ValueError:
    return ValueError(f"conf line {lineno}: expected 'key = value': {line!r}")


def parse_conf_text(text: str) -> dict[str, Any]:
    types = {f.name: f.type for f in fields(BookieConfig)}
    out: dict[str, Any] = {}
    for lineno, key, value in conf_pairs(text, _bad_line):
        if key not in types:
            raise ValueError(f"conf line {lineno}: unknown key {key!r}")
        out[key] = _coerce(types[key], value, key)
    return out


def load_config(conf_path: str | None = None, overrides: dict[str, Any] | None = None) -> BookieConfig:
    values: dict[str, Any] = {}
    if conf_path:
        with open(conf_path, encoding="utf-8") as fh:
            values.update(parse_conf_text(fh.read()))
    for key, value in (overrides or {}).items():
        if value is not None:
            values[key] = value
    cfg = BookieConfig(**values)
    validate(cfg)
    return cfg


def validate(cfg: BookieConfig) -> None:
    if not 0 < cfg.disk_usage_lwm <= cfg.disk_usage_threshold:
        raise ValueError("need 0 < disk_usage_lwm <= disk_usage_threshold")
    if cfg.max_entry_bytes <= 0 or cfg.max_batch_bytes < cfg.max_entry_bytes:
        raise ValueError("need 0 < max_entry_bytes <= max_batch_bytes")
    if cfg.max_adds_in_progress < 0:
        raise ValueError("max_adds_in_progress must be >= 0 (0 = no bound)")
    if cfg.max_add_memory_bytes and cfg.max_add_memory_bytes < cfg.max_batch_bytes:
        raise ValueError("need max_add_memory_bytes = 0 (no bound) or >= max_batch_bytes")
    if cfg.journal_max_group_bytes <= 0:
        raise ValueError("journal_max_group_bytes must be > 0")
    if cfg.add_lane_port < -1 or cfg.add_lane_port > 65535:
        raise ValueError("add_lane_port must be -1 (off), 0 (any free port) or a port")
    if cfg.lane_max_connections < 1:
        raise ValueError("lane_max_connections must be >= 1")
    if cfg.lane_hello_timeout_s <= 0:
        raise ValueError("lane_hello_timeout_s must be > 0")
    if cfg.scrub_interval_s < 0:
        raise ValueError("scrub_interval_s must be >= 0 (0 = no scrubber)")
    if cfg.scrub_rate_bytes_per_s <= 0:
        raise ValueError("scrub_rate_bytes_per_s must be > 0")
    validate_tls(cfg)                    # TlsConfigError is a ValueError naming the setting
    if cfg.journal_direct_write_min_bytes < 0:
        raise ValueError("journal_direct_write_min_bytes must be >= 0 (0 = never)")
    if cfg.checkpoint_sync_bytes < 0:
        raise ValueError("checkpoint_sync_bytes must be >= 0 (0 = once per segment file)")
    if cfg.read_buffers_at_start_mb < 0:
        raise ValueError("read_buffers_at_start_mb must be >= 0 (0 = on demand)")
    if cfg.pull_buffers_at_start_mb < 0:
        raise ValueError("pull_buffers_at_start_mb must be >= 0 (0 = on demand)")
    if cfg.journal_page_cache_keep_mb < -1:
        raise ValueError("journal_page_cache_keep_mb must be -1 (never drop) or >= 0")


def replace(cfg: BookieConfig, **changes: Any) -> BookieConfig:
    return dataclasses.replace(cfg, **changes)
