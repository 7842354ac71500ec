"""Small statistics helpers shared by every benchmark module."""
from __future__ import annotations

import statistics


def rate(count: int, seconds: float) -> float:
    return count / seconds if seconds > 0 else float("inf")


def percentile(sorted_values: list[float], p: float) -> float:
    if not sorted_values:
        return float("nan")
    k = min(len(sorted_values) - 1, max(0, int(round(p / 100.0 * (len(sorted_values) - 1)))))
    return sorted_values[k]


def latency_summary(seconds: list[float]) -> dict:
    """p50/p99/p999 in milliseconds."""
    values = sorted(seconds)
    return {
        "p50_ms": percentile(values, 50) * 1e3,
        "p99_ms": percentile(values, 99) * 1e3,
        "p999_ms": percentile(values, 99.9) * 1e3,
        "mean_ms": (statistics.fmean(values) * 1e3) if values else float("nan"),
        "samples": len(values),
    }
