"""Prometheus metrics of one bookie (own registry, so tests can host several)."""
from __future__ import annotations

from typing import TYPE_CHECKING, Callable, Optional

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from bookie_server.serving.health import serve_http

if TYPE_CHECKING:
    import ssl
    from http.server import ThreadingHTTPServer

    from bookie_server.serving.admin_http import AdminApi
    from bookie_server.serving.health import Readiness

_LAT = (0.0002, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5)


class BookieMetrics:
    def __init__(self) -> None:
        r = self.registry = CollectorRegistry()
        self.add_requests = Counter("bookie_add_requests", "add requests", ["outcome"], registry=r)
        self.add_entries = Counter("bookie_add_entries", "entries acknowledged", registry=r)
        self.add_bytes = Counter("bookie_add_bytes", "Arrow bytes acknowledged", registry=r)
        self.add_latency = Histogram("bookie_add_latency_seconds", "add request latency",
                                     buckets=_LAT, registry=r)
        self.read_requests = Counter("bookie_read_requests", "read requests", ["outcome"], registry=r)
        self.read_entries = Counter("bookie_read_entries", "entries returned", registry=r)
        self.read_latency = Histogram("bookie_read_latency_seconds", "read latency",
                                      buckets=_LAT, registry=r)
        self.fsync_latency = Histogram("bookie_journal_fdatasync_seconds", "journal fdatasync",
                                       buckets=_LAT, registry=r)
        self.group_size = Histogram("bookie_journal_group_requests", "submissions per group commit",
                                    buckets=(1, 2, 4, 8, 16, 32, 64, 128, 256), registry=r)
        self.group_bytes = Histogram("bookie_journal_group_bytes", "bytes per group commit",
                                     buckets=(1e3, 1e4, 1e5, 5e5, 1e6, 4e6, 16e6, 64e6), registry=r)
        self.queue_depth = Gauge("bookie_journal_queue_depth", "journal queue depth", registry=r)
        self.disk_usage = Gauge("bookie_disk_usage_ratio", "used/total of the data disk", registry=r)
        self.read_only = Gauge("bookie_read_only", "1 when read-only", registry=r)
        self.write_cache = Gauge("bookie_write_cache_bytes", "bytes not yet in segments", registry=r)
        self.journal_live = Gauge("bookie_journal_live_bytes",
                                  "bytes of live entry batches indexed inside journal files "
                                  "(journal-resident batches: they keep their files)", registry=r)
        self.journal_cached = Gauge("bookie_journal_page_cache_window_bytes",
                                    "synced journal bytes the page-cache window keeps cached "
                                    "(journal_page_cache_keep_mb)", registry=r)
        self.lane_connections = Gauge("bookie_add_lane_connections",
                                      "open add lane connections", registry=r)
        self.lane_refused = Counter("bookie_add_lane_refused",
                                    "add lane connections closed for bad input: wrong magic, "
                                    "another bookie's id, a malformed frame, unread answers",
                                    registry=r)
        self.adds_refused = Counter("bookie_adds_refused_overload",
                                    "adds answered TOO_MANY_REQUESTS (max_adds_in_progress / "
                                    "max_add_memory_bytes)", registry=r)
        self.checkpoints = Counter("bookie_checkpoints", "checkpoints written", registry=r)
        self.gc_ledgers = Counter("bookie_gc_ledgers_deleted", "ledgers reclaimed by GC", registry=r)
        self.damaged_ranges = Gauge("bookie_damaged_ranges",
                                    "entry ranges lost to damage, not yet re-replicated "
                                    "(event=entries_missing)", registry=r)
        self.scrub_bytes = Counter("bookie_scrub_bytes", "stored bytes checked by the scrubber",
                                   registry=r)
        self.scrub_damaged = Counter("bookie_scrub_damaged_batches",
                                     "stored batches the scrubber found damaged", registry=r)

    def journal_fsync(self, seconds: float, group_len: int, nbytes: int) -> None:
        self.fsync_latency.observe(seconds)
        self.group_size.observe(group_len)
        self.group_bytes.observe(nbytes)

    def bind_gauges(self, queue_depth: Callable[[], float], write_cache: Callable[[], float],
                    journal_live: Callable[[], float] = lambda: 0,
                    journal_cached: Callable[[], float] = lambda: 0) -> None:
        self.queue_depth.set_function(queue_depth)
        self.journal_cached.set_function(journal_cached)
        self.write_cache.set_function(write_cache)
        self.journal_live.set_function(journal_live)

    def serve(self, port: int, addr: str = "127.0.0.1", readiness: Optional[Readiness] = None,
              admin: Optional[AdminApi] = None,
              tls_context: Optional[Callable[[], ssl.SSLContext]] = None) -> ThreadingHTTPServer:
        """``/metrics`` plus ``/health`` and ``/ready`` (bookie_server/serving/health.py)
        and the admin API (bookie_server/serving/admin_http.py) when ``admin`` is given;
        ``tls_context``: a callable giving the current ``ssl.SSLContext`` (HTTPS)."""
        return serve_http(port, addr, self.registry, readiness, admin, tls_context)
