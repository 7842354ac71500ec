"""How our errors reach a Spark user: our line first.

PySpark's Python workers answer an exception with Python's whole formatted
traceback (``pyspark.util.handle_worker_exception``: ``traceback.
TracebackException`` of the exception being handled), and the JVM puts its
error class in front, e.g. ``[PYTHON_DATA_SOURCE_ERROR] Failed to create
Python data source instance: <that text>``.  We cannot change the JVM's
prefix, nor hide the traceback (only the user's
``spark.sql.execution.pyspark.udf.hideTraceback.enabled`` does), but Python
formats a chain from its root: a context without a traceback prints as its
one line, ``pybk_spark.errors.Type: message``, before everything else (a
``__cause__`` would too, but Spark's default simplified traceback drops
causes).  So every entry point Spark calls raises our error with a
traceback-less copy of itself as its context, and what the user reads right
after the error class is the typed error, what was tried and what to do; the
traceback follows below it.
Called outside Spark the error is the same typed error, with the same text.
"""
from __future__ import annotations

import copy
import functools
from typing import Callable, TypeVar

from pybk_spark import errors

F = TypeVar("F", bound=Callable)


def leading(exc: errors.BKError) -> errors.BKError:
    """A copy of ``exc`` without traceback, cause or context: one line."""
    head = copy.copy(exc)
    head.__traceback__ = None
    head.__cause__ = head.__context__ = None
    head.__suppress_context__ = True
    return head


def our_line_first(fn: F) -> F:
    """Wrap a method Spark calls: a BKError it raises leads the message."""
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except errors.BKError as exc:
            failure = exc
        # raised outside the except block, so that the context set here stays:
        # Spark's simplified traceback drops a __cause__, never a __context__
        failure.__cause__ = None
        failure.__context__ = leading(failure)
        failure.__suppress_context__ = False
        raise failure.with_traceback(None)
    return wrapper  # type: ignore[return-value]
