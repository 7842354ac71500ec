"""plan_chunks: how a long log's whole list is laid out over its head and
immutable chunks (protocol/log_metadata.py, "Chunks")."""
from __future__ import annotations

from pybk_spark.protocol import log_metadata as logmd
from pybk_spark.protocol.log_metadata import CHUNK_SEGMENTS, SEAL_AFTER, ChunkRef, Segment


def segs(first: int, n: int, state: str = logmd.SEGMENT_CLOSED) -> tuple[Segment, ...]:
    return tuple(Segment(lid, state, 10, 100, 10 * (lid - 1), 1) for lid in range(first, first + n))


def ref(key: str, chunk: tuple[Segment, ...]) -> ChunkRef:
    return ChunkRef(key, len(chunk), chunk[0].ledger_id, chunk[-1].ledger_id)


def test_a_short_list_stays_in_the_head():
    plan = logmd.plan_chunks(segs(1, SEAL_AFTER), [])
    assert plan.chunks == () and plan.dropped == () and len(plan.tail) == SEAL_AFTER
    assert not plan.changed


def test_a_long_tail_seals_its_oldest_closed_segments():
    whole = segs(1, SEAL_AFTER + 1)
    plan = logmd.plan_chunks(whole, [])
    assert plan.chunks == (whole[:CHUNK_SEGMENTS],) and plan.tail == whole[CHUNK_SEGMENTS:]
    longer = segs(1, SEAL_AFTER + CHUNK_SEGMENTS + 1)
    assert logmd.plan_chunks(longer, []).chunks == (longer[:CHUNK_SEGMENTS],
                                                    longer[CHUNK_SEGMENTS:2 * CHUNK_SEGMENTS])
    assert plan.changed


def test_an_open_segment_is_never_sealed():
    whole = segs(1, 10) + segs(11, 1, logmd.SEGMENT_OPEN) + segs(12, SEAL_AFTER + 500)
    assert logmd.plan_chunks(whole, []).chunks == ()


def test_unchanged_chunks_are_kept_and_only_the_head_changes():
    a, b = segs(1, CHUNK_SEGMENTS), segs(1 + CHUNK_SEGMENTS, CHUNK_SEGMENTS)
    old = [(ref("a", a), a), (ref("b", b), b)]
    plan = logmd.plan_chunks(a + b + segs(5000, 7), old)
    assert plan.chunks == (ref("a", a), ref("b", b)) and plan.dropped == ()
    assert [s.ledger_id for s in plan.tail] == list(range(5000, 5007)) and not plan.changed


def test_truncation_drops_whole_chunks_and_reseals_the_rest_of_a_cut_one():
    a, b, c = segs(1, 1000), segs(1001, 1000), segs(2001, 1000)
    old = [(ref("a", a), a), (ref("b", b), b), (ref("c", c), c)]
    plan = logmd.plan_chunks(b[400:] + c + segs(3001, 5), old)
    assert plan.dropped == (ref("a", a), ref("b", b))
    assert plan.chunks == (b[400:], ref("c", c)) and len(plan.tail) == 5


def test_an_overwrite_drops_every_chunk():
    a, b = segs(1, 1000), segs(1001, 1000)
    old = [(ref("a", a), a), (ref("b", b), b)]
    plan = logmd.plan_chunks(segs(9000, 3), old)
    assert plan.dropped == (ref("a", a), ref("b", b)) and plan.chunks == ()
    assert [s.ledger_id for s in plan.tail] == [9000, 9001, 9002]


def test_a_segment_changed_in_place_reseals_its_chunk_and_keeps_the_later_ones():
    """An offload record added to a sealed segment: the same ledgers, so only
    that chunk is sealed anew."""
    a, b = segs(1, 1000), segs(1001, 1000)
    old = [(ref("a", a), a), (ref("b", b), b)]
    changed = a[:10] + (Segment(11, logmd.SEGMENT_CLOSED, 99, 100, 100, 1),) + a[11:] + b
    plan = logmd.plan_chunks(changed, old)
    assert plan.dropped == (ref("a", a),) and plan.tail == ()
    assert plan.chunks == (changed[:1000], ref("b", b))


def test_a_chunk_whose_ledgers_changed_relays_it_and_every_later_one():
    a, b = segs(1, 1000), segs(1001, 1000)
    old = [(ref("a", a), a), (ref("b", b), b)]
    changed = a[:10] + (Segment(5000, logmd.SEGMENT_CLOSED, 99, 100, 100, 1),) + a[11:] + b
    plan = logmd.plan_chunks(changed, old)
    assert plan.dropped == (ref("a", a), ref("b", b)) and plan.tail == changed
    assert plan.chunks == ()


def test_head_layout_round_trips_and_a_chunkless_head_is_the_old_value():
    md = logmd.LogMetadata("events", segs(1, 3), epoch=4)
    assert logmd.head_to_json(md, md.segments, []) == md.to_json()
    a = segs(1, 1000)
    head = logmd.head_to_json(md, segs(1001, 2), [ref("k", a)])
    got, refs = logmd.head_from_json(head)
    assert refs == (ref("k", a),) and got.epoch == 4 and len(got.segments) == 2
    assert logmd.chunk_from_json(logmd.chunk_to_json(a)) == a


def test_code_before_chunks_finds_a_chunked_head_corrupt_not_short():
    """The old reader was LogMetadata.from_json on the key's value."""
    import pytest
    from pybk_spark import errors
    md = logmd.LogMetadata("events", segs(1001, 2))
    head = logmd.head_to_json(md, md.segments, [ref("k", segs(1, 1000))])
    with pytest.raises(errors.MetadataError):
        logmd.LogMetadata.from_json(head)


def test_one_change_seals_at_most_two_chunks():
    """A one-value log of 8,000 segments (written before chunks) shrinks over
    its next changes, each request about the size of the value it replaces."""
    whole = segs(1, 8_000)
    plan = logmd.plan_chunks(whole, [])
    assert len(plan.chunks) == logmd.MAX_SEALS_PER_CHANGE == 2 and len(plan.tail) == 6_000
