"""The store's watch: ``wait_for_change``, a one-shot etcd watch.

A watch from ``after_revision + 1`` on a prefix is a hint, not an answer:
one that fails before its timeout (its member lost the leader, which
cancels a watch that asked for one; its connection broke) returns True,
"may have changed", so the caller reads again, and that read fails over to
another member or raises.  A watch that saw nothing until its timeout is
False; compacted history is True (something may have changed).
"""
from __future__ import annotations

import logging
import time

from pyetcd import exceptions as etcd_exc

from pybk_spark import errors
from pybk_spark.metadata import etcd_errors
from pybk_spark.metadata.etcd_connection import EtcdConnection
from pybk_spark.metadata.etcd_refusals import StaleToken

log = logging.getLogger("pybk_spark.metadata")


def wait_for_change(conn: EtcdConnection, full_key: bytes, after_revision: int,
                    timeout: float) -> bool:
    """Whether keys under ``full_key`` (scope included) may have changed after
    ``after_revision``, waiting at most ``timeout`` s for a change."""
    if timeout <= 0:
        return False
    epoch = conn.ensure_auth()
    try:
        resp = etcd_errors.translate(conn.client.watch_prefix_once_response, conn.security)(
            full_key, timeout=timeout, start_revision=int(after_revision) + 1)
    except StaleToken:
        conn.renew_auth(epoch)
        return True            # not watched: something may have changed
    except errors.MetadataUnavailable as exc:
        if isinstance(exc.__cause__, etcd_exc.WatchTimedOut):
            return False
        return _lost_watch(conn, exc, timeout)
    except errors.MetadataError as exc:
        if isinstance(exc.__cause__, etcd_exc.RevisionCompactedError):
            return True        # history gone: something may have changed
        raise
    if isinstance(resp, BaseException) and not isinstance(
            resp, etcd_exc.RevisionCompactedError):   # the stream ended (no leader, ...)
        return _lost_watch(conn, resp, timeout)
    return True     # a change, or history compacted: something may have changed


def _lost_watch(conn: EtcdConnection, error: BaseException, timeout: float) -> bool:
    """A watch that ended without an answer (its member lost the leader,
    which ends the watch streams that asked for one; a broken
    connection): a lost hint, not an error.  True, "may have changed":
    the caller reads again, and that read fails over to another member or
    raises.  Paced, for a caller that loops on a failing watch."""
    log.info("event=etcd_watch_failed endpoints=%s error=%r (read again)",
             conn.endpoint_in_use(), error)
    time.sleep(min(timeout, 0.1))
    return True
