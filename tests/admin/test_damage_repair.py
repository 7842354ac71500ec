"""Damage on one bookie, end to end with real processes (private etcd + 3
bookie-server processes): the middle of an older journal file and a stored
segment file are corrupted while the bookie is down; after its restart
replay skips the damaged record and keeps everything after it, the scrubber
finds the damaged segment batch, both are published under
``bookies/damaged/<id>``, and one ``pybk rereplicate --verify`` copies the
entries back onto that bookie: every entry has its Qw replicas again and
no acknowledged entry was lost."""
from __future__ import annotations

import json
import os
import re
import signal

import pytest

from bookie_server.journal.journal import HEADER, RecordType, list_files, file_name
from pybk_spark import errors
from pybk_spark.admin.operations import rereplicate as rr
from pybk_spark.protocol import ledger_metadata as lm
from pybk_spark.protocol import damage_marker as dm
from pybk_spark.wire.entries import batch_from_bytes

from admin_helpers import pybk, wait_until

CONF = {"flush_interval_s": 3600, "journal_max_file_bytes": 96 * 1024,
        "journal_prealloc_bytes": 16 * 1024, "scrub_interval_s": 1,
        "scrub_rate_bytes_per_s": 1 << 30, "registration_ttl_s": 2}


@pytest.fixture(scope="module")
def damage_cluster(tmp_path_factory):
    from pybk_spark.testing.fixtures import bookie_server_available, private_cluster
    if not bookie_server_available():
        pytest.skip("bookie_server is not available")
    yield from private_cluster(tmp_path_factory.mktemp("damage-cluster"), num_bookies=3,
                               bookie_conf=CONF, metrics=False)


def _payloads(tag: str, n: int, size: int = 300) -> list[bytes]:
    return [(f"{tag}-{i}-".encode() + b"q" * size)[:size] for i in range(n)]


def _write(bk, tag: str, n: int, chunk: int = 20) -> int:
    lh = bk.create_ledger(3, 3, 2)
    data = _payloads(tag, n)
    for i in range(0, n, chunk):        # small adds: one journal record each, copied to segments
        lh.add_entries(data[i:i + chunk])
    lh.close()
    return lh.ledger_id


def _frames(path: str) -> list[tuple[int, int, int]]:
    """(offset, type, body length) of every frame (no CRC check, read-only)."""
    data = open(path, "rb").read()
    out, pos = [], 0
    while pos + HEADER.size <= len(data):
        length, _crc, rtype = HEADER.unpack_from(data, pos)
        if rtype == 0:
            break
        out.append((pos, rtype, length))
        pos += HEADER.size + length
    return out


def _flip(path: str, offset: int, nbytes: int = 16) -> None:
    with open(path, "r+b") as fh:
        fh.seek(offset)
        old = fh.read(nbytes)
        fh.seek(offset)
        fh.write(bytes(x ^ 0xFF for x in old))


def _damage_old_journal_file(data_dir) -> tuple[int, list[int]]:
    """Corrupt an ADD record in the middle of a journal file that replay
    will read and that is not the newest; returns (ledger, its ids)."""
    ckpt = json.loads((data_dir / "checkpoint.json").read_text())
    jdir = str(data_dir / "journal")
    seqs = [s for s in list_files(jdir) if s >= ckpt["journal_seq"]]
    for seq in seqs[:-1]:
        path = os.path.join(jdir, file_name(seq))
        adds = [f for f in _frames(path) if f[1] == RecordType.ADD_BATCH
                and (seq > ckpt["journal_seq"] or f[0] >= ckpt["journal_offset"])]
        if len(adds) >= 3:
            pos, _t, length = adds[len(adds) // 2]
            with open(path, "rb") as fh:
                fh.seek(pos + HEADER.size)
                batch = batch_from_bytes(fh.read(length))
            _flip(path, pos + HEADER.size + length // 2)
            return batch.column(0)[0].as_py(), batch.column(1).to_pylist()
    raise AssertionError(f"no older journal file with adds after the checkpoint: {seqs}")


def _damage_segment(data_dir) -> None:
    segs = sorted((data_dir / "store" / "segments").glob("*.seg"))
    assert segs, "no segment file"
    path = str(segs[0])
    size = os.path.getsize(path)
    _flip(path, size // 2, 4)


def _log(cluster, bid: str) -> str:
    return cluster.bookie_log(bid).read_text(errors="replace")


def _all_readable(bk, ledgers: dict[int, tuple[str, int]]) -> None:
    for lid, (tag, n) in ledgers.items():
        rh = bk.open_ledger(lid, recovery=False)
        assert rh.last_add_confirmed == n - 1
        assert [e.payload for e in rh.read(0, n - 1)] == _payloads(tag, n)


def test_journal_and_segment_damage_repaired_onto_the_same_bookie(damage_cluster):
    from pybk_spark.ledger.client import BookKeeper
    cluster = damage_cluster
    uri = cluster.metadata_uri
    victim = cluster.bookie_ids[0]
    data_dir = cluster.bookie_data_dir(victim)
    with BookKeeper(uri) as bk:
        ledgers = {_write(bk, "a", 400): ("a", 400)}
        cluster.kill_bookie(victim, signal.SIGTERM)      # clean stop: checkpoint -> segments
        cluster.start_bookie(victim)
        for tag in ("b", "c"):
            ledgers[_write(bk, tag, 600)] = (tag, 600)
        cluster.kill_bookie(victim)                     # crash: b and c are replayed
        lost_ledger, lost_ids = _damage_old_journal_file(data_dir)
        _damage_segment(data_dir)
        mark = len(_log(cluster, victim))
        cluster.start_bookie(victim)

        text = _log(cluster, victim)[mark:]
        assert re.search(r"event=journal_damage file=\S+ offset=\d+ bytes=\d+", text), text[-3000:]
        missing = [tuple(int(x) for x in m) for m in re.findall(
            r"event=entries_missing ledger=(\d+) first=(\d+) last=(-?\d+)", text)]
        assert any(l == lost_ledger and f <= lost_ids[0] and (t == -1 or t >= lost_ids[-1])
                   for l, f, t in missing), (missing, lost_ledger, lost_ids)
        wait_until(lambda: "event=scrub_damage" in _log(cluster, victim)[mark:], 60,
                   "the scrubber finds the damaged segment batch")
        store = bk.metadata_store
        key = dm.marker_key(victim)

        def published():
            v = store.get(key)
            return v is not None and len(dm.parse_marker(v.value)[0]) >= 2
        wait_until(published, 30, "damage published under bookies/damaged/")
        _all_readable(bk, ledgers)                      # the other replicas serve meanwhile
        # the damaged bookie itself: an error recovery counts as "unknown", never NoSuchEntry
        direct = bk.transports.get(victim).read(lost_ledger, lost_ids[0], lost_ids[0],
                                                master_key=lm.master_key(b""), timeout=10)
        with pytest.raises(errors.BookieIOError):
            direct.result()

        listed = pybk("--json", "listunderreplicated", "--metadata-uri", uri)
        assert listed.rc == 0
        damaged = [r for r in listed.json()["under_replicated"] if r["state"] == "damaged"]
        assert {r["ledger"] for r in damaged} >= {lost_ledger} and \
            {r["bookie"] for r in damaged} == {victim}, listed.out

        res = pybk("--json", "rereplicate", "--metadata-uri", uri, "--verify")
        assert res.rc == 0, res.out[-3000:] + res.err[-3000:]
        report = res.json()
        assert report["under_replicated"] == []
        outcomes = {r["ledger"]: r["outcome"] for r in report["damaged"]}
        assert set(outcomes) == set(ledgers) and set(outcomes.values()) == {"repaired"}, \
            report["damaged"]
        copied = {r["ledger"]: r["copied"] for r in report["damaged"]}
        assert copied[lost_ledger] == len(lost_ids), report["damaged"]   # exactly the record
        assert sum(copied.values()) == len(lost_ids) + 1, report["damaged"]   # + the scrubbed row
        assert store.get(key) is None                    # the marker is cleared
        wait_until(lambda: "event=damage_repaired" in _log(cluster, victim)[mark:], 30,
                   "the bookie adopts the cleared marker")
        for lid in ledgers:                              # every entry: Qw copies again
            assert rr.verify_ledger(bk, lid) == []
        _all_readable(bk, ledgers)
