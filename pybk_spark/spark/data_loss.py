"""``failOnDataLoss``: what a read does when data it was meant to read is gone.

Theory of operation
-------------------
Data is gone when a log was truncated below a stream's position, a ledger
that a log lists (or a task was planned on) was deleted, or the log a
position was taken in was deleted and another log was created with its name
(``LogRecreated``, a ``LogTruncated``; protocol/log_identity.py).  As in Spark's Kafka
source, ``failOnDataLoss=true`` (the default) fails the query with
``LogTruncated``, naming the position and the option; ``false`` logs a
warning (logger ``pybk_spark.spark``) and the caller skips what is gone:
a stream moves to the first entry still in the log, a read leaves the
deleted ledger out.  Every caller decides through :func:`report`, so the
message and the switch live in one place.

No I/O besides the warning.
"""
from __future__ import annotations

import logging

from pybk_spark import errors

LOG = logging.getLogger("pybk_spark.spark")

HINT = ("set option failOnDataLoss=false to skip what is gone and go on "
        "(docs/spark.md, 'Data loss')")


def report(fail: bool, message: str, kind: type[errors.LogTruncated] = errors.LogTruncated,
           **context: object) -> None:
    """Raise ``kind`` (``LogTruncated`` or a subclass) when ``fail``;
    otherwise warn and return (skip)."""
    if fail:
        raise kind(f"{message}; {HINT}", **context)
    detail = ", ".join(f"{k}={v}" for k, v in sorted(context.items()))
    LOG.warning("bookkeeper source: %s (%s); skipped because failOnDataLoss=false",
                message, detail)
