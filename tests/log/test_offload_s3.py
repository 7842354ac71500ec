"""Tiered storage on an S3 endpoint (moto's standalone server, a real HTTP
S3 API on loopback): a log offloaded to ``s3://`` reads back the same, its
dataset read by DuckDB gives exactly the log's rows, the store failing
mid-offload leaves the segment on the bookies with no committed record, and
a store down after a commit leaves the segment readable from its ledger
within the grace period.  (Each failing store call costs pyarrow's S3
retries, about 6 s.)"""
import os
import random
import socket
import subprocess
import sys
import time

import pyarrow.fs as pafs
import pytest

from pybk_spark import BookKeeper, errors
from pybk_spark.cluster.ports import free_port
from pybk_spark.logs import offload, offload_files
from pybk_spark.logs.log import read_log
from pybk_spark.logs.log_reader import LogReader
from pybk_spark.logs.log_writer import LogWriter, RollPolicy
from pybk_spark.protocol.offload import OffloadPolicy

pytestmark = pytest.mark.slow

moto_server = pytest.importorskip("moto.server")
duckdb = pytest.importorskip("duckdb")

NOW = OffloadPolicy(grace_s=0, orphan_age_s=0)
KEY, SECRET, BUCKET = "testing-key", "testing-secret", "pybk-offload"


@pytest.fixture
def bk(cluster, fresh_scope):
    client = BookKeeper(fresh_scope)
    yield client
    client.close()


@pytest.fixture
def s3(monkeypatch, tmp_path):
    """A moto S3 server on a free loopback port, its bucket, and the offload
    location URI that reaches it (credentials from the environment)."""
    port = free_port()
    log = open(tmp_path / "moto.log", "wb")
    proc = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1",
                             "-p", str(port)], stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"moto server did not start: {tmp_path / 'moto.log'}") from None
                time.sleep(0.2)
        monkeypatch.setenv("AWS_ACCESS_KEY_ID", KEY)
        monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", SECRET)
        fs = pafs.S3FileSystem(endpoint_override=f"127.0.0.1:{port}", scheme="http",
                               access_key=KEY, secret_key=SECRET, region="us-east-1",
                               allow_bucket_creation=True)
        fs.create_dir(BUCKET)
        location = (f"s3://{BUCKET}/tier?endpoint_override=127.0.0.1:{port}"
                    "&scheme=http&region=us-east-1")
        yield proc, fs, location
    finally:
        if proc.poll() is None:
            proc.terminate()
            proc.wait(timeout=10)
        log.close()


def write_raw_log(bk, name, n=60, per_ledger=15):
    with LogWriter(bk, name, roll_policy=RollPolicy(max_entries=per_ledger)).open() as w:
        for i in range(n):
            w.append(f"{name}-{i}".encode())


def records(bk, name):
    with LogReader(bk, name) as reader:
        return [(r.position, r.payload, r.append_time_us) for r in reader.read_available()]


def test_offload_to_s3_reads_back_and_duckdb_reads_the_log_rows(bk, s3, tmp_path):
    _proc, fs, location = s3
    name = f"s3log{random.Random().getrandbits(32):08x}"
    write_raw_log(bk, name)
    before = records(bk, name)
    report = offload.offload_log(bk, name, location, NOW)
    md, _ = read_log(bk.metadata_store, name)
    assert report.offloaded == md.ledger_ids[:-2] and report.ledgers_deleted == report.offloaded
    assert not set(report.offloaded) & set(bk.list_ledgers())
    assert records(bk, name) == before                     # from the object store, then bookies
    directory = f"{BUCKET}/tier/{offload_files.dataset_dir(md)}"
    names = sorted(i.base_name for i in fs.get_file_info(pafs.FileSelector(directory)))
    assert names == [offload_files.final_name(lid) for lid in report.offloaded]

    local = tmp_path / "copy"
    local.mkdir()
    pafs.copy_files(directory, str(local), source_filesystem=fs,
                    destination_filesystem=pafs.LocalFileSystem())
    got = duckdb.read_parquet(os.path.join(local, "*.parquet")).order(
        "ledger_id, entry_id").fetchall()
    offloaded = set(report.offloaded)
    expected = [(pos.ledger_id, pos.entry_id, payload) for pos, payload, _t in before
                if pos.ledger_id in offloaded]
    assert [(lid, eid, bytes(p)) for lid, eid, p, _ts in got] == expected


def _a_written_log(bk, prefix: str):
    """A fresh raw log of a few segments: (its name, its records, its metadata)."""
    name = f"{prefix}{random.Random().getrandbits(32):08x}"
    write_raw_log(bk, name)
    return name, records(bk, name), read_log(bk.metadata_store, name)[0]


def test_object_store_failing_mid_offload_leaves_the_segment_on_bookies(bk, s3):
    proc, _fs, location = s3
    name, before, md = _a_written_log(bk, "s3down")
    first = md.ledger_ids[0]
    staged = offload.stage_segment(bk, name, first, location)    # written, not yet checked
    proc.terminate()
    proc.wait(timeout=10)
    with pytest.raises(errors.OffloadStoreError):
        offload.verify_staged(staged)
    with pytest.raises(errors.OffloadStoreError):
        offload.offload_log(bk, name, location, NOW)
    md, _ = read_log(bk.metadata_store, name)
    assert all(s.offload is None for s in md.segments)
    assert set(md.ledger_ids) <= set(bk.list_ledgers())
    assert records(bk, name) == before


def test_object_store_down_after_a_commit_reads_come_from_the_bookies(bk, s3):
    proc, _fs, location = s3
    name, before, md = _a_written_log(bk, "s3gone")
    first, second = md.ledger_ids[:2]
    assert offload.offload_segment(bk, name, first, location) is not None   # ledger kept (grace)
    proc.terminate()
    proc.wait(timeout=10)
    with pytest.raises(errors.OffloadStoreError):
        offload.offload_segment(bk, name, second, location)   # the store fails writing
    md, _ = read_log(bk.metadata_store, name)
    assert [s.offload is not None for s in md.segments] == [True] + [False] * (len(md.segments) - 1)
    assert records(bk, name) == before                 # the first segment from its ledger
