"""Pure multi-log offsets and fair admission (no I/O)."""
import itertools

import pytest

from pybk_spark import errors
from pybk_spark.spark import multi_offsets as mo
from pybk_spark.spark.stream_offsets import Extent, Offset, count, ranges


def test_offset_map_round_trips_sorted_and_refuses_the_single_log_form():
    offsets = {"b": Offset(1, 2), "a": Offset(0, 5)}
    d = mo.to_dict(offsets)
    assert list(d["logs"]) == ["a", "b"]                # one JSON per offset value
    assert mo.parse(d) == offsets
    with pytest.raises(errors.IncorrectParameter, match="single-log offset"):
        mo.parse({"index": 0, "entry": 0, "stream": "stream-x"})
    with pytest.raises(errors.IncorrectParameter):
        mo.parse({"logs": {"a": {"index": -1, "entry": 0}}})


def test_starting_offsets_json_names_logs():
    assert mo.parse_starting('{"a": {"index": 2, "entry": 3}}') == {"a": Offset(2, 3)}
    for bad in ('{"index": 2, "entry": 3}', "[]", "{}", "nope"):
        with pytest.raises(errors.IncorrectParameter, match="startingOffsets"):
            mo.parse_starting(bad)


def test_reconcile_new_logs_start_at_their_first_entry_and_gone_logs_are_named():
    begins, gone = mo.reconcile({"a": Offset(3, 1), "old": Offset(0, 0)}, ["a", "new"],
                                {"a": Offset(0, 0), "new": Offset(4, 0)})
    assert begins == {"a": Offset(3, 1), "new": Offset(4, 0)} and gone == ["old"]


def naive_shares(demands, budget):
    """Max-min fairness by handing out one unit at a time (the dumb alternative)."""
    shares = {n: 0 for n in demands}
    for _ in range(budget):
        open_ = [n for n in demands if shares[n] < demands[n]]
        if not open_:
            break
        least = min(shares[n] for n in open_)
        pick = sorted((n for n in open_ if shares[n] == least),
                      key=lambda n: (-(demands[n] - shares[n]), n))[0]
        shares[pick] += 1
    return shares


def test_integral_fair_shares_match_one_at_a_time_handout():
    for demands in itertools.product(range(0, 5), repeat=3):
        d = dict(zip("abc", demands))
        for budget in range(0, 14):
            got = mo.fair_shares(d, budget, integral=True)
            want = naive_shares(d, budget)
            assert sorted(got.values()) == sorted(want.values()), (d, budget)
            assert sum(got.values()) == min(budget, sum(demands))
            assert all(got[n] <= d[n] for n in d)


def test_no_limit_and_fractional_shares():
    assert mo.fair_shares({"a": 5, "b": 1}, None) == {"a": None, "b": None}
    assert mo.fair_shares({"a": 100.0, "b": 10.0}, 50.0) == {"a": 40.0, "b": 10.0}


EXTENTS = {"a": [Extent(0, 1, 10, True, 1000), Extent(1, 2, 5, False)],
           "b": [Extent(0, 3, 3, True, 300)],
           "idle": [Extent(2, 4, 4, True, 40)]}
BEGINS = {"a": Offset(0, 0), "b": Offset(0, 0), "idle": Offset(2, 4)}
AVG = {"a": 100.0, "b": 100.0, "idle": 10.0}


def test_plan_ends_shares_the_entry_budget_and_no_log_starves():
    ends = mo.plan_ends(BEGINS, EXTENTS, AVG, max_entries=4)
    assert ends == {"a": Offset(0, 2), "b": Offset(0, 2), "idle": Offset(3, 0)}
    pos, taken = dict(BEGINS), {n: 0 for n in BEGINS}
    for _ in range(20):                    # one entry per trigger: the logs take turns
        nxt = mo.plan_ends(pos, EXTENTS, AVG, max_entries=1)
        moved = [n for n in pos if count(pos[n], nxt[n], EXTENTS[n])]
        assert len(moved) <= 1
        for n in moved:
            taken[n] += 1
        for n in pos:                      # gap-free: ranges are well defined
            ranges(pos[n], nxt[n], EXTENTS[n])
        pos = nxt
    assert taken["b"] == 3 and taken["a"] == 15      # b done; a takes the rest


def test_plan_ends_without_limits_reads_everything_readable():
    ends = mo.plan_ends(BEGINS, EXTENTS, AVG)
    assert ends == {"a": Offset(1, 5), "b": Offset(1, 0), "idle": Offset(3, 0)}


def test_plan_ends_byte_budget_is_shared():
    ends = mo.plan_ends(BEGINS, EXTENTS, AVG, max_bytes=400)
    assert ends == {"a": Offset(0, 2), "b": Offset(0, 2), "idle": Offset(3, 0)}
