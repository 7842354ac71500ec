"""How our errors reach a Spark user: our line first, one line.

PySpark's Python workers answer an exception with its formatted traceback
(``pyspark.util.handle_worker_exception``), and the JVM puts its error class
in front: ``[PYTHON_DATA_SOURCE_ERROR] Failed to create Python data source
instance: Traceback (most recent call last): ...``, our line last.  The
worker leaves the traceback out, sending ``pybk_spark.errors.Type:
message`` alone, when ``SPARK_HIDE_TRACEBACK`` is set in its environment at
that moment (what ``spark.sql.execution.pyspark.udf.hideTraceback.enabled``
sets for every worker).

Spark calls the data source in PySpark worker processes that report a
failure and exit: the planner steps (``pyspark.sql.worker.<step>``, the
streaming source runner and the sink's commit runner) for the driver-side
calls (``schema()``, ``reader()``, ``writer()``, ``streamWriter()``,
``partitions()``, offsets, commits), and an executor's ``pyspark.worker``
for a task's ``read()`` and ``write()`` (its ``main`` answers an exception
with ``sys.exit(-1)``; the daemon reuses only a worker whose task
succeeded).  A ``BKError`` leaving one of those calls sets
``SPARK_HIDE_TRACEBACK`` in that process, which exits after reporting it,
so no later task's error loses its traceback.  ``our_line_first`` wraps
only the methods Spark itself calls: a ``BKError`` our own code catches
never passes through it.  Called outside Spark the error is the same typed
error with the same text.

An executor task's failure reaches the user as PySpark's
``PythonException``, whose text is ``An exception was thrown from the
Python worker:`` and then our line.
"""
from __future__ import annotations

import functools
import os
import sys
from collections.abc import Iterator
from typing import Any, Callable, TypeVar

from pybk_spark import errors

F = TypeVar("F", bound=Callable)

# the modules PySpark runs as a process of their own for one planning step
PLANNER_MODULES = ("pyspark.sql.worker.", "pyspark.sql.streaming.python_streaming_source_runner")
# an executor's Python worker (run by ``pyspark.daemon`` or on its own)
EXECUTOR_MODULE = "pyspark.worker"


def _exits_after_reporting() -> bool:
    """Run as ``python -m <module>``, or forked by ``python -m pyspark.daemon
    <module>``, where the module is a planner step or an executor's worker:
    either way the process exits after reporting a failure (``worker_run``'s
    and ``pyspark.worker.main``'s ``sys.exit(-1)``)."""
    spec = getattr(sys.modules.get("__main__"), "__spec__", None)
    names = [str(name) for name in (getattr(spec, "name", "") or "", *sys.argv[1:2])]
    return any(name.startswith(PLANNER_MODULES) or name == EXECUTOR_MODULE for name in names)


def _hide_traceback() -> None:
    if _exits_after_reporting():
        os.environ["SPARK_HIDE_TRACEBACK"] = "1"


def _rows(rows: Iterator) -> Iterator:
    try:
        yield from rows
    except errors.BKError:
        _hide_traceback()
        raise


def our_line_first(fn: F) -> F:
    """Wrap a method Spark calls: a BKError it raises (or, for ``read()``,
    raises while Spark iterates its batches) reaches the user as its one
    line, right after Spark's error class."""
    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            result = fn(*args, **kwargs)
        except errors.BKError:
            _hide_traceback()
            raise
        return _rows(result) if isinstance(result, Iterator) else result
    return wrapper  # type: ignore[return-value]
