"""Tiered storage on a real cluster: a log's closed segments offloaded to
Parquet files, read back through LogReader with the same positions, each
step safe to stop after, idempotent, and the files a plain Parquet dataset."""
import os
import random

import pyarrow as pa
import pyarrow.dataset as ds
import pytest

from pybk_spark import BookKeeper, errors
from pybk_spark.logs import offload, offload_files
from pybk_spark.logs.log import read_log, update_log
from pybk_spark.logs.log_writer import LogWriter, RollPolicy
from pybk_spark.logs.log_reader import LogReader, records_of
from pybk_spark.logs.truncation import truncate_log
from pybk_spark.protocol import log_metadata as logmd
from pybk_spark.protocol import offload as decide
from pybk_spark.protocol.offload import OffloadPolicy
from pybk_spark.protocol.offload_record import STATE_LEDGER_DELETED, STATE_OFFLOADED

pytestmark = pytest.mark.slow

NOW = OffloadPolicy(grace_s=0, orphan_age_s=0)        # no waiting, in tests


@pytest.fixture
def bk(cluster, fresh_scope):
    client = BookKeeper(fresh_scope)
    yield client
    client.close()


def unique(name):
    return f"{name}{random.Random().getrandbits(32):08x}"


def write_raw_log(bk, name, n=100, per_ledger=20):
    with LogWriter(bk, name, roll_policy=RollPolicy(max_entries=per_ledger)).open() as w:
        for i in range(n):
            w.append(f"{name}-{i}".encode())


def records(bk, name):
    with LogReader(bk, name) as reader:
        return [(r.position, r.payload, r.append_time_us) for r in reader.read_available()]


def parquet_files(location, md):
    directory = os.path.join(location, offload_files.dataset_dir(md))
    return sorted(os.listdir(directory)) if os.path.isdir(directory) else []


def test_offload_then_read_equals_the_original(bk, tmp_path):
    name = unique("raw")
    write_raw_log(bk, name)
    before = records(bk, name)
    report = offload.offload_log(bk, name, str(tmp_path), NOW, rng=random.Random(1))
    md, _ = read_log(bk.metadata_store, name)
    assert report.offloaded == md.ledger_ids[:-2] and len(report.offloaded) >= 3
    assert report.ledgers_deleted == report.offloaded
    for s in md.segments[:-2]:
        assert s.offload is not None and s.offload.state == STATE_LEDGER_DELETED
        assert s.offload.rows == s.entry_count == sum(f.rows for f in s.offload.files)
        with pytest.raises(errors.NoSuchLedger):
            bk.get_ledger_metadata(s.ledger_id)
    assert records(bk, name) == before
    assert parquet_files(tmp_path, md) == [offload_files.final_name(i) for i in report.offloaded]


def test_a_reader_crosses_from_files_into_ledgers_and_tails(bk, tmp_path):
    name = unique("tail")
    with LogWriter(bk, name, roll_policy=RollPolicy(max_entries=10)).open() as w:
        for i in range(45):
            w.append(b"a%d" % i)
        offload.offload_log(bk, name, str(tmp_path), NOW)
        reader = LogReader(bk, name, poll_timeout_s=0.2)
        got = []
        while len(got) < 45:           # the last entry's LAC arrives with the writer's explicit LAC
            index, _, batch = reader.read_batch(timeout_s=1.0)
            got += [r.payload for r in records_of(index, batch)] if batch is not None else []
        assert got == [b"a%d" % i for i in range(45)]
        for i in range(5):
            w.append(b"b%d" % i)
    got += [r.payload for r in reader.read_available()]    # the writer closed its ledger
    reader.close()
    assert got == [b"a%d" % i for i in range(45)] + [b"b%d" % i for i in range(5)]


def test_offloaded_segments_read_with_no_bookie(cluster, bk, tmp_path):
    name = unique("nobookie")
    write_raw_log(bk, name, n=60, per_ledger=15)
    before = records(bk, name)
    offload.offload_log(bk, name, str(tmp_path), NOW)
    md, _ = read_log(bk.metadata_store, name)
    offloaded_rows = sum(s.entry_count for s in md.segments if s.offload is not None)
    for bookie_id in cluster.bookie_ids:
        cluster.kill_bookie(bookie_id)
    with LogReader(bk, name) as reader:
        got = []
        while len(got) < offloaded_rows:
            index, _, batch = reader.read_batch(timeout_s=0)
            got += [(r.position, r.payload, r.append_time_us) for r in records_of(index, batch)]
    assert got == before[:offloaded_rows]


def test_each_step_can_stop_and_a_later_run_finishes_with_one_copy(bk, tmp_path):
    name = unique("crash")
    write_raw_log(bk, name, n=80, per_ledger=20)
    before = records(bk, name)
    md, _ = read_log(bk.metadata_store, name)
    first, second, third = md.ledger_ids[:3]
    location = str(tmp_path)

    # stopped after step 1: a temporary file, the segment still on bookies
    offload.stage_segment(bk, name, first, location)
    # stopped after step 2: its final file published, not committed
    staged = offload.stage_segment(bk, name, second, location)
    offload.verify_staged(staged)
    assert offload.publish_staged(bk, staged)
    # stopped after step 3: committed, ledger not yet deleted
    staged3 = offload.stage_segment(bk, name, third, location)
    offload.verify_staged(staged3)
    offload.publish_staged(bk, staged3)
    offload.commit_staged(bk, staged3)

    md, _ = read_log(bk.metadata_store, name)
    assert [s.offload is not None for s in md.segments[:3]] == [False, False, True]
    assert md.segments[2].offload.state == STATE_OFFLOADED
    bk.get_ledger_metadata(third)                       # still on the bookies
    assert any(f.startswith(offload_files.TEMP_PREFIX) for f in parquet_files(location, md))
    assert records(bk, name) == before                  # readable at every stop

    table = ds.dataset(os.path.join(location, offload_files.dataset_dir(md))).to_table()
    assert sorted(set(table.column("ledger_id").to_pylist())) == [second, third]

    report = offload.offload_log(bk, name, location, NOW)
    assert report.offloaded == [first, second]
    # the temporary file of step 1 and the uncommitted final file of step 2
    assert sorted(os.path.basename(p)[:25] for p in report.orphans_removed) == [
        offload_files.final_name(second)[:25], f"{offload_files.TEMP_PREFIX}{first:020d}"]
    assert sorted(report.ledgers_deleted) == [first, second, third]
    md, _ = read_log(bk.metadata_store, name)
    assert parquet_files(location, md) == [offload_files.final_name(i)
                                           for i in (first, second, third)]
    assert records(bk, name) == before


def test_offload_is_idempotent(bk, tmp_path):
    name = unique("again")
    write_raw_log(bk, name, n=60, per_ledger=20)
    first = offload.offload_log(bk, name, str(tmp_path), NOW)
    md1, _ = read_log(bk.metadata_store, name)
    files1 = parquet_files(tmp_path, md1)
    second = offload.offload_log(bk, name, str(tmp_path), NOW)
    md2, _ = read_log(bk.metadata_store, name)
    assert first.offloaded and not second.offloaded and not second.orphans_removed
    assert parquet_files(tmp_path, md2) == files1 and md2 == md1
    # a segment committed meanwhile by another run: publishing it again is skipped
    write_raw_log(bk, name, n=40, per_ledger=20)
    md, _ = read_log(bk.metadata_store, name)
    ledger = next(s.ledger_id for s in md.segments if s.offload is None)
    staged = offload.stage_segment(bk, name, ledger, str(tmp_path))
    offload.offload_segment(bk, name, ledger, str(tmp_path))
    assert offload.publish_staged(bk, staged) is False
    md3, _ = read_log(bk.metadata_store, name)
    assert parquet_files(tmp_path, md3).count(offload_files.final_name(ledger)) == 1
    assert not any(f.startswith(offload_files.TEMP_PREFIX) for f in parquet_files(tmp_path, md3))


def test_offloaded_dataset_is_exactly_the_logs_rows(bk, tmp_path):
    name = unique("dataset")
    write_raw_log(bk, name, n=90, per_ledger=30)
    offload.offload_log(bk, name, str(tmp_path), OffloadPolicy(grace_s=3600, orphan_age_s=0))
    md, _ = read_log(bk.metadata_store, name)
    offloaded = {s.ledger_id for s in md.segments if s.offload is not None}
    table = ds.dataset(os.path.join(tmp_path, offload_files.dataset_dir(md))).to_table()
    table = table.sort_by([("ledger_id", "ascending"), ("entry_id", "ascending")])
    want = [(p.ledger_id, p.entry_id, payload, t) for p, payload, t in records(bk, name)
            if p.ledger_id in offloaded]
    got = list(zip(table.column("ledger_id").to_pylist(), table.column("entry_id").to_pylist(),
                   table.column("payload").to_pylist(),
                   table.column("timestamp").cast(pa.int64()).to_pylist()))
    assert got == want
    assert table.schema.names == ["ledger_id", "entry_id", "payload", "timestamp"]


def test_truncation_deletes_offloaded_files(bk, tmp_path):
    name = unique("trunc")
    write_raw_log(bk, name, n=80, per_ledger=20)
    offload.offload_log(bk, name, str(tmp_path), NOW)
    md, _ = read_log(bk.metadata_store, name)
    assert len(parquet_files(tmp_path, md)) == 2
    truncate_log(bk, name, md.ledger_ids[1])
    assert parquet_files(tmp_path, md) == [offload_files.final_name(md.ledger_ids[1])]
    assert [r[0].ledger_id for r in records(bk, name)][0] == md.ledger_ids[1]


def test_a_damaged_file_fails_the_read_naming_it(bk, tmp_path):
    name = unique("damage")
    write_raw_log(bk, name, n=60, per_ledger=20)
    offload.offload_log(bk, name, str(tmp_path), NOW)
    md, _ = read_log(bk.metadata_store, name)
    path = os.path.join(tmp_path, offload_files.dataset_dir(md),
                        offload_files.final_name(md.ledger_ids[0]))
    with open(path, "r+b") as f:
        f.seek(100)
        f.write(b"\xff\xfe")
    with LogReader(bk, name) as reader, pytest.raises(errors.OffloadCorrupt,
                                                      match=offload_files.final_name(
                                                          md.ledger_ids[0])):
        reader.read_available()


def _dataframe_log(bk, name, batches):
    """A DataFrame log as the Spark writer lays it out: Arrow IPC entries in
    closed ledgers, appended with the log's schema in one CAS each."""
    from pybk_spark.spark import arrow_codec
    schema = arrow_codec.canonical_schema(batches[0].schema)
    text = arrow_codec.encode_schema(schema)
    for i, batch in enumerate(batches):
        handle = bk.create_ledger(3, 2, 2)
        run = arrow_codec.EntryRun()
        run.add(batch, max_rows=7, max_bytes=1 << 20, time_us=1_700_000_000_000_000 + i)
        for payload in run.take().to_pylist():
            handle.add_entry(payload)
        handle.close()
        meta = bk.get_ledger_metadata(handle.ledger_id)
        update_log(bk.metadata_store, name, lambda m, h=handle, meta=meta, b=batch: logmd.append_closed(
            m, [(h.ledger_id, meta.last_entry_id + 1, meta.length, b.num_rows)], schema=text)[0])
    return schema


def test_dataframe_log_keeps_its_columns_plus_position_columns(bk, tmp_path):
    from pybk_spark.logs.log import open_or_create_log
    from pybk_spark.spark import arrow_codec
    name = unique("frame")
    open_or_create_log(bk.metadata_store, name, random.Random(3))
    batches = [pa.RecordBatch.from_pydict({"id": list(range(k * 20, k * 20 + 20)),
                                           "word": [f"w{j}" for j in range(20)],
                                           "score": [j / 3 for j in range(20)]})
               for k in range(4)]
    schema = _dataframe_log(bk, name, batches)
    before = records(bk, name)
    report = offload.offload_log(bk, name, str(tmp_path), NOW)
    assert len(report.offloaded) == 2 and report.rows == 40
    md, _ = read_log(bk.metadata_store, name)
    table = ds.dataset(os.path.join(tmp_path, offload_files.dataset_dir(md))).to_table()
    assert table.schema.names == ["id", "word", "score", "_ledger_id", "_entry_id", "_timestamp"]
    table = table.sort_by([("_ledger_id", "ascending"), ("_entry_id", "ascending")])
    assert table.column("id").to_pylist() == list(range(40))
    after = records(bk, name)
    assert [r[0] for r in after] == [r[0] for r in before]        # the same positions

    def rows(recs):
        out = []
        for _, payload, _ in recs:
            for b in arrow_codec.decode_entry(payload, schema):
                out += b.to_pylist()
        return out
    assert rows(after) == rows(before)
    times = [arrow_codec.entry_time(p) for _, p, _ in after]
    assert times == [arrow_codec.entry_time(p) for _, p, _ in before]


def test_a_reader_in_the_middle_of_an_offload_and_deletion_carries_on(bk, tmp_path):
    name = unique("middle")
    write_raw_log(bk, name, n=80, per_ledger=20)
    before = records(bk, name)
    reader = LogReader(bk, name, max_batch_entries=7)
    try:
        index, _, batch = reader.read_batch(timeout_s=0)      # inside the first ledger
        got = [(r.position, r.payload, r.append_time_us) for r in records_of(index, batch)]
        offload.offload_log(bk, name, str(tmp_path), NOW)       # ledgers deleted under it
        md, _ = read_log(bk.metadata_store, name)
        with pytest.raises(errors.NoSuchLedger):
            bk.get_ledger_metadata(md.ledger_ids[0])
        got += [(r.position, r.payload, r.append_time_us) for r in reader.read_available()]
    finally:
        reader.close()
    assert got == before


def test_a_uri_location_and_retention_deleting_offloaded_files(bk, tmp_path):
    from pybk_spark.logs.truncation import apply_retention, set_log_retention
    name = unique("uri")
    write_raw_log(bk, name, n=80, per_ledger=20)
    before = records(bk, name)
    location = f"file://{tmp_path}"                   # through pyarrow.fs.FileSystem.from_uri
    report = offload.offload_log(bk, name, location, NOW)
    md, _ = read_log(bk.metadata_store, name)
    assert report.offloaded == md.ledger_ids[:2]
    assert md.segments[0].offload.location == location
    assert records(bk, name) == before
    assert len(parquet_files(tmp_path, md)) == 2
    set_log_retention(bk.metadata_store, name, nbytes=1)
    dropped = apply_retention(bk, name, lambda: 0.0)
    assert dropped[:2] == md.ledger_ids[:2]
    assert parquet_files(tmp_path, md) == []


def test_a_logs_own_policy_is_set_by_cas_and_picks_its_segments(bk, tmp_path):
    name = unique("policy")
    write_raw_log(bk, name, n=100, per_ledger=20)              # 5 segments
    md, _ = read_log(bk.metadata_store, name)
    ids = md.ledger_ids
    assert offload.set_offload_policy(bk, name, keep_segments=4).keep_segments == 4
    attempts = []

    def set_keep_3(m):
        if not attempts:      # another operator's change lands while this one is in flight
            offload.set_offload_policy(bk, name, min_age_s=1e9)
        attempts.append(dict(m.properties))
        return decide.with_log_policy(m, keep_segments=3)
    md = update_log(bk.metadata_store, name, set_keep_3)
    assert len(attempts) == 2                                  # the CAS conflicted, re-decided
    assert offload.offload_status(bk, name)["policy"] == {"keep_segments": 3, "min_age_s": 1e9,
                                                          "keep_bytes": -1}
    report = offload.offload_log(bk, name, str(tmp_path), NOW)
    assert (report.policy, report.offloaded) == ("log", [])   # nothing is a billion s old
    offload.set_offload_policy(bk, name, min_age_s=0)
    report = offload.offload_log(bk, name, str(tmp_path), NOW)
    assert (report.policy, report.offloaded) == ("log", ids[:2])
    report = offload.offload_log(bk, name, str(tmp_path), NOW, log_policy_first=False)
    assert (report.policy, report.offloaded) == ("run", ids[2:3])
    assert offload.set_offload_policy(bk, name, clear=True) is None
    assert offload.offload_status(bk, name)["policy"] is None
    assert not any(k.startswith("offload.") for k in read_log(bk.metadata_store, name)[0].properties)
    with pytest.raises(errors.IncorrectParameter, match="keep_segments 1"):
        offload.set_offload_policy(bk, name, keep_segments=1)


def test_damaged_or_missing_files_within_the_grace_period_are_read_from_the_ledger(bk, tmp_path):
    name = unique("fallback")
    write_raw_log(bk, name, n=80, per_ledger=20)
    before = records(bk, name)
    report = offload.offload_log(bk, name, str(tmp_path),
                                 OffloadPolicy(grace_s=3600, orphan_age_s=0))
    first, second = report.offloaded
    md, _ = read_log(bk.metadata_store, name)
    directory = os.path.join(tmp_path, offload_files.dataset_dir(md))
    with open(os.path.join(directory, offload_files.final_name(first)), "r+b") as f:
        f.seek(100)
        f.write(b"\xff\xfe")
    os.remove(os.path.join(directory, offload_files.final_name(second)))
    assert records(bk, name) == before                # both from their ledgers, still on bookies
    assert offload.delete_offloaded_ledgers(bk, name, 0) == [first, second]
    with LogReader(bk, name) as reader, pytest.raises(errors.OffloadCorrupt,
                                                      match=offload_files.final_name(first)):
        reader.read_available()                       # the files are the only copy now


def test_stopped_mid_write_or_between_a_deletion_and_its_record_a_later_run_finishes(bk, tmp_path):
    name = unique("stop4")
    write_raw_log(bk, name, n=80, per_ledger=20)
    before = records(bk, name)
    location = str(tmp_path)
    md, _ = read_log(bk.metadata_store, name)
    first, second = md.ledger_ids[:2]
    # stopped while writing its temporary file: a truncated file
    staged = offload.stage_segment(bk, name, first, location)
    temp = staged.files[0].temp_path                  # absolute on a local location
    with open(temp, "r+b") as f:
        f.truncate(os.path.getsize(temp) // 2)
    # stopped in step 4: the ledger deleted from the bookies, not yet recorded deleted
    record = offload.offload_segment(bk, name, second, location)
    bk.delete_ledger(second)
    md, _ = read_log(bk.metadata_store, name)
    assert md.segments[1].offload == record and record.state == STATE_OFFLOADED
    assert records(bk, name) == before                # the first from its ledger, the second from files
    report = offload.offload_log(bk, name, location, NOW)
    assert report.offloaded == [first] and sorted(report.ledgers_deleted) == [first, second]
    assert [os.path.basename(p) for p in report.orphans_removed] == [os.path.basename(temp)]
    md, _ = read_log(bk.metadata_store, name)
    assert [s.offload.state for s in md.segments[:2]] == [STATE_LEDGER_DELETED] * 2
    assert parquet_files(location, md) == [offload_files.final_name(i) for i in (first, second)]
    assert records(bk, name) == before
