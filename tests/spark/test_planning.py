"""Pure tests of the Spark source's option parsing, planning and Arrow relabelling
(no SparkSession, no cluster)."""
import itertools

import pyarrow as pa
import pytest

from pybk_spark import errors
from pybk_spark.spark.options import EARLIEST, LATEST, parse_read_options
from pybk_spark.spark.planning import LedgerView, plan_ledger, plan_slices
from pybk_spark.spark.reader import RAW_ARROW_SCHEMA, to_raw_batch

URI = "etcd://127.0.0.1:2379/pybk"
B1, B2 = ("b1", "b2", "b3"), ("b4", "b2", "b3")


# -- options -----------------------------------------------------------------------------
def test_metadata_uri_required_with_clear_message():
    with pytest.raises(errors.IncorrectParameter, match="metadataServiceUri.*required"):
        parse_read_options({"ledgers": "1"})
    with pytest.raises(errors.IncorrectParameter, match="etcd://"):
        parse_read_options({"metadataServiceUri": "http://x", "ledgers": "1"})


def test_offsets_json_may_name_the_log_by_its_uid():
    o = parse_read_options({"metadataServiceUri": URI, "log": "l",
                            "startingOffsets": '{"uid": "u1", "4": 2}',
                            "endingOffsets": '{"4": 9, "uid": "u1"}'})
    assert o.offsets_uid == "u1" and o.start_for(4) == 2 and o.end_for(4) == 9
    assert parse_read_options({"metadataServiceUri": URI, "log": "l"}).offsets_uid is None
    with pytest.raises(errors.IncorrectParameter, match="name different logs"):
        parse_read_options({"metadataServiceUri": URI, "log": "l",
                            "startingOffsets": '{"uid": "u1"}', "endingOffsets": '{"uid": "u2"}'})
    with pytest.raises(errors.IncorrectParameter, match="option 'log' only"):
        parse_read_options({"metadataServiceUri": URI, "ledgers": "4",
                            "startingOffsets": '{"uid": "u1", "4": 0}'})
    with pytest.raises(errors.IncorrectParameter, match="uid"):
        parse_read_options({"metadataServiceUri": URI, "log": "l", "startingOffsets": '{"uid": 3}'})


def test_options_are_case_insensitive_and_defaulted():
    o = parse_read_options({"METADATASERVICEURI": URI, "Ledgers": "7, 3,7"})
    assert o.metadata_uri == URI and o.ledgers == (7, 3)
    assert o.start_for(7) == EARLIEST and o.end_for(3) == LATEST and o.recovery is False


def test_offsets_json_and_words():
    o = parse_read_options({"metadataServiceUri": URI, "ledgers": "1,2",
                            "startingOffsets": '{"1": 5}', "endingOffsets": '{"2": 10, "1": -1}',
                            "recovery": "TRUE", "maxEntriesPerPartition": "50"})
    assert (o.start_for(1), o.start_for(2)) == (5, EARLIEST)
    assert (o.end_for(1), o.end_for(2)) == (LATEST, 10)
    assert o.recovery and o.max_entries_per_partition == 50
    o = parse_read_options({"metadataServiceUri": URI, "ledgers": "1", "startingOffsets": "latest"})
    assert o.start_for(1) == LATEST
    assert o.read_ahead_batches == 1
    o = parse_read_options({"metadataServiceUri": URI, "ledgers": "1", "readAheadBatches": "0"})
    assert o.read_ahead_batches == 0
    assert o.read_windows_in_flight == 3
    o = parse_read_options({"metadataServiceUri": URI, "ledgers": "1", "readWindowsInFlight": "1"})
    assert o.read_windows_in_flight == 1


@pytest.mark.parametrize("options, pattern", [
    ({}, "'ledgers', 'log'"),
    ({"ledgers": "1,x"}, "ledgers"),
    ({"ledgers": "1", "log": "a"}, "mutually exclusive"),
    ({"ledgers": "1", "startingOffsets": "first"}, "startingOffsets"),
    ({"ledgers": "1", "startingOffsets": '{"1": -3}'}, "invalid"),
    ({"ledgers": "1", "startingOffsets": '{"2": 0}'}, "not listed"),
    ({"ledgers": "1", "endingOffsets": "earliest"}, "cannot be 'earliest'"),
    ({"ledgers": "1", "endingOffsets": '{"1": "5"}'}, "integer"),
    ({"ledgers": "1", "recovery": "maybe"}, "true or false"),
    ({"ledgers": "1", "maxEntriesPerPartition": "0"}, "positive"),
    ({"ledgers": "1", "readAheadBatches": "-1"}, "readAheadBatches.*>= 0"),
    ({"ledgers": "1", "readWindowsInFlight": "0"}, "readWindowsInFlight"),
])
def test_bad_options_raise_typed_errors(options, pattern):
    with pytest.raises(errors.IncorrectParameter, match=pattern):
        parse_read_options({"metadataServiceUri": URI, **options})


# -- planning ----------------------------------------------------------------------------
def test_one_partition_per_fragment_when_fragments_are_small():
    view = LedgerView(9, ((0, 11, B1), (12, 29, B2)), 29)
    slices = plan_ledger(view, EARLIEST, LATEST, 1000)
    assert [(s.first, s.last, s.bookies) for s in slices] == [(0, 11, B1), (12, 29, B2)]


def test_open_ledger_is_planned_up_to_its_lac_only():
    view = LedgerView(9, ((0, 11, B1), (12, -1, B2)), 15)
    assert [(s.first, s.last) for s in plan_ledger(view, EARLIEST, LATEST, 1000)] == [(0, 11), (12, 15)]
    empty = LedgerView(9, ((0, -1, B1),), -1)
    assert plan_ledger(empty, EARLIEST, LATEST, 10) == []


def test_large_fragment_is_sliced_and_offsets_clip():
    view = LedgerView(1, ((0, 99, B1),), 99)
    slices = plan_ledger(view, 10, 45, 10)
    assert [(s.first, s.last) for s in slices] == [(10, 19), (20, 29), (30, 39), (40, 44)]
    assert plan_ledger(view, LATEST, LATEST, 10) == []
    assert plan_ledger(view, 200, LATEST, 10) == []


def _naive(fragments, readable_last, start, end):
    first = 0 if start == EARLIEST else readable_last + 1 if start == LATEST else start
    stop = readable_last + 1 if end == LATEST else min(end, readable_last + 1)
    out = []
    for e in range(first, stop):
        for f_first, f_last, bookies in fragments:
            if f_first <= e and (f_last < 0 or e <= f_last):
                out.append((e, bookies))
    return out


def test_plan_matches_naive_enumeration_exhaustively():
    """Every small fragment layout, readable prefix, range and slice size: the
    slices cover exactly the naive entry set, in order, inside one fragment each."""
    for bounds in ([], [3], [2, 5], [1, 2, 6]):
        starts = [0] + bounds
        for closed_last in (-1, 0, 4, 7):
            fragments = tuple(
                (s, (starts[i + 1] - 1 if i + 1 < len(starts) else closed_last), (f"b{i}",))
                for i, s in enumerate(starts))
            for readable_last in range(-1, 9):
                if closed_last >= 0 and readable_last > closed_last:
                    continue
                view = LedgerView(1, fragments, readable_last)
                for start, end, size in itertools.product(
                        [EARLIEST, LATEST, 0, 2, 5, 9], [LATEST, 0, 1, 4, 8, 20], [1, 2, 3, 100]):
                    got = [(e, s.bookies) for s in plan_ledger(view, start, end, size)
                           for e in range(s.first, s.last + 1)]
                    assert got == _naive(fragments, readable_last, start, end), \
                        (fragments, readable_last, start, end, size)
                    assert all(s.num_entries <= size for s in plan_ledger(view, start, end, size))


def test_plan_slices_keeps_ledger_order():
    views = [LedgerView(5, ((0, 2, B1),), 2), LedgerView(3, ((0, 1, B2),), 1)]
    assert [s.ledger_id for s in plan_slices(views, [EARLIEST] * 2, [LATEST] * 2, 10)] == [5, 3]


# -- Arrow relabelling ---------------------------------------------------------------------------
def test_to_raw_batch_casts_and_relabels_exactly():
    src = pa.RecordBatch.from_arrays(
        [pa.array([1, 1], pa.int32()), pa.array([0, 1], pa.int64()), pa.array([b"a", b"b"], pa.large_binary()),
         pa.array([7, 7], pa.int64())],
        schema=pa.schema([pa.field("ledger_id", pa.int32(), nullable=False),
                          pa.field("entry_id", pa.int64(), nullable=False),
                          pa.field("payload", pa.large_binary()), pa.field("lac", pa.int64())]))
    from pybk_spark.logs.log_reader import with_append_time
    out = to_raw_batch(with_append_time(src, {}))     # a ledger without append times
    assert out.schema.equals(RAW_ARROW_SCHEMA, check_metadata=True)
    assert out.column(2).to_pylist() == [b"a", b"b"]
    assert out.column(3).to_pylist() == [None, None]


def test_load_path_is_shorthand_for_ledgers_and_user_schema_must_be_raw():
    from pyspark.sql.types import LongType, StructField, StructType
    from pybk_spark.spark.reader import RAW_SCHEMA, check_schema
    assert parse_read_options({"metadataServiceUri": URI, "path": "4,5"}).ledgers == (4, 5)
    check_schema(RAW_SCHEMA)
    with pytest.raises(errors.IncorrectParameter, match="ledger_id long, entry_id long, payload binary"):
        check_schema(StructType([StructField("entry_id", LongType())]))


# -- minPartitions -------------------------------------------------------------------------
def test_split_to_min_is_proportional_gap_free_and_keeps_order():
    from pybk_spark.spark.planning import Slice, split_to_min
    slices = [Slice(1, 0, 89, B1), Slice(1, 90, 99, B2), Slice(2, 5, 5, B1)]
    out = split_to_min(slices, 10)
    assert len(out) >= 10
    for ledger in (1, 2):
        mine = [s for s in out if s.ledger_id == ledger]
        entries = [e for s in mine for e in range(s.first, s.last + 1)]
        want = [e for s in slices if s.ledger_id == ledger for e in range(s.first, s.last + 1)]
        assert entries == want                                  # no gap, no duplicate, ascending
    assert all(s.bookies == B2 for s in out if s.ledger_id == 1 and s.first >= 90)
    assert [s.ledger_id for s in out] == sorted(s.ledger_id for s in out)
    assert split_to_min(slices, 2) == slices and split_to_min(slices, None) == slices
    tiny = [Slice(3, 0, 2, B1)]
    assert split_to_min(tiny, 8) == [Slice(3, e, e, B1) for e in range(3)]   # one per entry at most


def test_planning_reaches_etcd_with_the_etcd_settings_given_as_bk_options(tmp_path):
    """``bk.etcd_*`` options reach the planner's metadata store, as they reach
    the executors' clients (opening the store does not connect yet)."""
    from pybk_spark.spark.reader import PlanningClient
    secret = tmp_path / "pw"
    secret.write_text("s3cret\n")
    pc = PlanningClient("etcd://127.0.0.1:1/pybk",
                        (("etcd_password_file", str(secret)), ("etcd_user", "alice")))
    try:
        assert pc.metadata_store.security.etcd_user == "alice"
        assert pc.metadata_store.security.etcd_password_file == str(secret)
    finally:
        pc.close()
