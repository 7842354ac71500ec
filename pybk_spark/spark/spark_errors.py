"""How our errors reach a Spark user: our line first, one line.

PySpark's Python workers answer an exception with its formatted traceback
(``pyspark.util.handle_worker_exception``), and the JVM puts its error class
in front: ``[PYTHON_DATA_SOURCE_ERROR] Failed to create Python data source
instance: Traceback (most recent call last): ...``, our line last.  The
worker leaves the traceback out, sending ``pybk_spark.errors.Type:
message`` alone, when ``SPARK_HIDE_TRACEBACK`` is set in its environment at
that moment (what ``spark.sql.execution.pyspark.udf.hideTraceback.enabled``
sets for every worker).

The driver-side entry points (``schema()``, ``reader()``, ``writer()``,
``streamReader()``, ``streamWriter()`` and the stream reader's calls) run in
planner processes (``pyspark.sql.worker.<step>`` or the streaming runner,
run on their own or forked by ``pyspark.daemon``), which report a failure
and exit.  An expected failure of ours (a ``BKError``) sets
``SPARK_HIDE_TRACEBACK`` in such a process only, never in an executor's
Python worker, whose later tasks' errors it would change.  Called outside Spark the error is the
same typed error with the same text.
"""
from __future__ import annotations

import functools
import os
import sys
from typing import Any, Callable, TypeVar

from pybk_spark import errors

F = TypeVar("F", bound=Callable)

# the modules PySpark runs as a process of their own for one planning step
PLANNER_MODULES = ("pyspark.sql.worker.", "pyspark.sql.streaming.python_streaming_source_runner")


def _in_planner_process() -> bool:
    """Run as ``python -m <planner module>``, or forked by ``python -m
    pyspark.daemon <planner module>``: either way the process exits after
    reporting a failure (``worker_run``'s ``sys.exit(-1)``; the daemon reuses
    a worker only after a success)."""
    spec = getattr(sys.modules.get("__main__"), "__spec__", None)
    names = [getattr(spec, "name", "") or "", *sys.argv[1:2]]
    return any(str(name).startswith(PLANNER_MODULES) for name in names)


def our_line_first(fn: F) -> F:
    """Wrap a method Spark calls on the driver: a BKError it raises reaches
    the user as its one line, right after Spark's error class."""
    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except errors.BKError:
            if _in_planner_process():
                os.environ["SPARK_HIDE_TRACEBACK"] = "1"
            raise
    return wrapper  # type: ignore[return-value]
