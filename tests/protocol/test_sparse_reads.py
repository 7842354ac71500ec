"""The windowed sparse-read plan against a naive bookie (pure)."""
import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from pybk_spark.protocol.sparse_reads import LIMIT, SparseReadWindow, wanted_rows


def test_wanted_rows_matches_isin():
    wanted = np.array([2, 3, 7, 11], np.int64)
    eids = np.array([1, 2, 3, 4, 7, 11, 12], np.int64)
    assert wanted_rows(eids, wanted).tolist() == np.isin(eids, wanted).tolist()
    assert wanted_rows(eids, np.empty(0, np.int64)).tolist() == [False] * len(eids)


def test_spans_cut_by_max_entries_and_window_bounds_flight():
    win: SparseReadWindow = SparseReadWindow(np.array([3, 4, 10, 25], np.int64), 10, 2)
    sent = []
    win.fill(lambda a, b: sent.append((a, b)) or len(sent))
    assert sent == [(3, 12), (13, 22)]               # at most ``window`` in flight
    assert win.finished(1) == (3, 12)
    win.fill(lambda a, b: sent.append((a, b)) or len(sent))
    assert sent[-1] == (23, 25)                       # the last span ends at the last id
    assert sorted(win.abandon()) == [2, 3] and not win.busy


@given(st.lists(st.integers(0, 200), min_size=1, unique=True),
       st.lists(st.integers(0, 200), unique=True),
       st.integers(1, 30), st.integers(1, 12), st.integers(1, 4))
def test_every_stored_wanted_id_comes_back_once(wanted, stored, max_entries, cap, window):
    """A bookie that answers at most ``cap`` stored rows per read (LIMIT when
    it stopped early): the plan gets every wanted id it stores, once."""
    wanted_a = np.array(sorted(wanted), np.int64)
    held = np.array(sorted(stored), np.int64)
    win: SparseReadWindow = SparseReadWindow(wanted_a, max_entries, window)
    answers: dict[int, tuple[np.ndarray, str]] = {}

    def send(a, b):
        rows = held[(held >= a) & (held <= b)]
        answers[len(answers)] = (rows[:cap], LIMIT if len(rows) > cap else "COMPLETE")
        return len(answers) - 1

    got: list[int] = []
    while win.busy:
        win.fill(send)
        assert len(win.inflight) <= window
        req = min(win.inflight)
        span = win.finished(req)
        eids, end = answers[req]
        assert all(span[0] <= e <= span[1] for e in eids)
        if len(eids):
            got += eids[win.answered(span, eids, end)].tolist()
    assert sorted(got) == sorted(set(wanted) & set(stored))    # each once, in any order
