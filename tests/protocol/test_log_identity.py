"""A log's identity (protocol/log_identity.py): the uid comparison, how the log
metadata and registered positions carry it, and how offsets name it (pure)."""
import json
import random

from pybk_spark.protocol import log_identity, log_metadata as logmd
from pybk_spark.protocol.positions import RegisteredPosition, advance, blockers
from pybk_spark.spark import multi_offsets as mo
from pybk_spark.spark.stream_offsets import Offset, uid_of, with_uid


def test_new_uids_come_from_the_given_rng():
    assert log_identity.new_uid(random.Random(7)) == log_identity.new_uid(random.Random(7))
    rng = random.Random(7)
    first, second = log_identity.new_uid(rng), log_identity.new_uid(rng)
    assert first != second and len(first) == 32 and int(first, 16) >= 0


def test_only_two_different_uids_mean_another_log():
    assert log_identity.recreated("a", "b")
    assert not log_identity.recreated("a", "a")
    assert not log_identity.recreated(None, "b")        # an offset from before uids
    assert not log_identity.recreated("a", None)        # a log created by an older version
    assert not log_identity.recreated(None, None)
    assert log_identity.comparable("a", "b") and not log_identity.comparable(None, "b")
    text = log_identity.describe("L", "a", "b")
    assert "'L'" in text and "uid a" in text and "uid b" in text


def test_log_metadata_carries_its_uid_and_older_metadata_reads_as_before():
    md = logmd.open_as_leader(logmd.new_log("l", "u1"), (), {}, 10)
    assert md.uid == "u1" and logmd.LogMetadata.from_json(md.to_json()) == md
    legacy = logmd.open_as_leader(logmd.new_log("l"), (), {}, 10)
    assert "uid" not in json.loads(legacy.to_json())        # stored exactly as before
    assert logmd.LogMetadata.from_json(legacy.to_json()).uid is None
    rolled = logmd.roll(md, 10, 11)
    assert rolled.uid == "u1"                               # transforms keep it
    head, _ = logmd.head_from_json(logmd.head_to_json(rolled, rolled.segments, []))
    assert head.uid == "u1"


def at(index, entry, uid, name="q"):
    return RegisteredPosition("log", name, index, entry, "stream", 1.0, uid=uid)


def test_a_position_of_another_log_neither_holds_back_nor_wins():
    old, new = at(5, 3, "old"), at(0, 1, "new")
    assert advance(old, new) == new                         # the new log's place replaces it
    assert advance(at(0, 0, None), at(0, 1, "new")) == at(0, 1, "new")
    assert advance(at(2, 0, "new"), at(1, 0, "new")) == at(2, 0, "new")
    assert blockers(3, [old], "new") == []                  # another log: holds nothing back
    assert blockers(6, [old], "old") == [old]
    legacy = at(1, 0, None)
    assert blockers(3, [legacy], "new") == [legacy]         # no uid: counts as before
    assert RegisteredPosition.from_json(old.to_json()) == old
    assert RegisteredPosition.from_json(
        b'{"log": "log", "name": "q", "index": 1, "entry": 0}').uid is None


def test_offsets_name_their_log():
    d = with_uid(Offset(2, 0).to_dict(), "u1")
    assert d == {"index": 2, "entry": 0, "uid": "u1"} and uid_of(d) == "u1"
    assert Offset.from_dict(d) == Offset(2, 0)
    assert with_uid({"index": 2, "entry": 0}, None) == {"index": 2, "entry": 0}
    assert uid_of({"index": 2, "entry": 0}) is None
    multi = mo.to_dict({"a": Offset(1, 0), "b": Offset(0, 4)}, {"a": "ua"})
    assert multi == {"logs": {"a": {"index": 1, "entry": 0, "uid": "ua"},
                              "b": {"index": 0, "entry": 4}}}
    assert mo.parse(multi) == {"a": Offset(1, 0), "b": Offset(0, 4)}
    assert mo.uids(multi) == {"a": "ua", "b": None}
    recorded = {"a": "ua", "b": None, "gone": "ug"}
    assert mo.recreated_logs(recorded, {"a": "other", "b": "ub", "new": "un"}) == ["a"]
    assert mo.recreated_logs(recorded, {"a": "ua"}) == []
