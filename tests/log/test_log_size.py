"""A long log: its head names immutable chunks of its older segments
(protocol/log_metadata.py, "Chunks"), so it grows past etcd's request limit
(one value of ~190 bytes a segment is refused at ~8,300 segments)."""
from __future__ import annotations

import logging
import random
import threading

import pytest

from pybk_spark import errors
from pybk_spark.logs.log import delete_log_metadata, read_log, read_or_create_log, update_log
from pybk_spark.metadata import keys, open_store
from pybk_spark.protocol import log_metadata as logmd
from pybk_spark.testing.fixtures import unique_scope

T0 = 1_764_200_000_000_000
RNG = random.Random(20261128)          # new logs' uids


def _append(store, first: int, n: int, name: str = "events", **kw):
    ledgers = [(lid, 10, 1_000_000, 10_000) for lid in range(first, first + n)]
    times = {lid: (T0 + lid, T0 + lid + 5) for lid, *_ in ledgers}
    return update_log(store, name, lambda md: logmd.append_closed(md, ledgers, times=times,
                                                                  **kw)[0])


def _chunk_keys(store, name: str = "events") -> list[str]:
    return [k for k, _ in store.list_prefix(keys.log_chunks_prefix(name))]


def _head(store, name: str = "events") -> bytes:
    return store.get(keys.log_key(name)).value


@pytest.fixture
def store(memory_store):
    return memory_store


def test_a_short_log_is_one_value_as_before(store):
    read_or_create_log(store, "events", RNG)
    md = _append(store, 1, 50)
    assert _head(store) == md.to_json() and _chunk_keys(store) == []


def test_a_log_of_20000_segments_keeps_its_head_small(store, caplog):
    read_or_create_log(store, "events", RNG)
    with caplog.at_level(logging.WARNING, logger="pybk_spark.logs"):
        for first in range(1, 20_001, 500):
            md = _append(store, first, 500)
    assert "log_metadata_large" not in caplog.text
    got, _ = read_log(store, "events")
    assert got == md and got.ledger_ids == list(range(1, 20_001))
    assert got.segments[-1].start_offset == 10 * 19_999           # offsets run on across chunks
    head, refs = logmd.head_from_json(_head(store))
    assert len(head.segments) <= logmd.SEAL_AFTER and len(_head(store)) < 500_000
    assert [r.key for r in refs] == _chunk_keys(store) and len(refs) == 18
    assert sum(r.count for r in refs) + len(head.segments) == 20_000


def test_truncation_drops_whole_chunks_and_relays_a_cut_one(store, monkeypatch):
    from pybk_spark.logs import log
    monkeypatch.setattr(log, "_TXN_DELETES", 1)     # the rest are deleted after the CAS
    read_or_create_log(store, "events", RNG)
    for first in range(1, 6_001, 500):
        _append(store, first, 500)
    before = _chunk_keys(store)
    md = update_log(store, "events", lambda m: logmd.truncate_before(m, 2_500)[0])
    assert md.ledger_ids == list(range(2_500, 6_001)) and md.truncated_ledgers == 2_499
    assert read_log(store, "events")[0] == md
    after = _chunk_keys(store)
    assert not set(before[:3]) & set(after), "the chunks truncated or cut are gone"
    assert set(before[3:]) <= set(after), "the chunks after the cut are kept as they were"
    md = update_log(store, "events", lambda m: logmd.truncate_before(m, 6_000)[0])
    assert md.ledger_ids == [6_000] and _chunk_keys(store) == []


def test_an_overwrite_drops_every_chunk(store):
    read_or_create_log(store, "events", RNG)
    for first in range(1, 4_001, 1_000):
        _append(store, first, 1_000)
    assert _chunk_keys(store)
    md = _append(store, 10_001, 3, overwrite=True)
    assert md.ledger_ids == [10_001, 10_002, 10_003]
    assert read_log(store, "events")[0] == md and _chunk_keys(store) == []


def test_concurrent_appends_to_a_long_log_each_land_once(store):
    read_or_create_log(store, "events", RNG)
    _append(store, 1, 2_500)

    def appender(base: int) -> None:
        for i in range(20):
            _append(store, base + 100 * i, 100)
    threads = [threading.Thread(target=appender, args=(base,)) for base in (100_000, 200_000)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    ids = read_log(store, "events")[0].ledger_ids
    assert len(ids) == 6_500 and len(set(ids)) == 6_500
    assert ids[:2_500] == list(range(1, 2_501))
    head, refs = logmd.head_from_json(_head(store))
    assert sorted(r.key for r in refs) == _chunk_keys(store), "no chunk left unnamed"


def test_deleting_a_long_log_deletes_its_chunks(store):
    read_or_create_log(store, "events", RNG)
    _append(store, 1, 3_000)
    read_or_create_log(store, "other", RNG)
    _append(store, 5_001, 100, name="other")
    assert _chunk_keys(store)
    delete_log_metadata(store, "events", read_log(store, "events")[1])
    assert _chunk_keys(store) == [] and store.get(keys.log_key("events")) is None
    with pytest.raises(errors.LogNotFound):
        read_log(store, "events")
    assert read_log(store, "other")[0].ledger_ids == list(range(5_001, 5_101))


def test_a_one_value_log_near_etcds_limit_moves_to_chunks(store):
    """A log written before chunks, one value of 8,000 segments: its next
    changes seal two chunks each, every request within etcd's limit."""
    md = logmd.append_closed(logmd.new_log("events"), [(lid, 10, 1_000_000, 10_000)
                                                        for lid in range(1, 8_001)],
                             times={lid: (T0 + lid, T0 + lid + 5) for lid in range(1, 8_001)})[0]
    store.put_if_absent(keys.log_key("events"), md.to_json())
    sizes = []
    for first in range(10_001, 10_006):
        _append(store, first, 1)
        sizes.append(len(logmd.head_from_json(_head(store))[0].segments))
    assert sizes == [6_001, 4_002, 2_003, 1_004, 1_005]
    assert read_log(store, "events")[0].ledger_ids == list(range(1, 8_001)) + list(range(10_001, 10_006))


def test_a_head_past_etcds_limit_names_the_log(store):
    read_or_create_log(store, "events", RNG)
    huge = "x" * (2 << 20)
    with pytest.raises(errors.MetadataTooLarge) as info:
        update_log(store, "events",
                   lambda md: logmd.LogMetadata(md.name, md.segments, properties={"p": huge}))
    assert "log 'events'" in str(info.value) and "--max-request-bytes" in str(info.value)
    assert read_log(store, "events")[0].properties == {}


def test_a_long_log_on_etcd(etcd):
    """The same layout through the real adapter: 12,000 segments (one value
    of them was refused at ~8,300), read back whole, then truncated."""
    store = open_store(etcd.uri(unique_scope("logsize")))
    try:
        read_or_create_log(store, "events", RNG)
        for first in range(1, 12_001, 1_000):
            _append(store, first, 1_000)
        md, _ = read_log(store, "events")
        assert md.ledger_ids == list(range(1, 12_001))
        md = update_log(store, "events", lambda m: logmd.truncate_before(m, 11_000)[0])
        assert read_log(store, "events")[0].ledger_ids == list(range(11_000, 12_001))
    finally:
        store.close()
