"""Pure tests of protocol.batch_cuts: where payloads are cut into requests."""
from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from pybk_spark.protocol import add_admission as adm
from pybk_spark.protocol import batch_cuts as bc

KiB = 1 << 10
MiB = 1 << 20


def _lim(entry: int, request: int) -> adm.AddLimits:
    return adm.AddLimits(max_entry_bytes=entry, max_request_bytes=request)


def _greedy(sizes, max_entries, max_bytes, lim):
    """The reference: one entry at a time, cut before the entry that does not fit."""
    ends, n, size = [], 0, 0
    for i, length in enumerate(sizes):
        if n and not bc.fits(n + 1, size + length, max_entries, max_bytes, lim):
            ends.append(i)
            n, size = 0, 0
        n += 1
        size += length
    if n:
        ends.append(len(sizes))
    return ends


def test_empty_run_has_no_batches():
    lim = _lim(MiB, 64 * MiB)
    assert bc.batch_ends([], 1000, 4 * MiB, lim) == []
    assert bc.first_batch([], 1000, 4 * MiB, lim) == 0


def test_run_that_fits_is_one_batch():
    lim = _lim(MiB, 64 * MiB)
    assert bc.batch_ends([100] * 1000, 1000, 4 * MiB, lim) == [1000]
    assert bc.first_batch([100] * 1000, 1000, 4 * MiB, lim) == 1000


def test_cut_by_entry_count():
    lim = _lim(MiB, 64 * MiB)
    assert bc.batch_ends([10] * 2500, 1000, 4 * MiB, lim) == [1000, 2000, 2500]
    assert bc.first_batch([10] * 2500, 1000, 4 * MiB, lim) == 1000


def test_cut_by_client_bytes():
    lim = _lim(MiB, 64 * MiB)
    assert bc.batch_ends([KiB] * 10, 1000, 4 * KiB, lim) == [4, 8, 10]
    assert bc.batch_ends([KiB] * 10, 1000, 4 * KiB - 1, lim) == [3, 6, 9, 10]


def test_cut_by_bookie_request_limit():
    # room for 3 KiB entries and their overhead, not 4
    request = adm.batch_overhead(3) + 3 * KiB
    lim = _lim(KiB, request)
    assert bc.batch_ends([KiB] * 7, 1000, 64 * MiB, lim) == [3, 6, 7]
    assert bc.batch_ends([KiB] * 7, 1000, 64 * MiB, _lim(KiB, request - 1)) == [2, 4, 6, 7]


def test_entry_over_client_bytes_goes_alone():
    lim = _lim(8 * MiB, 64 * MiB)
    assert bc.batch_ends([10, 5 * MiB, 10, 10], 1000, 4 * MiB, lim) == [1, 2, 4]
    assert bc.first_batch([5 * MiB, 10], 1000, 4 * MiB, lim) == 1


def test_degenerate_settings_still_progress():
    lim = _lim(MiB, 64 * MiB)
    assert bc.batch_ends([1, 2, 3], 0, 4 * MiB, lim) == [1, 2, 3]
    assert bc.batch_ends([1, 2, 3], 1000, 0, lim) == [1, 2, 3]
    assert bc.first_batch([1, 2, 3], 0, 0, _lim(0, 0)) == 1


def test_first_oversized_names_the_first_one():
    lim = _lim(100, 64 * MiB)
    assert bc.first_oversized([], lim) is None
    assert bc.first_oversized([100, 0, 99], lim) is None
    assert bc.first_oversized([1, 101, 5, 200], lim) == 1
    assert bc.first_oversized([101], lim) == 0


@st.composite
def _runs(draw):
    entry = draw(st.integers(0, 4 * KiB))
    request = draw(st.integers(0, 64 * KiB))
    max_entries = draw(st.integers(-1, 40))
    max_bytes = draw(st.integers(-1, 32 * KiB))
    sizes = draw(st.lists(st.integers(0, 6 * KiB), max_size=120))
    return sizes, max_entries, max_bytes, _lim(entry, request)


@settings(max_examples=250, deadline=None)
@given(_runs())
def test_cuts_cover_in_order_respect_limits_and_are_greedy(run):
    sizes, max_entries, max_bytes, lim = run
    ends = bc.batch_ends(sizes, max_entries, max_bytes, lim)
    # cover every payload, in order, each batch non-empty
    assert ends == sorted(set(ends))
    assert (ends[-1] if ends else 0) == len(sizes)
    starts = [0] + ends[:-1]
    for s, e in zip(starts, ends):
        assert e > s
        # every batch respects the limits (a batch of one always goes)
        assert bc.fits(e - s, sum(sizes[s:e]), max_entries, max_bytes, lim)
        if e - s > 1:
            assert e - s <= max_entries and sum(sizes[s:e]) <= max_bytes
            assert sum(sizes[s:e]) + adm.batch_overhead(e - s) <= lim.max_request_bytes
    # greedy: the same cuts as adding one entry at a time
    assert ends == _greedy(sizes, max_entries, max_bytes, lim)
    assert bc.first_batch(sizes, max_entries, max_bytes, lim) == (ends[0] if ends else 0)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(0, 300), max_size=50), st.integers(0, 300))
def test_first_oversized_is_the_first_over_the_entry_limit(sizes, entry):
    lim = _lim(entry, 64 * MiB)
    bad = [i for i, s in enumerate(sizes) if not lim.entry_fits(s)]
    assert bc.first_oversized(sizes, lim) == (bad[0] if bad else None)


def test_entry_at_the_limit_passes_the_request_check_alone():
    # what add_admission.limits guarantees: a refused-free entry fits alone
    lim = adm.limits(64 * MiB, 64 * MiB, [{"limits": {"max_entry_bytes": MiB, "max_batch_bytes": MiB}}])
    sizes = [lim.max_entry_bytes] * 3
    assert bc.first_oversized(sizes, lim) is None
    assert bc.batch_ends(sizes, 1000, 4 * MiB, lim) == [1, 2, 3]
    assert lim.max_entry_bytes <= lim.request_payload_budget(1)
