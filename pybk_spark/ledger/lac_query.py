"""The LAC query: ReadLac to every bookie of a ledger's last fragment.

``read_lac_coverage`` sends ReadLac (fenced or not) to each bookie of the
last fragment and feeds the answers to ``protocol.read_decisions.
LacCoverage``, returning as soon as they cover the ensemble or no longer can.
Readers run it non-fencing (``ReadHandle.read_last_add_confirmed``, a
non-recovery open, ``pybk`` recovery's look at a ledger); the fencing open
runs it with ``fence=True`` as its fence phase (``recovery_op.
fence_and_read_lac``).  ``query_lac`` is the readers' answer: the max LAC
once covered, else ReadError.
"""
from __future__ import annotations

import concurrent.futures as cf
from concurrent.futures import Future

from pybk_spark import errors
from pybk_spark.ledger.context import ClientContext
from pybk_spark.protocol import ledger_metadata as lm
from pybk_spark.protocol import read_decisions as rd
from pybk_spark.wire.results import LacResult


def read_lac_coverage(ctx: ClientContext, md: lm.LedgerMetadata, key: bytes, *,
                      fence: bool) -> rd.LacCoverage:
    """ReadLac (fenced or not) to every bookie of the last fragment; returns
    the coverage as soon as it is covered or can no longer be."""
    ensemble = md.current_ensemble
    cov = rd.LacCoverage(len(ensemble), md.write_quorum, md.ack_quorum,
                         floor=md.last_fragment_first_entry - 1)
    futs: dict[Future[LacResult], int] = {
        ctx.transports.get(b).read_lac(md.ledger_id, fence=fence, master_key=key,
                                       timeout=ctx.conf.read_timeout_s): i
        for i, b in enumerate(ensemble)}
    for f in cf.as_completed(futs):
        exc = f.exception()
        if isinstance(exc, errors.Unauthorized):
            raise exc           # no bookie will answer a wrong key
        cov.on_answer(futs[f], rd.answer_kind(exc), f.result().lac if exc is None else -1)
        if cov.covered or cov.impossible:
            break
    return cov


def query_lac(ctx: ClientContext, md: lm.LedgerMetadata, key: bytes, *, fence: bool) -> int:
    """Max LAC of the last fragment's bookies, returning once they cover it."""
    cov = read_lac_coverage(ctx, md, key, fence=fence)
    if not cov.covered:
        raise errors.ReadError("could not read the LAC from enough bookies",
                               ledger_id=md.ledger_id)
    return cov.lac
