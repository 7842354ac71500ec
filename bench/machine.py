"""The machine a benchmark ran on: cores, memory, disk, load and versions."""
from __future__ import annotations

import os
import platform
import shutil
import subprocess
import sys


def _meminfo_gib() -> float | None:
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemTotal:"):
                    return round(int(line.split()[1]) / (1 << 20), 1)
    except OSError:
        pass
    return None


def _cpu_model() -> str | None:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return None


def _version(module: str) -> str | None:
    try:
        return __import__(module).__version__
    except (ImportError, AttributeError):
        return None


def _redis_version() -> str | None:
    exe = shutil.which("redis-server")
    if not exe:
        return None
    try:
        out = subprocess.run([exe, "--version"], capture_output=True, text=True, timeout=10).stdout
        return out.split("v=", 1)[1].split()[0] if "v=" in out else out.strip()
    except (OSError, subprocess.SubprocessError, IndexError):
        return None


def _java_version() -> str | None:
    try:
        out = subprocess.run(["java", "-version"], capture_output=True, text=True, timeout=20)
        return (out.stderr or out.stdout).splitlines()[0].strip()
    except (OSError, subprocess.SubprocessError, IndexError):
        return None


def describe(data_dir: str) -> dict:
    du = shutil.disk_usage(data_dir)
    return {
        "nproc": os.cpu_count(),
        "cpu_model": _cpu_model(),
        "memory_gib": _meminfo_gib(),
        "disk_free_gib": round(du.free / (1 << 30), 1),
        "disk_total_gib": round(du.total / (1 << 30), 1),
        "data_dir": data_dir,
        "loadavg_at_start": [round(x, 2) for x in os.getloadavg()],
        "kernel": platform.release(),
        "python": sys.version.split()[0],
        "pyspark": _version("pyspark"),
        "pyarrow": _version("pyarrow"),
        "grpcio": _version("grpc"),
        "redis_server": _redis_version(),
        "java": _java_version(),
    }
