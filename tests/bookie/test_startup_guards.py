"""One data dir, one bookie; one bookie id, one live bookie; ports before
etcd; children die with their parent.  Real etcd, real bookie-server and
``pybk standalone`` processes (docs/bookie.md, "Start-up guards")."""
from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import textwrap
import threading

import pytest

from pybk_spark.ledger.client import BookKeeper
from pybk_spark.metadata import open_store
from pybk_spark.cluster import procs
from pybk_spark.cluster.local import LocalCluster
from pybk_spark.testing.fixtures import bookie_server_available
from pybk_spark.testing.waiting import wait_until

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(not bookie_server_available(),
                                 reason="bookie_server is not available yet")]

HANG_GUARD = 90.0
PW = b"pw"



def until(pred, what, timeout=HANG_GUARD):
    return wait_until(pred, what, timeout)


def bookie_server(*args) -> subprocess.CompletedProcess:
    proc = procs.spawn([sys.executable, "-m", "bookie_server", *map(str, args)],
                       stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        out, err = proc.communicate(timeout=HANG_GUARD)
    finally:
        procs.terminate(proc, grace=0)
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def registration(store, bookie_id):
    got = store.get(f"bookies/writable/{bookie_id}") or store.get(f"bookies/readonly/{bookie_id}")
    return None if got is None else (json.loads(got.value), got.version)


@pytest.fixture(scope="module")
def one(tmp_path_factory):
    """A 1-bookie cluster of this module's own (its bookie gets killed)."""
    local = LocalCluster(tmp_path_factory.mktemp("guards"), num_bookies=1, metrics=True,
                         bookie_conf={"registration_ttl_s": 30})
    try:
        local.start()
        yield local
    finally:
        local.stop()


@pytest.fixture
def store(one):
    one.heal()
    s = open_store(one.metadata_uri)
    try:
        yield s
    finally:
        s.close()


def journal_prefixes(data_dir) -> dict[str, bytes]:
    """Each journal file's written part (files are preallocated with zeros)."""
    out = {}
    jdir = os.path.join(data_dir, "journal")
    for name in sorted(os.listdir(jdir)):
        with open(os.path.join(jdir, name), "rb") as fh:
            out[name] = fh.read().rstrip(b"\0")
    return out


def test_second_bookie_on_live_data_dir_is_refused_and_nothing_is_lost(one, store):
    data = one.bookie_data_dir("bookie-0")
    pid = one.bookie_pid("bookie-0")
    reg_before = registration(store, "bookie-0")
    bk = BookKeeper(one.metadata_uri)
    try:
        lh = bk.create_ledger(1, 1, 1, password=PW)
        first = [f"before-{i}".encode() for i in range(20)]
        for p in first:
            lh.add_entry(p)
        journal = journal_prefixes(data)
        kept = {n: (data / n).read_bytes() for n in ("cookie.json", "bookie.lock")}

        res = bookie_server("--data-dir", data, "--bookie-id", "bookie-0", "--port", 0,
                            "--metadata-uri", one.metadata_uri)
        assert res.returncode == 2, res.stderr
        lines = res.stderr.strip().splitlines()
        assert len(lines) == 1 and "Traceback" not in res.stderr, res.stderr
        assert f"pid {pid}" in lines[0] and str(data) in lines[0]
        # it touched nothing: cookie, lock file, journal bytes, registration
        assert {n: (data / n).read_bytes() for n in kept} == kept
        now = journal_prefixes(data)
        for name, prefix in journal.items():
            assert now[name].startswith(prefix), f"journal {name} changed"
        assert registration(store, "bookie-0") == reg_before

        second = [f"after-{i}".encode() for i in range(20)]
        for p in second:
            lh.add_entry(p)
        lh.close()
        got = [e.payload for e in bk.open_ledger(lh.ledger_id, PW).read(0, 39)]
        assert got == first + second
    finally:
        bk.close()
    # and after a crash + restart of the bookie, from its disk
    one.kill_bookie("bookie-0")
    one.start_bookie("bookie-0")
    bk = BookKeeper(one.metadata_uri)
    try:
        got = [e.payload for e in bk.open_ledger(lh.ledger_id, PW).read(0, 39)]
        assert got == first + second
    finally:
        bk.close()


def test_format_cannot_empty_a_running_bookies_data_dir(one, store):
    data = one.bookie_data_dir("bookie-0")
    cookie = (data / "cookie.json").read_bytes()
    res = bookie_server("format", "--data-dir", data, "--bookie-id", "bookie-0",
                        "--metadata-uri", one.metadata_uri)
    assert res.returncode == 2, res.stderr
    assert f"pid {one.bookie_pid('bookie-0')}" in res.stderr
    assert (data / "cookie.json").read_bytes() == cookie
    assert store.get("cookies/bookie-0") is not None


def test_same_bookie_id_other_data_dir_is_refused_while_live(one, store, tmp_path):
    reg_before = registration(store, "bookie-0")
    other = tmp_path / "other"
    res = bookie_server("--data-dir", other, "--bookie-id", "bookie-0", "--port", 0,
                        "--metadata-uri", one.metadata_uri)
    assert res.returncode == 2, res.stderr
    assert len(res.stderr.strip().splitlines()) == 1, res.stderr
    assert "registered by a live bookie" in res.stderr
    assert f"pid {one.bookie_pid('bookie-0')}" in res.stderr
    assert registration(store, "bookie-0") == reg_before
    assert os.listdir(other) == ["bookie.lock"]        # no cookie, no journal


@pytest.mark.parametrize("flag,setting", [("--port", "port"),
                                          ("--add-lane-port", "add_lane_port"),
                                          ("--metrics-port", "metrics_port")])
def test_port_in_use_is_refused_before_etcd_is_written(one, store, tmp_path, flag, setting):
    holder = socket.create_server(("127.0.0.1", 0))
    taken = holder.getsockname()[1]
    try:
        bid = f"fresh-{setting}"
        ports = {"--port": 0, "--add-lane-port": 0, "--metrics-port": 0, flag: taken}
        args = ["--data-dir", tmp_path / "b", "--bookie-id", bid,
                "--metadata-uri", one.metadata_uri]
        for f, p in ports.items():
            args += [f, p]
        res = bookie_server(*args)
    finally:
        holder.close()
    assert res.returncode == 2, res.stderr
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in res.stderr, res.stderr
    assert str(taken) in lines[0] and setting in lines[0] and flag in lines[0]
    assert store.get(f"cookies/{bid}") is None
    assert registration(store, bid) is None
    assert os.listdir(tmp_path / "b") == ["bookie.lock"]


def test_crashed_bookie_restarts_at_once_over_its_own_live_registration(one, store):
    """The predecessor's lease is still alive; the data dir lock proves it
    dead, so its registration is replaced, not waited out."""
    old, old_version = registration(store, "bookie-0")
    old_pid = one.bookie_pid("bookie-0")
    assert old["owner"]["pid"] == old_pid
    one.kill_bookie("bookie-0")
    assert registration(store, "bookie-0") is not None      # lease not expired yet
    one.start_bookie("bookie-0")
    new, new_version = registration(store, "bookie-0")
    assert new["owner"]["pid"] == one.bookie_pid("bookie-0") != old_pid
    assert new_version > old_version
    assert "event=registration_replaced" in one.bookie_log("bookie-0").read_text()


# -- pybk standalone and child processes ---------------------------------------------------
def standalone(data_dir, *extra):
    return procs.spawn([sys.executable, "-m", "pybk_spark.commands.cli", "standalone", "--bookies", "1",
                        "--data-dir", str(data_dir), *extra],
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def read_until_ready(proc) -> list[str]:
    lines: list[str] = []
    done = threading.Event()

    def pump():
        for line in proc.stdout:
            lines.append(line.rstrip("\n"))
            if line.startswith("standalone ready"):
                done.set()
        done.set()
    threading.Thread(target=pump, daemon=True).start()
    assert done.wait(HANG_GUARD) and lines and lines[-1].startswith("standalone ready"), lines
    return lines


def gone(pids) -> bool:
    return not any(procs.pid_alive(p) for p in pids)


def test_second_standalone_on_same_data_dir_fails_fast_and_sigkill_takes_children(tmp_path):
    first = standalone(tmp_path)
    try:
        lines = read_until_ready(first)
        children = [int(m) for line in lines for m in re.findall(r"pid=(\d+)", line)]
        assert len(children) == 2 and all(procs.pid_alive(p) for p in children)
        second = standalone(tmp_path)
        out, _ = second.communicate(timeout=HANG_GUARD)
        procs.unregister(second)
        assert second.returncode == 2, out
        assert out.strip().splitlines() == [out.strip()] and "Traceback" not in out, out
        assert f"pid {first.pid}" in out and "standalone.lock" in out
        assert all(procs.pid_alive(p) for p in children)     # the first is untouched
        first.send_signal(signal.SIGKILL)                    # no clean-up runs
        first.wait(HANG_GUARD)
        until(lambda: gone(children), f"children {children} to die with their parent")
    finally:
        procs.terminate(first, grace=0)


LAUNCHER = textwrap.dedent("""
    import sys, threading, time
    from pybk_spark.cluster import procs
    sleeper = [sys.executable, "-c", "import time; time.sleep(600)"]
    pids = [procs.spawn(sleeper).pid]
    box = []
    t = threading.Thread(target=lambda: box.append(procs.spawn(sleeper).pid))
    t.start(); t.join()              # the spawning thread is gone: its child must live
    pids += box
    print(" ".join(map(str, pids)), flush=True)
    time.sleep(600)
""")


def test_launcher_children_outlive_spawning_thread_but_not_parent_sigkill():
    launcher = subprocess.Popen([sys.executable, "-c", LAUNCHER], stdout=subprocess.PIPE,
                                text=True, start_new_session=True)
    procs.register(launcher)
    try:
        pids = [int(p) for p in launcher.stdout.readline().split()]
        assert len(pids) == 2
        # the one spawned from a finished thread is alive (not PDEATHSIG'd by it)
        with pytest.raises(subprocess.TimeoutExpired):
            launcher.wait(1.0)
        assert all(procs.pid_alive(p) for p in pids)
        launcher.send_signal(signal.SIGKILL)
        launcher.wait(HANG_GUARD)
        until(lambda: gone(pids), f"children {pids} to die with their parent")
    finally:
        procs.terminate(launcher, grace=0)
