"""Pure tests of protocol.add_admission: size limits, error classes, backoff."""
from __future__ import annotations

import random

import pytest

from pybk_spark import errors
from pybk_spark.protocol import add_admission as adm

MiB = 1 << 20


def _reg(entry, batch):
    return {"bookie_id": "b", "limits": {"max_entry_bytes": entry, "max_batch_bytes": batch}}


def test_limits_client_only_when_bookies_advertise_nothing():
    lim = adm.limits(5 * MiB, 64 * MiB, [{"bookie_id": "old"}, {}])
    assert lim.max_entry_bytes == 5 * MiB
    assert lim.max_request_bytes == 64 * MiB - adm.REQUEST_OVERHEAD


def test_limits_bounded_by_smallest_bookie():
    lim = adm.limits(5 * MiB, 64 * MiB, [_reg(4 * MiB, 32 * MiB), _reg(1 * MiB, 8 * MiB)])
    assert lim.max_entry_bytes == 1 * MiB
    assert lim.max_request_bytes == 8 * MiB


def test_one_entry_at_the_limit_passes_the_batch_check():
    # a bookie with max_entry_bytes == max_batch_bytes cannot take an entry of
    # that size (the batch has overhead): the client limit leaves room for it
    lim = adm.limits(64 * MiB, 64 * MiB, [_reg(MiB, MiB)])
    assert lim.max_entry_bytes == MiB - adm.batch_overhead(1)
    assert lim.request_payload_budget(1) >= lim.max_entry_bytes


def test_garbage_advertisements_are_ignored():
    lim = adm.limits(MiB, 64 * MiB, [{"limits": {"max_entry_bytes": "x", "max_batch_bytes": -1}},
                                     {"limits": "nonsense"}])
    assert lim.max_entry_bytes == MiB


def test_request_budget_shrinks_with_entries():
    lim = adm.AddLimits(MiB, 4 * MiB)
    assert lim.request_payload_budget(1) > lim.request_payload_budget(1000)
    assert lim.request_payload_budget(1000) == 4 * MiB - adm.batch_overhead(1000)


def test_entry_fits():
    lim = adm.AddLimits(100, 1000)
    assert lim.entry_fits(100) and not lim.entry_fits(101)


def test_too_large_names_the_settings():
    exc = adm.too_large(200, adm.AddLimits(100, 1000), ledger_id=7)
    assert isinstance(exc, errors.TooLarge) and exc.outcome_known
    assert "max_entry_size_bytes" in str(exc) and "max_entry_bytes" in str(exc)
    assert "100" in str(exc) and "200" in str(exc)


@pytest.mark.parametrize("exc, kind", [
    (errors.LedgerFenced(), adm.ABORT),
    (errors.Unauthorized(), adm.ABORT),
    (errors.LedgerClosed(), adm.ABORT),
    (errors.TooLarge(), adm.ENTRY_REJECTED),
    (errors.TooManyRequests(), adm.OVERLOAD),
    (errors.Timeout(), adm.BOOKIE_FAILURE),
    (errors.BookieUnavailable(), adm.BOOKIE_FAILURE),
    (errors.BookieIOError(), adm.BOOKIE_FAILURE),
    (errors.ReadOnly(), adm.BOOKIE_FAILURE),
    (errors.BadRequest(), adm.BOOKIE_FAILURE),
    (RuntimeError("x"), adm.BOOKIE_FAILURE),
])
def test_classify_add_failure(exc, kind):
    assert adm.classify_add_failure(exc) == kind


def test_backoff_is_bounded_and_grows():
    rng = random.Random(7)
    for attempt in range(100):
        d = adm.backoff_delay(attempt, rng.random(), 0.01, 1.0)
        assert 0.0 <= d <= 1.0
    # the ceiling doubles until the cap (u just below 1)
    u = 0.999999
    ceilings = [adm.backoff_delay(a, u, 0.01, 1.0) for a in range(10)]
    assert ceilings == sorted(ceilings)
    assert ceilings[0] == pytest.approx(0.01, rel=1e-3)
    assert ceilings[-1] == pytest.approx(1.0, rel=1e-3)
    assert adm.backoff_delay(10 ** 6, u, 0.01, 1.0) <= 1.0
    assert adm.backoff_delay(3, 0.0, 0.01, 1.0) == 0.0
    assert adm.backoff_delay(3, 0.5, 0.0, 1.0) == 0.0


def test_keep_retrying_until_budget():
    assert adm.keep_retrying(100.0, 100.0, 60.0)
    assert adm.keep_retrying(100.0, 159.9, 60.0)
    assert not adm.keep_retrying(100.0, 160.0, 60.0)


def test_unknown_outcome_marks_one_instance():
    exc = errors.unknown_outcome(errors.NotEnoughBookies("x"))
    assert exc.outcome_known is False
    assert errors.NotEnoughBookies("y").outcome_known is True
