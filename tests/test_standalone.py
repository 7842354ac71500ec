"""``pybk standalone`` as a user runs it: a subprocess that prints the metadata
URI once etcd and every bookie serve (a script reads and writes at once,
without retrying), or with ``--json`` one JSON document and nothing else on
stdout; it is used from outside, stops on SIGTERM leaving no process behind,
and keeps its data across a restart on the same data dir."""
from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from pybk_spark.metadata import open_store
from pybk_spark.cluster import procs
from pybk_spark.testing.fixtures import bookie_server_available

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(not bookie_server_available(),
                                 reason="bookie_server is not available yet")]

HANG_GUARD = 90.0


class Standalone:
    """``pybk standalone`` in a subprocess, its output read by a thread."""

    def __init__(self, data_dir, bookies=3, extra=()):
        self.proc = procs.spawn(
            [sys.executable, "-m", "pybk_spark.commands.cli", "standalone", "--bookies", str(bookies),
             "--data-dir", str(data_dir), *extra],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            text=True, start_new_session=False)
        self.lines: list[str] = []
        self._cond = threading.Condition()
        threading.Thread(target=self._pump, daemon=True).start()

    def _pump(self):
        for line in self.proc.stdout:
            with self._cond:
                self.lines.append(line.rstrip("\n"))
                self._cond.notify_all()
        with self._cond:
            self._cond.notify_all()

    def wait_for(self, pattern: str) -> re.Match:
        deadline = time.monotonic() + HANG_GUARD
        with self._cond:
            while True:
                for line in self.lines:
                    m = re.fullmatch(pattern, line)
                    if m:
                        return m
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    pytest.fail(f"no line matching {pattern!r}; output:\n" + "\n".join(self.lines))
                self._cond.wait(0.2)

    def child_pids(self) -> list[int]:
        """Pids the standalone reported for its etcd and bookies (cross-checked in /proc)."""
        pids = [int(m) for line in self.lines for m in re.findall(r"pid=(\d+)", line)]
        assert sorted(pids) == sorted(procs.children_of(self.proc.pid))
        return pids

    def terminate(self) -> int:
        self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(HANG_GUARD)
        finally:
            procs.terminate(self.proc, grace=0)


def assert_all_gone(pids):
    deadline = time.monotonic() + HANG_GUARD
    while any(procs.pid_alive(p) for p in pids):
        if time.monotonic() > deadline:
            pytest.fail(f"orphans left: {[p for p in pids if procs.pid_alive(p)]}")
        time.sleep(0.05)


def test_standalone_serves_stops_cleanly_and_keeps_data(tmp_path):
    data_dir = tmp_path / "standalone"
    sa = Standalone(data_dir)
    try:
        uri = sa.wait_for(r"metadataServiceUri=(etcd://127\.0\.0\.1:\d+/pybk)").group(1)
        sa.wait_for(r"standalone ready: .*")
        pids = sa.child_pids()
        assert len(pids) == 4                          # etcd + 3 bookies

        store = open_store(uri)                        # used from outside
        try:
            bookies = [k for k, _ in store.list_prefix("bookies/writable/")]
            assert bookies == [f"bookies/writable/bookie-{i}" for i in range(3)]
            store.put_if_absent("ledgers/00000000000000000042", b"kept")
        finally:
            store.close()

        out = subprocess.run([sys.executable, "-m", "pybk_spark.commands.cli", "--json", "listbookies",
                              "--metadata-uri", uri], capture_output=True, text=True, timeout=60)
        assert out.returncode == 0, out.stderr
        assert sorted(b["bookie_id"] for b in json.loads(out.stdout)) == \
            ["bookie-0", "bookie-1", "bookie-2"]
    finally:
        rc = sa.terminate()
    assert rc == 0
    assert_all_gone(pids + [sa.proc.pid])

    again = Standalone(data_dir)
    try:
        uri2 = again.wait_for(r"metadataServiceUri=(etcd://127\.0\.0\.1:\d+/pybk)").group(1)
        again.wait_for(r"standalone ready: .*")
        assert uri2 == uri                             # same ports remembered
        store = open_store(uri2)
        try:
            assert store.get("ledgers/00000000000000000042").value == b"kept"
        finally:
            store.close()
        pids2 = again.child_pids()
    finally:
        again.terminate()
    assert_all_gone(pids2 + [again.proc.pid])


def _write_then_read(uri: str) -> None:
    """What a script does right after the URI appears: no retry, no wait."""
    from pybk_spark.ledger.client import BookKeeper
    with BookKeeper(uri) as bk:
        lh = bk.create_ledger(3, 3, 2)
        lh.add_entries([b"at", b"once"])
        lh.close()
    with BookKeeper(uri) as reader:             # a fresh client: resolves every bookie anew
        assert [e.payload for e in reader.open_ledger(lh.ledger_id).read(0, 1)] == \
            [b"at", b"once"]


def test_a_script_uses_the_uri_the_moment_it_is_printed(tmp_path):
    sa = Standalone(tmp_path / "script")
    try:
        uri = sa.wait_for(r"metadataServiceUri=(etcd://127\.0\.0\.1:\d+/pybk)").group(1)
        _write_then_read(uri)
        sa.wait_for(r"standalone ready: .*")
    finally:
        assert sa.terminate() == 0


def documented_json_keys() -> set[str]:
    """The keys of the ``pybk --json standalone`` document docs/operations.md shows."""
    text = (Path(__file__).resolve().parents[1] / "docs" / "operations.md").read_text()
    block = re.search(r"```text\n(\{\"metadataServiceUri\".*?)```", text, re.S)
    assert block, "docs/operations.md shows no pybk --json standalone document"
    return set(re.findall(r'"(\w+)":', block.group(1)))


def test_standalone_json_is_one_document_naming_every_bookie(tmp_path):
    from pybk_spark.transport.grpc_bookie import BookieClient
    proc = procs.spawn(
        [sys.executable, "-m", "pybk_spark.commands.cli", "--json", "standalone", "--bookies", "3",
         "--data-dir", str(tmp_path / "json")],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True,
        start_new_session=False)
    err_lines: list[str] = []

    def drain_stderr() -> None:
        try:
            err_lines.extend(proc.stderr)
        except ValueError:      # communicate() below read the rest and closed the pipe
            pass
    threading.Thread(target=drain_stderr, daemon=True).start()
    try:
        first = proc.stdout.readline()          # blocks until the cluster serves
        assert first, f"no document; stderr:\n{''.join(err_lines)}"
        doc = json.loads(first)
        uri = doc["metadataServiceUri"]
        assert re.fullmatch(r"etcd://127\.0\.0\.1:\d+/pybk", uri)
        _write_then_read(uri)
        assert [b["bookie_id"] for b in doc["bookies"]] == ["bookie-0", "bookie-1", "bookie-2"]
        for b in doc["bookies"]:
            assert b["address"] == f"127.0.0.1:{b['port']}"
            assert b["add_lane_address"] == f"127.0.0.1:{b['lane_port']}"
            client = BookieClient(b["address"], bookie_id=b["bookie_id"])
            try:
                assert client.info().result(30) is not None
            finally:
                client.close()
        pids = [doc["etcd"]["pid"]] + [b["pid"] for b in doc["bookies"]]
        assert sorted(pids) == sorted(procs.children_of(proc.pid))
        assert doc["tls"] is None and doc["data_dir"] == str(tmp_path / "json")
        # docs/operations.md shows the document: it names exactly these keys
        shown = documented_json_keys()
        assert set(doc) | set(doc["etcd"]) | set(doc["bookies"][0]) == shown
    finally:
        proc.send_signal(signal.SIGTERM)
        rest, _ = proc.communicate(timeout=HANG_GUARD)
        procs.terminate(proc, grace=0)
    assert proc.returncode == 0
    assert rest == ""                           # the document is all there is on stdout
    assert_all_gone(pids + [proc.pid])


def test_listbookies_without_uri_is_a_clear_error():
    env = {k: v for k, v in os.environ.items() if k != "PYBK_METADATA_URI"}
    out = subprocess.run([sys.executable, "-m", "pybk_spark.commands.cli", "--json", "listbookies"],
                         capture_output=True, text=True, env=env, timeout=60)
    assert out.returncode == 1
    err = json.loads(out.stdout)
    assert err["error"] == "IncorrectParameter" and err["code"] == -14


def test_standalone_tls_prints_client_settings_that_work(tmp_path):
    pytest.importorskip("trustme")
    from pybk_spark import errors
    from pybk_spark.ledger.client import BookKeeper
    sa = Standalone(tmp_path / "tls", bookies=3, extra=("--tls",))
    try:
        uri = sa.wait_for(r"metadataServiceUri=(etcd://127\.0\.0\.1:\d+/pybk)").group(1)
        conf_path = sa.wait_for(r"tls: client conf file: (\S+) .*").group(1)
        sa.wait_for(r"tls: Spark options: tls\.caFile=\S+ tls\.certFile=\S+ tls\.keyFile=\S+")
        sa.wait_for(r"standalone ready: .*")
        with BookKeeper(uri, conf=conf_path) as bk:
            lh = bk.create_ledger(3, 2, 2)
            lh.add_entries([b"over", b"tls"])
            lh.close()
            assert [e.payload for e in bk.open_ledger(lh.ledger_id).read(0, 1)] == \
                [b"over", b"tls"]
        with BookKeeper(uri) as plain:                  # no TLS settings: refused, typed
            with pytest.raises(errors.NotEnoughBookies, match="TlsError.*tls_ca_file"):
                plain.create_ledger(3, 2, 2).add_entry(b"x")
    finally:
        assert sa.terminate() == 0
