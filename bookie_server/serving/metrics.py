"""Prometheus metrics of one bookie (own registry, so tests can host several).

The metrics every add and every journal group update (``HotMetrics``) are
plain numbers in one list per thread, exported by a collector at scrape
time: a ``prometheus_client`` Counter or Histogram takes a lock and runs
several Python steps per update, and an add made them several times.  Each
thread writes only its own list, so no update needs a lock; a scrape sums
the lists.  Names, labels, buckets and meanings are those of the Counter and
Histogram they stand for.
"""
from __future__ import annotations

import threading
from bisect import bisect_left
from typing import TYPE_CHECKING, Callable, Iterator, Optional

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import CounterMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

from bookie_server.serving.health import serve_http

if TYPE_CHECKING:
    import ssl
    from http.server import ThreadingHTTPServer

    from bookie_server.serving.admin_http import AdminApi
    from bookie_server.serving.health import Readiness

_le_label: Callable[[float], str] = floatToGoString    # a bucket bound as prometheus_client writes it

_LAT = (0.0002, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5)
_GROUP = (1, 2, 4, 8, 16, 32, 64, 128, 256)
_GROUP_BYTES = (1e3, 1e4, 1e5, 5e5, 1e6, 4e6, 16e6, 64e6)

# a thread's list (HotMetrics): counters, then each histogram's buckets
# (one per bound, then +Inf; not cumulative) followed by its sum
_ADDS_OK, _ADDS_ERROR, _ENTRIES, _BYTES = range(4)
_ADD_LAT = 4
_FSYNC = _ADD_LAT + len(_LAT) + 2
_GROUP_N = _FSYNC + len(_LAT) + 2
_GROUP_B = _GROUP_N + len(_GROUP) + 2
_CELLS = _GROUP_B + len(_GROUP_BYTES) + 2


class _ThreadCells(threading.local):
    """Each thread's list, as ``cells``: ``threading.local`` runs
    ``__init__`` in a thread on its first access, which makes the list and
    registers it, so an update reads ``cells`` with no existence check."""

    def __init__(self, hot: HotMetrics) -> None:
        self.cells: list[float] = [0] * _CELLS
        hot._register(self.cells)


class HotMetrics(Collector):
    """The add path's counters and histograms as per-thread lists."""

    def __init__(self) -> None:
        self._lock = threading.Lock()             # guards the two fields below
        self._cells: list[tuple[threading.Thread, list[float]]] = []   # live threads' lists
        self._retired: list[float] = [0] * _CELLS    # what threads that ended counted
        self._local = _ThreadCells(self)

    def cells(self) -> list[float]:
        """This thread's list (created on its first update)."""
        return self._local.cells

    def _register(self, cells: list[float]) -> None:
        with self._lock:
            self._retire_locked()
            self._cells.append((threading.current_thread(), cells))

    def _retire_locked(self) -> None:
        """Fold the lists of threads that ended into ``_retired`` (a thread
        per connection: their lists must not pile up)."""
        if all(t.is_alive() for t, _ in self._cells):
            return
        live = []
        for thread, cells in self._cells:
            if thread.is_alive():
                live.append((thread, cells))
            else:
                self._retired = [a + b for a, b in zip(self._retired, cells)]
        self._cells = live

    def add_ok(self, entries: int, nbytes: int, seconds: float) -> None:
        c = self._local.cells       # ``cells()`` without its call: once per add
        c[_ADDS_OK] += 1
        c[_ENTRIES] += entries
        c[_BYTES] += nbytes
        c[_ADD_LAT + bisect_left(_LAT, seconds)] += 1
        c[_ADD_LAT + len(_LAT) + 1] += seconds

    def add_error(self) -> None:
        self.cells()[_ADDS_ERROR] += 1

    def journal_fsync(self, seconds: float, group_len: int, nbytes: int) -> None:
        c = self._local.cells       # as in add_ok
        c[_FSYNC + bisect_left(_LAT, seconds)] += 1
        c[_FSYNC + len(_LAT) + 1] += seconds
        c[_GROUP_N if group_len == 1 else _GROUP_N + bisect_left(_GROUP, group_len)] += 1
        c[_GROUP_N + len(_GROUP) + 1] += group_len
        c[_GROUP_B + bisect_left(_GROUP_BYTES, nbytes)] += 1
        c[_GROUP_B + len(_GROUP_BYTES) + 1] += nbytes

    def _totals(self) -> list[float]:
        with self._lock:
            self._retire_locked()
            lists = [self._retired, *(cells for _, cells in self._cells)]
        return [float(sum(col)) for col in zip(*lists)]

    def collect(self) -> Iterator[Metric]:
        t = self._totals()
        adds = CounterMetricFamily("bookie_add_requests", "add requests", labels=["outcome"])
        adds.add_metric(["ok"], t[_ADDS_OK])
        adds.add_metric(["error"], t[_ADDS_ERROR])
        yield adds
        yield CounterMetricFamily("bookie_add_entries", "entries acknowledged", t[_ENTRIES])
        yield CounterMetricFamily("bookie_add_bytes", "Arrow bytes acknowledged", t[_BYTES])
        yield _histogram("bookie_add_latency_seconds", "add request latency", _LAT, t, _ADD_LAT)
        yield _histogram("bookie_journal_fdatasync_seconds", "journal fdatasync", _LAT, t, _FSYNC)
        yield _histogram("bookie_journal_group_requests", "submissions per group commit",
                         _GROUP, t, _GROUP_N)
        yield _histogram("bookie_journal_group_bytes", "bytes per group commit",
                         _GROUP_BYTES, t, _GROUP_B)


def _histogram(name: str, doc: str, bounds: tuple[float, ...], totals: list[float],
               at: int) -> HistogramMetricFamily:
    buckets, seen = [], 0.0
    for i, bound in enumerate((*bounds, float("inf"))):
        seen += totals[at + i]
        buckets.append((_le_label(bound), seen))
    return HistogramMetricFamily(name, doc, buckets=buckets,
                                 sum_value=totals[at + len(bounds) + 1])


class BookieMetrics:
    def __init__(self) -> None:
        r = self.registry = CollectorRegistry()
        self.hot = HotMetrics()      # adds and journal groups: see the module docstring
        r.register(self.hot)
        self.journal_fsync = self.hot.journal_fsync
        self.read_requests = Counter("bookie_read_requests", "read requests", ["outcome"], registry=r)
        self.read_entries = Counter("bookie_read_entries", "entries returned", registry=r)
        self.read_latency = Histogram("bookie_read_latency_seconds", "read latency",
                                      buckets=_LAT, registry=r)
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
