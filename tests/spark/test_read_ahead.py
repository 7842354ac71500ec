"""read_ahead (pybk_spark/spark/read_ahead.py): same items, same order, the
source's exception in its place, and an early close stops the helper thread
and runs the source's finally blocks.  No timing assertions: the tests
synchronise on events only."""
from __future__ import annotations

import threading

import pytest

from pybk_spark.spark.read_ahead import read_ahead


def _helpers() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "pybk-read-ahead"]


@pytest.mark.parametrize("depth", [1, 2, 5])
def test_items_come_out_in_order_exactly_once(depth):
    assert list(read_ahead(iter(range(1000)), depth)) == list(range(1000))
    assert not _helpers()


def test_depth_zero_is_the_source_itself():
    source = iter([1, 2])
    assert read_ahead(source, 0) is source


def test_the_sources_exception_comes_after_the_items_before_it():
    def source():
        yield 1
        yield 2
        raise KeyError("boom")

    got = []
    with pytest.raises(KeyError, match="boom"):
        for item in read_ahead(source(), 1):
            got.append(item)
    assert got == [1, 2]
    assert not _helpers()


def test_closing_early_stops_the_helper_and_closes_the_source():
    closed = threading.Event()
    produced = []

    def source():
        try:
            for i in range(10_000):
                produced.append(i)
                yield i
        finally:
            closed.set()

    it = read_ahead(source(), 2)
    assert next(it) == 0
    it.close()                      # what Spark does after a LIMIT is satisfied
    assert closed.is_set()
    assert not _helpers()
    assert len(produced) < 10_000   # the helper stopped at a hand-over


def test_a_consumer_that_never_starts_starts_no_thread():
    read_ahead(iter(range(3)), 1)
    assert not _helpers()
