"""Plain functions behind the pytest fixtures (tests/conftest.py), reusable
from bench/ and the demo without pytest."""
from __future__ import annotations

import importlib.util
import itertools
import os
import uuid

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
