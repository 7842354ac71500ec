"""When a local cluster serves: etcd answers, and every bookie is registered
in it and answers a request on the addresses it registered.

A registration alone is not enough for a client that starts at once: the
registration may lapse and come back (a lease refresh missed on a loaded
host), and the client reaches the bookie at the registered addresses, not at
the process.  ``wait_serving`` polls until one pass over all bookies finds
each of them registered (read from etcd, which so answers too) and
answering there: ``GetBookieInfo`` over gRPC and, when it registered a lane,
a one-entry read over the lane (a ``NoSuchLedger`` answer counts: it is an
answer).  ``pybk standalone`` prints the metadata URI only after it.
"""
from __future__ import annotations

import time
from typing import Optional

from pybk_spark import errors
from pybk_spark.admin.operations.liveness import probe
from pybk_spark.cluster.local import BookieStartError, LocalCluster
from pybk_spark.transport.grpc_bookie import registration_of
from pybk_spark.transport.tls import ClientTls

PROBE_TIMEOUT_S = 5.0


def wait_serving(cluster: LocalCluster, tls: Optional[ClientTls] = None,
                 timeout: Optional[float] = None) -> list[dict]:
    """The registrations of every bookie of ``cluster``, in its order, once
    one pass finds all registered and answering; ``BookieStartError``
    (naming the bookie and what failed) after ``timeout`` (default the
    cluster's ``ready_timeout``) or when a bookie's process exits."""
    limit = cluster.ready_timeout if timeout is None else timeout
    deadline = time.monotonic() + limit
    delay = 0.02
    while True:
        regs, why = [], ""
        for bid in cluster.bookie_ids:
            left = max(0.1, deadline - time.monotonic())
            cluster.wait_registered(bid, timeout=left)      # raises with the log tail
            try:
                reg = registration_of(cluster.store, bid)
            except errors.MetadataUnavailable as exc:
                reg, why = None, f"etcd: {exc}"
            if reg is None or not reg.get("address"):
                why = why or f"{bid} is not registered"
                break
            reg.setdefault("bookie_id", bid)
            failed = probe(reg, tls, min(PROBE_TIMEOUT_S, left))
            if failed:
                why = f"{bid} does not answer at {reg['address']}: {failed}"
                break
            regs.append(reg)
        if not why:
            return regs
        if time.monotonic() > deadline:
            raise BookieStartError(f"cluster not serving after {limit}s: {why}")
        time.sleep(delay)
        delay = min(delay * 2, 0.2)
