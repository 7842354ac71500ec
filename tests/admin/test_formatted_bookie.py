"""A bookie whose disk was lost rejoins under its old id: real etcd and 4
real bookie-server processes.  Ledgers are written with E=4, Qw=2; a
bookie is SIGKILLed and its data dir deleted; it refuses to start until
``bookie-server format`` (which asks for ``--yes`` on a data dir that still
holds data), then rejoins empty.  ``listunderreplicated`` lists its
ledgers, the bookie answers BookieIOError (never NoSuchEntry) for what it
lacks, and one auto-recovery round alone copies every entry back: each
entry is read from each bookie of its write set directly.  A second bookie
loses its disk and its metadata cookie without a format: its new cookie
instance under the old id is noticed all the same; and ``rereplicate
--verify`` counts the entries it fills in."""
from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys

import pytest

from pybk_spark import errors
from pybk_spark.admin.decisions import entry_sets as es
from pybk_spark.admin.operations.replica_reads import read_ids
from pybk_spark.cluster import procs
from pybk_spark.protocol import bookie_instances as bi
from pybk_spark.protocol import damage_marker as dm
from pybk_spark.protocol import ledger_metadata as lm
from pybk_spark.protocol.distribution import write_set

from admin_helpers import pybk, registered, wait_until

KEY = lm.master_key(b"")
E, QW, QA = 4, 2, 2


@pytest.fixture(scope="module")
def fmt_cluster(tmp_path_factory):
    from pybk_spark.testing.fixtures import bookie_server_available, private_cluster
    if not bookie_server_available():
        pytest.skip("bookie_server is not available")
    yield from private_cluster(tmp_path_factory.mktemp("format-cluster"), num_bookies=4,
                               bookie_conf={"registration_ttl_s": 2}, metrics=False)


@pytest.fixture(scope="module")
def fbk(fmt_cluster):
    from pybk_spark.ledger.client import BookKeeper
    with BookKeeper(fmt_cluster.metadata_uri) as client:
        yield client


def _payloads(tag: str, n: int, size: int = 150) -> list[bytes]:
    return [(f"{tag}-{i}-".encode() + b"f" * size)[:size] for i in range(n)]


def _write(bk, tag: str, n: int) -> tuple[int, list[bytes]]:
    lh = bk.create_ledger(E, QW, QA)
    data = _payloads(tag, n)
    for i in range(0, n, 100):
        lh.add_entries(data[i:i + 100])
    lh.close()
    return lh.ledger_id, data


def _bookie_server(cluster, bookie_id: str, *args) -> subprocess.CompletedProcess:
    """``bookie-server [args]`` with the flags the cluster starts ``bookie_id`` with."""
    argv = [sys.executable, "-m", "bookie_server", *args,
            "--conf", str(cluster.data_dir / "bookie.conf"),
            "--port", cluster.bookie_address(bookie_id).rsplit(":", 1)[1],
            "--data-dir", str(cluster.bookie_data_dir(bookie_id)),
            "--metadata-uri", cluster.uri_for("bookie"), "--bookie-id", bookie_id]
    proc = procs.spawn(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                       stdin=subprocess.DEVNULL)
    try:
        out, err = proc.communicate(timeout=90)
    finally:
        procs.terminate(proc, grace=0)
    return subprocess.CompletedProcess(argv, proc.returncode, out, err)


def _copies_on(bk, ledger_id: int, bookie: str) -> int:
    """How many ids of its write sets ``bookie`` should hold in the ledger."""
    md = bk.get_ledger_metadata(ledger_id)
    return sum(len(es.slot_entries(first, last, len(bs), md.write_quorum, slot))
               for first, last, bs in md.fragments() for slot, b in enumerate(bs) if b == bookie)


def _assert_every_copy(bk, ledger_id: int, data: list[bytes]) -> None:
    """Every entry, read from every bookie of its write set directly: Qw copies."""
    md = bk.get_ledger_metadata(ledger_id)
    copies = [0] * len(data)
    for first, last, bookies in md.fragments():
        for slot, b in enumerate(bookies):
            want = es.slot_entries(first, last, len(bookies), md.write_quorum, slot)
            got = read_ids(bk.transports.get(b), ledger_id, want, KEY, timeout=30)
            assert not got.unreachable, (b, got.unreachable)
            table = got.table()
            ids = table.column("entry_id").to_pylist() if table is not None else []
            assert sorted(ids) == want.tolist(), (ledger_id, b, len(ids), len(want))
            for eid, payload in zip(ids, table.column("payload").to_pylist()):
                assert payload == data[eid], (ledger_id, b, eid)
                copies[eid] += 1
    assert set(copies) == {md.write_quorum}, (ledger_id, sorted(set(copies)))


def test_formatted_bookie_is_repaired_by_autorecovery_alone(fmt_cluster, fbk):
    cluster, bk, store = fmt_cluster, fbk, fbk.metadata_store
    uri = cluster.metadata_uri
    ledgers = dict(_write(bk, tag, n) for tag, n in (("a", 600), ("b", 400)))
    victim = cluster.bookie_ids[0]
    data_dir = cluster.bookie_data_dir(victim)
    first_instance = json.loads((data_dir / "cookie.json").read_text())["instance_id"]
    held = {lid: _copies_on(bk, lid, victim) for lid in ledgers}
    assert all(held.values()), held

    cluster.kill_bookie(victim)
    # format asks first: nothing is deleted without --yes
    refused = _bookie_server(cluster, victim, "format")
    assert refused.returncode == 2, refused.stderr
    lines = refused.stderr.strip().splitlines()
    assert len(lines) == 1 and "--yes" in lines[0] and str(data_dir) in lines[0], refused.stderr
    assert (data_dir / "cookie.json").exists() and store.get(f"cookies/{victim}") is not None

    shutil.rmtree(data_dir)                              # the disk is gone
    wait_until(lambda: not registered(store, victim), 60, f"{victim} unregistered")
    wiped = _bookie_server(cluster, victim)
    assert wiped.returncode == 2 and "bookie-server format" in wiped.stderr, wiped.stderr
    formatted = _bookie_server(cluster, victim, "format")    # an empty dir: nothing to confirm
    assert formatted.returncode == 0, formatted.stderr
    assert dm.marker_key(victim) in formatted.stdout, formatted.stdout
    cluster.start_bookie(victim)

    history = bi.parse(store.get(bi.instances_key(victim)).value)
    assert [i["instance_id"] for i in history][0] == first_instance and len(history) == 2
    assert dm.parse_marker(store.get(dm.marker_key(victim)).value) == ([], True)
    # before repair: listed, and the bookie never answers "no such entry" for what it lacks
    listed = pybk("--json", "listunderreplicated", "--metadata-uri", uri)
    assert listed.rc == 0, listed.err
    rows = [r for r in listed.json()["under_replicated"] if r["bookie"] == victim]
    assert {r["ledger"] for r in rows} == set(ledgers), listed.out
    lid = min(ledgers)
    md = bk.get_ledger_metadata(lid)
    ens = md.ensembles[0][1]
    eid = next(e for e in range(len(ledgers[lid]))
               if victim in [ens[i] for i in write_set(e, len(ens), md.write_quorum)])
    with pytest.raises(errors.BookieIOError):
        bk.transports.get(victim).read(lid, eid, eid, master_key=KEY, timeout=10).result()

    res = pybk("--json", "autorecovery", "--metadata-uri", uri, "--rounds", "1",
               "--interval", "0")
    assert res.rc == 0, res.out + res.err
    row = res.json()
    assert row["lost"] == [] and row["fragments_copied"] == 0, row
    assert row["damaged_repaired"] == len(ledgers), row
    assert row["damaged_entries_copied"] == sum(held.values()), row
    assert store.get(dm.marker_key(victim)) is None
    for lid, data in ledgers.items():
        assert victim in bk.get_ledger_metadata(lid).all_bookies()   # copied onto it
        _assert_every_copy(bk, lid, data)
    again = pybk("--json", "listunderreplicated", "--metadata-uri", uri)
    assert again.json()["under_replicated"] == [], again.out


def test_new_cookie_instance_without_format_and_verify_counts_fill_ins(fmt_cluster, fbk):
    cluster, bk, store = fmt_cluster, fbk, fbk.metadata_store
    uri = cluster.metadata_uri
    ledgers = dict(_write(bk, tag, n) for tag, n in (("c", 500), ("d", 300)))
    victim = cluster.bookie_ids[1]
    cluster.kill_bookie(victim)
    shutil.rmtree(cluster.bookie_data_dir(victim))
    store.delete(f"cookies/{victim}")                    # no format: cookie and disk gone
    cluster.start_bookie(victim)
    assert dm.parse_marker(store.get(dm.marker_key(victim)).value) == ([], True)
    assert len(bi.parse(store.get(bi.instances_key(victim)).value)) == 2

    # a loss nobody recorded: only --verify finds it, and says what it copied
    store.delete(dm.marker_key(victim))
    held = sum(_copies_on(bk, lid, victim) for lid in bk.list_ledgers())
    res = pybk("rereplicate", "--metadata-uri", uri, "--verify")
    assert res.rc == 0, res.out + res.err
    m = re.search(r"entries copied in all: (\d+) \(.*verify fill-ins (\d+)\)", res.out)
    assert m and int(m.group(1)) == int(m.group(2)) == held, res.out
    assert "every entry has its Qw replicas" in res.out
    for lid, data in ledgers.items():
        _assert_every_copy(bk, lid, data)
    quiet = pybk("--json", "rereplicate", "--metadata-uri", uri, "--verify")
    assert quiet.rc == 0 and quiet.json()["entries_copied"] == {
        "fragments": 0, "damaged": 0, "verify": 0}, quiet.out


def test_format_refuses_a_non_empty_data_dir_without_yes(fmt_cluster, tmp_path):
    data = tmp_path / "fresh"
    data.mkdir()
    (data / "journal").mkdir()
    (data / "journal" / "x.log").write_bytes(b"bytes")
    argv = [sys.executable, "-m", "bookie_server", "format", "--data-dir", str(data),
            "--bookie-id", "fresh-0", "--metadata-uri", fmt_cluster.uri_for("bookie")]
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=90,
                          stdin=subprocess.DEVNULL)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.count("\n") == 1 and "Pass --yes" in proc.stderr, proc.stderr
    assert (data / "journal" / "x.log").read_bytes() == b"bytes"
    done = subprocess.run([*argv, "--yes"], capture_output=True, text=True, timeout=90,
                          stdin=subprocess.DEVNULL)
    assert done.returncode == 0, done.stderr
    assert sorted(p.name for p in data.iterdir()) == ["bookie.lock"]
