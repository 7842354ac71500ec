"""A bookie id's cookie instances: when a new one means the id's earlier
data is gone (protocol/bookie_instances.py)."""
import pytest

from pybk_spark.protocol import bookie_instances as bi


def test_first_instance_of_an_id_lost_nothing():
    h = bi.with_instance([], "i1", 10.0)
    assert h == [{"instance_id": "i1", "since": 10.0}]
    assert not bi.data_lost(h, "i1")
    assert bi.current(h) == "i1" and bi.current([]) == ""


def test_a_new_instance_after_another_lost_the_ids_data():
    h = bi.with_instance(bi.with_instance([], "i1", 10.0), "i2", 20.0)
    assert bi.data_lost(h, "i2")
    assert not bi.data_lost(h, "i1")          # the first one held all there was
    assert bi.current(h) == "i2"


def test_recording_the_newest_again_changes_nothing():
    h = bi.with_instance([], "i1", 10.0)
    assert bi.with_instance(h, "i1", 99.0) == h


def test_an_instance_recorded_twice_around_another_still_lost_data():
    h = [{"instance_id": "a", "since": 1}, {"instance_id": "b", "since": 2}]
    assert bi.data_lost(bi.with_instance(h, "c", 3), "c")
    assert bi.data_lost(h, "b")


def test_value_round_trip_keeps_the_newest():
    h: list = []
    for i in range(bi.MAX_KEPT + 5):
        h = bi.with_instance(h, f"i{i}", float(i))
    assert len(h) == bi.MAX_KEPT
    assert bi.parse(bi.value(h)) == h
    assert bi.current(h) == f"i{bi.MAX_KEPT + 4}"


def test_unreadable_values_are_no_history():
    assert bi.parse(None) == [] and bi.parse(b"") == []
    assert bi.parse(b"not json") == []
    assert bi.parse(b'{"instances": [{"since": 1}, 3]}') == []
    assert bi.instances_key("b1") == "bookies/instances/b1"


def test_an_instance_needs_an_id():
    with pytest.raises(ValueError):
        bi.with_instance([], "", 1.0)
