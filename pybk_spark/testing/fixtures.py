"""Plain functions behind the pytest fixtures (tests/conftest.py), reusable
from bench/ and the demo without pytest."""
from __future__ import annotations

import importlib.util
import itertools
import os
import uuid
from typing import Any, Iterator

_counter = itertools.count(1)


def bookie_server_available() -> bool:
    """True when the ``bookie_server`` package and its entry point exist."""
    try:
        return importlib.util.find_spec("bookie_server.__main__") is not None
    except ImportError:
        return False


def unique_scope(prefix: str = "t") -> str:
    """A metadata scope name no other test (or test process) uses."""
    return f"{prefix}{os.getpid()}x{next(_counter)}x{uuid.uuid4().hex[:6]}"


def private_cluster(directory: Any, **kwargs: Any) -> Iterator[Any]:
    """The body of a fixture that owns a ``LocalCluster`` (``yield from`` it):
    started in ``directory`` with ``kwargs``, stopped afterwards, also when
    its start failed half-way."""
    # why: a cluster imports grpc and etcd; the other helpers need neither
    from pybk_spark.cluster.local import LocalCluster
    local = LocalCluster(directory, **kwargs)
    try:
        local.start()
        yield local
    finally:
        local.stop()
