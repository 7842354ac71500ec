"""protocol/offload.py: which segments a policy offloads, the commit and
deletion transforms, the record's JSON, and chunks re-sealed in place."""
from dataclasses import replace

import pytest

from pybk_spark import errors
from pybk_spark.protocol import log_metadata as logmd
from pybk_spark.protocol import offload
from pybk_spark.protocol.offload_record import (STATE_LEDGER_DELETED, OffloadFile,
                                                SegmentOffload)

S = 1_000_000


def log(n, times=True):
    segs = tuple(logmd.Segment(i, logmd.SEGMENT_CLOSED, 10, 100,
                               first_time_us=i * 10 * S if times else -1,
                               last_time_us=(i * 10 + 5) * S if times else -1)
                 for i in range(1, n + 1))
    return logmd.LogMetadata("l", segments=segs)


def record(entries=10, committed_us=0):
    return SegmentOffload("/tmp/x", "l/u", (OffloadFile("a.parquet", 5, "ab", entries, 0,
                                                        entries - 1),),
                          0, entries - 1, entries, "dd", committed_us=committed_us)


def test_candidates_keep_the_newest_and_follow_age_and_size_rules():
    md = log(6)
    assert offload.candidates(md, offload.OffloadPolicy(), 0) == [1, 2, 3, 4]
    assert offload.candidates(md, offload.OffloadPolicy(keep_segments=4), 0) == [1, 2]
    # last append times 15 s, 25 s, ...: at 40 s, those at least 20 s old
    assert offload.candidates(md, offload.OffloadPolicy(min_age_s=20), 40 * S) == [1]
    # keep 300 newest bytes on bookies: 2 kept segments (200) + segment 4 (300)
    assert offload.candidates(md, offload.OffloadPolicy(keep_bytes=300), 0) == [1, 2, 3]
    done = offload.commit(md, 1, record())
    assert offload.candidates(done, offload.OffloadPolicy(), 0) == [2, 3, 4]
    with pytest.raises(errors.IncorrectParameter):
        offload.OffloadPolicy(keep_segments=1)


def test_commit_is_idempotent_and_refuses_what_does_not_match():
    md = log(4)
    once = offload.commit(md, 2, record())
    assert once.segments[1].offload is not None
    assert offload.commit(once, 2, replace(record(), digest="other")) == once
    with pytest.raises(errors.LogTruncated):
        offload.commit(md, 99, record())
    with pytest.raises(errors.IllegalOp):
        offload.commit(md, 2, record(entries=9))


def test_deletion_waits_for_the_grace_period():
    md = offload.commit(log(4), 1, record(committed_us=100 * S))
    assert offload.deletable(md, 60, 159 * S) == []
    assert offload.deletable(md, 60, 160 * S) == [1]
    gone = offload.mark_ledger_deleted(md, 1)
    assert gone.segments[0].offload.state == STATE_LEDGER_DELETED
    assert offload.deletable(gone, 60, 999 * S) == []
    assert offload.status(gone)["ledgers_deleted"] == 1


def test_the_record_round_trips_through_the_logs_json():
    md = offload.commit(log(3), 1, record())
    assert logmd.LogMetadata.from_json(md.to_json()) == md
    assert "offload" not in logmd.LogMetadata.from_json(log(3).to_json()).segments[0].to_dict()
    with pytest.raises(errors.MetadataError):
        SegmentOffload.from_dict({"state": "gone"})


def test_a_chunk_whose_segments_changed_in_place_is_sealed_anew():
    segs = log(logmd.SEAL_AFTER + 1, times=False).segments
    first = logmd.plan_chunks(segs, [])
    assert len(first.chunks) == 1
    ref = logmd.ChunkRef("k0", logmd.CHUNK_SEGMENTS, 1, logmd.CHUNK_SEGMENTS)
    old = [(ref, first.chunks[0])]
    changed = list(segs)
    changed[5] = replace(changed[5], offload=record())
    plan = logmd.plan_chunks(changed, old)
    assert plan.dropped == (ref,)
    assert plan.chunks == (tuple(changed[:logmd.CHUNK_SEGMENTS]),)
    assert plan.tail == tuple(changed[logmd.CHUNK_SEGMENTS:])


def test_a_logs_own_policy_is_its_properties_and_wins_over_the_runs():
    run = offload.OffloadPolicy(keep_segments=2, min_age_s=7, grace_s=0, orphan_age_s=1)
    md = log(6)
    assert offload.log_policy(md, run) is None and offload.policy_for(md, run) == run
    md = offload.with_log_policy(md, keep_segments=4)
    assert dict(md.properties) == {offload.POLICY_KEEP_SEGMENTS: "4",
                                   offload.POLICY_MIN_AGE_S: "0.0",
                                   offload.POLICY_KEEP_BYTES: "-1"}
    own = offload.policy_for(md, run)
    assert (own.keep_segments, own.min_age_s, own.keep_bytes, own.grace_s, own.orphan_age_s) == \
        (4, 0.0, -1, 0, 1)                       # the log's rules, the run's grace and orphan age
    assert offload.candidates(md, own, 100 * S) == [1, 2]
    md = offload.with_log_policy(md, keep_bytes=450)         # the other rules stay
    assert offload.policy_dict(offload.policy_for(md, run)) == {
        "keep_segments": 4, "min_age_s": 0.0, "keep_bytes": 450}
    assert offload.candidates(md, offload.policy_for(md, run), 100 * S) == [1]
    assert offload.log_policy(offload.with_log_policy(md, clear=True), run) is None


def test_a_bad_log_policy_is_refused_naming_the_rule():
    with pytest.raises(errors.IncorrectParameter, match="keep_segments 1: at least 2"):
        offload.with_log_policy(log(3), keep_segments=1)
    with pytest.raises(errors.IncorrectParameter, match="keep_bytes -5"):
        offload.with_log_policy(log(3), keep_bytes=-5)
    bad = replace(log(3), properties={offload.POLICY_MIN_AGE_S: "soon"})
    with pytest.raises(errors.IncorrectParameter, match="'offload.min_age_s' = 'soon'"):
        offload.log_policy(bad, offload.OffloadPolicy())
    with pytest.raises(errors.IncorrectParameter, match="'offload.min_age_s' = 'soon'"):
        offload.with_log_policy(bad, keep_segments=3)
    fixed = offload.with_log_policy(bad, min_age_s=60)
    assert offload.policy_dict(offload.policy_for(fixed, offload.OffloadPolicy())) == {
        "keep_segments": 2, "min_age_s": 60.0, "keep_bytes": -1}
