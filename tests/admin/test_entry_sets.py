"""The order both copy paths read a lost slot's ids from replicas (pure)."""

import numpy as np

from pybk_spark.admin.decisions import entry_sets as es
from pybk_spark.protocol.distribution import write_set


def _walk(sources, remaining, answers):
    """Drive ``sources`` like a copy loop: ``answers(slot, ids)`` -> ids copied."""
    asked = []
    while (nxt := sources.next(remaining)) is not None:
        slot, ids = nxt
        asked.append((slot, ids.tolist()))
        remaining = np.setdiff1d(remaining, answers(slot, ids))
    return asked, remaining


def test_lost_bookie_first_then_largest_holder():
    E, Qw = 4, 3
    needed = es.slot_entries(0, 19, E, Qw, 1)
    asked, left = _walk(es.ReplicaSources(E, Qw, 1, lost_first=True), needed,
                        lambda slot, ids: ids[:3] if slot == 1 else ids)
    assert asked[0] == (1, needed.tolist())          # the whole set asked of the lost bookie
    assert all(slot != 1 for slot, _ in asked[1:])   # never asked again
    assert len(left) == 0


def test_without_the_lost_bookie_every_survivor_once_at_most():
    E, Qw = 5, 3
    needed = es.slot_entries(0, 49, E, Qw, 2)
    asked, left = _walk(es.ReplicaSources(E, Qw, 2, lost_first=False), needed,
                        lambda slot, ids: ids[::2])   # each source copies half
    slots = [slot for slot, _ in asked]
    assert 2 not in slots and len(slots) == len(set(slots))
    for slot, ids in asked:
        assert all(slot in write_set(x, E, Qw) for x in ids)
    expect = es.next_source(needed, E, Qw, {2})
    assert expect is not None and asked[0] == (expect[0], expect[1].tolist())
    assert len(left) > 0                            # the survivors ran out


def test_nothing_remaining_asks_nobody():
    sources = es.ReplicaSources(3, 2, 0, lost_first=True)
    assert sources.next(np.empty(0, np.int64)) is None
    assert sources.tried == set()


def test_ids_left_after_a_pull():
    from pybk_spark.admin.operations.bookie_copy import _left_after
    ids = np.arange(0, 20, 2, dtype=np.int64)
    none = np.empty(0, np.int64)
    assert _left_after(ids, ids, none).tolist() == []
    assert _left_after(ids, ids, np.array([4, 8])).tolist() == [4, 8]
    assert _left_after(ids, ids[::2], none).tolist() == [2, 6, 10, 14, 18]
    assert _left_after(ids, ids[::2], np.array([0, 12])).tolist() == [0, 2, 6, 10, 12, 14, 18]
