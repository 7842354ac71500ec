"""Option names: unknown and misplaced options are refused on the driver,
naming the closest valid option (pure; no cluster)."""
import pytest

from pybk_spark import errors
from pybk_spark.spark.option_names import BATCH_READ, BATCH_WRITE, STREAM_READ, STREAM_WRITE
from pybk_spark.spark.options import (parse_load_options, parse_read_options,
                                      parse_stream_options)
from pybk_spark.spark.write_options import parse_write_options

URI = "etcd://127.0.0.1:2379/pybk"


def refused(parse, options, *fragments, **kw):
    with pytest.raises(errors.IncorrectParameter) as info:
        parse({"metadataServiceUri": URI, **options}, **kw)
    for fragment in fragments:
        assert fragment in str(info.value), str(info.value)
    return str(info.value)


def test_unknown_option_is_refused_with_closest_name():
    refused(parse_read_options, {"ledgers": "1", "bogusOption": "1"},
            "unknown option 'bogusOption'", "valid options:")
    refused(parse_read_options, {"ledgers": "1", "maxEntriesPerPartiton": "5"},
            "did you mean 'maxEntriesPerPartition'")
    refused(parse_write_options, {"log": "x", "ensembleSise": "3"}, "did you mean 'ensembleSize'")
    refused(parse_write_options, {"log": "x", "writequorom": "2"}, "did you mean 'writeQuorum'")
    refused(parse_stream_options, {"log": "x", "maxEntriesPerTriger": "9"},
            "did you mean 'maxEntriesPerTrigger'")


def test_names_are_case_insensitive_as_spark_passes_them():
    lowered = {k.lower(): v for k, v in {"metadataServiceUri": URI, "ledgers": "1",
                                         "readBatchEntries": "5"}.items()}
    assert parse_read_options(lowered).read_batch_entries == 5
    message = refused(parse_read_options, {"ledgers": "1", "endingoffsetz": "latest"})
    assert "did you mean 'endingOffsets'" in message


def test_options_of_another_operation_are_refused_where_they_do_not_apply():
    refused(parse_read_options, {"ledgers": "1", "maxEntriesPerTrigger": "5"},
            "'maxEntriesPerTrigger' applies to stream reads only, not to batch reads")
    refused(parse_stream_options, {"log": "x", "endingOffsets": "latest"},
            "'endingOffsets' applies to batch reads only, not to stream reads")
    refused(parse_stream_options, {"ledgers": "1"}, "'ledgers' applies to batch reads only")
    refused(parse_stream_options, {"log": "x", "recovery": "true"}, "'recovery'")
    refused(parse_write_options, {"log": "x", "checkpointLocation": "/tmp/c"},
            "applies to stream writes only, not to batch writes")
    refused(parse_write_options, {"log": "x", "ledgers": "1"}, "'ledgers' applies to batch reads")
    refused(parse_read_options, {"ledgers": "1", "ensembleSize": "3"},
            "'ensembleSize' applies to batch writes and stream writes only")


def test_spark_own_options_are_accepted_where_spark_passes_them():
    assert parse_read_options({"metadataServiceUri": URI, "path": "4"}).ledgers == (4,)
    assert parse_write_options({"metadataServiceUri": URI, "path": "events"}).log == "events"
    w = parse_write_options({"metadataServiceUri": URI, "log": "x", "checkpointlocation": "/c",
                             "queryname": "q"}, streaming=True)
    assert w.sink_id == "/c"


def test_load_accepts_either_read_and_refuses_a_mix():
    assert parse_load_options({"metadataServiceUri": URI, "log": "x",
                               "startingOffsets": '{"index": 0, "entry": 3}'}).log == "x"
    assert parse_load_options({"metadataServiceUri": URI, "log": "x",
                               "maxEntriesPerTrigger": "5"}).log == "x"
    refused(parse_load_options, {"log": "x", "maxEntriesPerTrigger": "5", "ledgers": "1"},
            "a read cannot have both")
    refused(parse_load_options, {"log": "x", "maxEntriesPerTrigger": "0"},
            "'maxEntriesPerTrigger' must be a positive integer")
    refused(parse_load_options, {"log": "x", "startingOffsets": "{bad"}, "'startingOffsets'")
    refused(parse_load_options, {"log": "x", "bogus": "1"}, "unknown option 'bogus'")
    refused(parse_load_options, {"log": "x", "ackQuorum": "1"}, "not to reads")


def test_types_and_ranges_are_checked():
    refused(parse_read_options, {"ledgers": "1", "readBatchBytes": "0"}, "'readBatchBytes'")
    refused(parse_read_options, {"ledgers": "1", "recovery": "maybe"}, "true or false")
    refused(parse_read_options, {"ledgers": "x"}, "'ledgers'")
    refused(parse_write_options, {"log": "x", "ackQuorum": "3"}, "ackQuorum <= writeQuorum")
    refused(parse_write_options, {"log": "x", "maxBytesPerEntry": str(64 << 20)},
            "'maxBytesPerEntry' must be <=")


def test_catalogue_is_documented():
    from pathlib import Path
    doc = (Path(__file__).resolve().parents[2] / "docs" / "spark.md").read_text()
    for name in set(BATCH_READ + STREAM_READ + BATCH_WRITE + STREAM_WRITE):
        assert f"`{name}`" in doc, f"option {name} is not in docs/spark.md"


def test_client_settings_prefix_maps_onto_client_config():
    o = parse_read_options({"metadataServiceUri": URI, "ledgers": "1",
                            "bk.read_timeout_s": "9", "BK.Read_Transport": "grpc"})
    assert dict(o.client_conf) == {"read_timeout_s": "9", "read_transport": "grpc"}
    assert dict(parse_stream_options({"metadataServiceUri": URI, "log": "x",
                                      "bk.placement_policy": "random"}).read.client_conf) == {
        "placement_policy": "random"}
    assert dict(parse_write_options({"metadataServiceUri": URI, "log": "x",
                                     "bk.add_timeout_s": "2"}).client_conf) == {
        "add_timeout_s": "2"}
    refused(parse_read_options, {"ledgers": "1", "bk.read_timout_s": "1"},
            "option 'bk.read_timout_s'", "did you mean 'bk.read_timeout_s'")
    refused(parse_load_options, {"log": "x", "bk.read_timeout_s": "soon"}, "bad value 'soon'")


def test_sql_table_options_are_folded():
    # CREATE TABLE ... OPTIONS (log 'x') reaches the source as both 'log' and 'option.log'
    o = parse_load_options({"metadataserviceuri": URI, "option.metadataserviceuri": URI,
                            "log": "x", "option.log": "x", "option.includemetadata": "true",
                            "provider": "bookkeeper"})
    assert o.log == "x" and o.include_metadata


def test_streams_take_logs_and_log_pattern():
    s = parse_stream_options({"metadataServiceUri": URI, "logPattern": "ev.*",
                              "maxEntriesPerTrigger": "4"})
    assert s.read.log_pattern == "ev.*" and s.max_entries_per_trigger == 4
    s = parse_stream_options({"metadataServiceUri": URI, "logs": "a,b",
                              "startingOffsets": '{"a": {"index": 1, "entry": 2}}'})
    assert s.read.logs == ("a", "b") and s.starting == '{"a": {"index": 1, "entry": 2}}'
    refused(parse_stream_options, {"logs": "a,b", "startingOffsets": '{"index": 1, "entry": 2}'},
            "'logs'/'logPattern'", '{"<log>"')
    refused(parse_stream_options, {"logs": "a", "log": "b"}, "mutually exclusive")
    refused(parse_stream_options, {"ledgers": "1"}, "'ledgers' applies to batch reads only")
    assert parse_load_options({"metadataServiceUri": URI, "logs": "a,b",
                               "maxTriggerDelay": "1m"}).logs == ("a", "b")


READ_BOOLEANS = {"recovery": lambda o: o.recovery,
                 "includeMetadata": lambda o: o.include_metadata,
                 "failOnDataLoss": lambda o: o.fail_on_data_loss,
                 "operator": lambda o: dict(o.client_conf)["operator"] == "true"}
WRITE_BOOLEANS = {"mergeSchema": lambda o: o.merge_schema,
                  "operator": lambda o: dict(o.client_conf)["operator"] == "true"}


@pytest.mark.parametrize("parse, base, booleans", [
    (parse_read_options, {"ledgers": "1"}, READ_BOOLEANS),
    (parse_write_options, {"log": "x"}, WRITE_BOOLEANS),
])
def test_boolean_options_take_exactly_true_or_false(parse, base, booleans):
    for name, value_of in booleans.items():
        for text, want in (("true", True), ("FALSE", False), (" True ", True), ("false", False)):
            assert value_of(parse({"metadataServiceUri": URI, **base, name: text})) is want
        for text in ("yes", "no", "1", "0", "on", ""):
            message = refused(parse, {**base, name: text},
                              f"option {name!r} must be true or false (case-insensitive), "
                              f"not {text!r}")
            assert "\n" not in message
