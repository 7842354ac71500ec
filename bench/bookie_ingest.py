"""Bookie append throughput with fdatasync on, against the disk's own limits.

Run: ``.venv/bin/python -m bench.bookie_ingest [--quick] [--data-dir DIR]``.
Starts one real ``bookie-server`` (standalone), streams Arrow batches of N x
1 KiB entries pipelined over its add lane, the path clients use by default
(``--transport grpc``: over the AddStream RPC instead); every ack means the
batch is fdatasync'd in the journal.  N is 1, 100 and 1000.  In the same run
it measures 4 KiB write+fdatasync and sequential write bandwidth of the same
disk.

The 1000 x 1 KiB load is timed twice on the same bookie: first on a fresh
bookie, then *sustained*, once the bookie has journaled more than its
page-cache window (``journal_page_cache_keep_mb``), so that new writes land in
pages the window has freed, as on a bookie that has been running for a while
(docs/performance.md, (2)).  The disk peer reuses freed pages the same way (it
deletes each probe file before the next), so the sustained figure is the one
the headline ratio uses.  ``run()`` returns a dict; the table goes to stdout.
"""
from __future__ import annotations

import argparse
import json
import os
import socket
import tempfile
import threading
import time

import numpy as np
import pyarrow as pa

from bench import disk
from bookie_server.config import BookieConfig
from pybk_spark.testing.bookie_process import BookieProcess, free_port
from pybk_spark.wire import framing
from pybk_spark.wire import lane_frames
from pybk_spark.wire import bookie_wire_pb2 as pb
from pybk_spark.wire.frame_socket import read_frame
from pybk_spark.wire.entries import ENTRY_SCHEMA, batch_to_bytes

ENTRY_BYTES = 1024


def _requests(ledger_id: int, n_per_batch: int, n_batches: int, key: bytes):
    payload = pa.array([os.urandom(ENTRY_BYTES)] * n_per_batch, pa.binary())
    digest = pa.array([b"\0" * 8] * n_per_batch, pa.binary())
    lid = pa.array(np.full(n_per_batch, ledger_id, np.int64))
    for b in range(n_batches):
        ids = np.arange(b * n_per_batch, (b + 1) * n_per_batch, dtype=np.int64)
        batch = pa.RecordBatch.from_arrays([lid, pa.array(ids), pa.array(ids - 1), payload,
                                            digest, pa.array((ids + 1) * ENTRY_BYTES)],
                                           schema=ENTRY_SCHEMA)
        yield pb.AddRequest(ledger_id=ledger_id, master_key=key, entries=batch_to_bytes(batch),
                            request_id=b)


def _lane_frames(chunk) -> list:
    """The AddRequests of ``chunk`` as lane frames, built before the clock starts."""
    out = []
    for r in chunk:
        entries, r.entries = r.entries, b""
        out.append(lane_frames.frame(*framing.payload_parts(r, entries)))
    return out


def _lane_stream(target: tuple, frames: list, errors: list) -> None:
    """One add lane connection: a thread sends the frames, this one reads
    every answer (the bookie holds back at max_inflight_per_stream)."""
    port, bookie_id = target
    with socket.create_connection(("127.0.0.1", port)) as sock:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

        def send():
            sock.sendall(lane_frames.hello(bookie_id))
            for f in frames:
                sock.sendall(f)
        sender = threading.Thread(target=send)
        sender.start()
        with sock.makefile("rb") as stream:
            for _ in frames:
                body = read_frame(stream, 1 << 20)
                if body is None:
                    errors.append("add lane closed")
                    break
                resp = pb.AddResponse.FromString(body)
                if resp.code != 0:
                    errors.append(resp.message)
        sender.join()


def stream_adds(target, ledger_id: int, n_per_batch: int, n_batches: int,
                streams: int = 1) -> dict:
    """Pre-serialises the batches, then times the pipelined stream(s).
    ``target``: a gRPC stub (AddStream) or an add lane's (port, bookie id)."""
    reqs = list(_requests(ledger_id, n_per_batch, n_batches, b"bench"))
    chunks = [reqs[i::streams] for i in range(streams)]
    if isinstance(target, tuple):
        chunks = [_lane_frames(c) for c in chunks]
    errors: list = []

    def one(chunk):
        if isinstance(target, tuple):
            _lane_stream(target, chunk, errors)
            return
        for resp in target.AddStream(iter(chunk)):
            if resp.code != 0:
                errors.append(resp.message)
    t0, c0 = time.perf_counter(), time.process_time()
    threads = [threading.Thread(target=one, args=(c,)) for c in chunks]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    elapsed = time.perf_counter() - t0
    client_cpu = (time.process_time() - c0) / elapsed
    if errors:
        raise RuntimeError(f"adds failed: {errors[:3]}")
    entries = n_per_batch * n_batches
    return {"entries_per_s": entries / elapsed, "mb_per_s": entries * ENTRY_BYTES / elapsed / 1e6,
            "batches_per_s": n_batches / elapsed, "seconds": elapsed,
            "client_cpu_per_s": client_cpu}


def _cpu_split(pid: int) -> tuple[float, float]:
    """(user, system) CPU seconds of a process (Linux /proc)."""
    with open(f"/proc/{pid}/stat") as fh:
        fields = fh.read().rsplit(")", 1)[1].split()
    tck = os.sysconf("SC_CLK_TCK")
    return int(fields[11]) / tck, int(fields[12]) / tck


def _cpu_seconds(pid: int) -> float:
    """utime+stime of a process, to show CPU-boundness."""
    return sum(_cpu_split(pid))


def _sustained(bookie: BookieProcess, n_batches: int, window_mb: int) -> dict:
    """The 1000 x 1 KiB load again, once the journal's page-cache window is full.

    Writes a quarter more than the window first (at least one ledger of
    ``n_batches`` batches, the size of the timed part), untimed."""
    stub = _target(bookie)
    ledger_bytes = n_batches * 1000 * ENTRY_BYTES
    fill = max(ledger_bytes, int(window_mb * 1.25 * (1 << 20)))
    fill_ledger, filled = 5000, 0
    while filled < fill:
        stream_adds(stub, fill_ledger, 1000, n_batches)
        fill_ledger += 1
        filled += ledger_bytes
    u0, s0 = _cpu_split(bookie.started().pid)
    x = stream_adds(stub, fill_ledger, 1000, n_batches)
    u1, s1 = _cpu_split(bookie.started().pid)
    x["server_cpu_per_s"] = (u1 + s1 - u0 - s0) / x["seconds"]
    x["server_sys_cpu_per_s"] = (s1 - s0) / x["seconds"]
    x["journaled_before_mb"] = filled / 1e6
    x["page_cache_window_mb"] = window_mb
    return x


def _target(bookie: BookieProcess):
    """Where adds go: the bookie's add lane (port, bookie id), or its gRPC stub."""
    port = int(bookie.conf.get("add_lane_port", -1))
    return (port, bookie.bookie_id) if port > 0 else bookie.stub()


def run(quick: bool = False, data_dir: str | None = None, conf: dict | None = None,
        sizes: tuple = (1, 100, 1000), transport: str = "lane") -> dict:
    plan = {1: 500 if quick else 3000, 100: 100 if quick else 600, 1000: 60 if quick else 400}
    conf = dict(conf or {})
    if quick:       # a window the smoke run can fill in a second
        conf.setdefault("journal_page_cache_keep_mb", 16)
    window_mb = int(conf.get("journal_page_cache_keep_mb", BookieConfig().journal_page_cache_keep_mb))
    results: dict = {}
    with tempfile.TemporaryDirectory(dir=data_dir) as d:
        results["disk"] = disk.measure(d, quick=quick)
        lane = (lambda: {"add_lane_port": free_port()}) if transport == "lane" else dict
        results["transport"] = transport
        bookie = BookieProcess(os.path.join(d, "bookie"),
                               conf={"flush_interval_s": 2.0, **lane(), **conf})
        bookie.start()
        try:
            stub = _target(bookie)
            for ledger, (n, batches) in enumerate(plan.items(), start=1):
                if n not in sizes:
                    continue
                stream_adds(stub, 1000 + ledger, n, max(5, batches // 10))   # warm-up
                u0, s0 = _cpu_split(bookie.started().pid)
                results[f"add_batch_{n}"] = stream_adds(stub, ledger, n, batches)
                x = results[f"add_batch_{n}"]
                u1, s1 = _cpu_split(bookie.started().pid)
                x["server_cpu_per_s"] = (u1 + s1 - u0 - s0) / x["seconds"]
                x["server_sys_cpu_per_s"] = (s1 - s0) / x["seconds"]
            if 1000 in sizes:
                results["add_batch_1000_sustained"] = _sustained(bookie, plan[1000], window_mb)
        finally:
            bookie.terminate()
        if 1000 in sizes:   # same load with bigger group commits (8 MiB / 4 ms)
            tuned = BookieProcess(os.path.join(d, "bookie-tuned"), conf={
                "flush_interval_s": 2.0, "journal_max_group_bytes": 8 << 20,
                "journal_max_group_wait_ms": 4, **lane(), **(conf or {})})
            tuned.start()
            try:
                stream_adds(_target(tuned), 1001, 1000, max(5, plan[1000] // 10))
                cpu0 = _cpu_seconds(tuned.started().pid)
                x = results["add_batch_1000_group8m"] = stream_adds(_target(tuned), 1, 1000,
                                                                    plan[1000])
                x["server_cpu_per_s"] = (_cpu_seconds(tuned.started().pid) - cpu0) / x["seconds"]
            finally:
                tuned.terminate()
        # the machine may be shared: measure the disk again after, use the mean
        after = disk.measure(d, quick=quick)
    results["disk_after"] = after
    seq = (results["disk"]["seq_write"]["mb_per_s"] + after["seq_write"]["mb_per_s"]) / 2
    fsync = (results["disk"]["fsync_4k"]["ops_per_s"] + after["fsync_4k"]["ops_per_s"]) / 2
    results["disk_seq_mb_per_s_mean"] = seq
    results["disk_fsync_per_s_mean"] = fsync
    sustained = (results["disk"]["seq_sustained"]["mb_per_s"]
                 + after["seq_sustained"]["mb_per_s"]) / 2
    results["disk_sustained_mb_per_s_mean"] = sustained
    overwrite = (results["disk"]["seq_overwrite"]["mb_per_s"]
                 + after["seq_overwrite"]["mb_per_s"]) / 2
    results["disk_overwrite_mb_per_s_mean"] = overwrite
    if "add_batch_1000_sustained" in results:
        # the headline ratio: the device's bandwidth with nothing
        # being allocated (bench/disk.py), which holds still between runs
        results["ratio_1000_sustained_vs_disk_overwrite"] = \
            results["add_batch_1000_sustained"]["mb_per_s"] / overwrite
        # kept beside it: sustained ingest / sustained disk
        results["ratio_1000_sustained_vs_disk_sustained"] = \
            results["add_batch_1000_sustained"]["mb_per_s"] / sustained
    if "add_batch_1000" in results:
        results["ratio_1000_vs_seq"] = results["add_batch_1000"]["mb_per_s"] / seq
        results["ratio_1000_sustained_vs_seq"] = \
            results["add_batch_1000_sustained"]["mb_per_s"] / seq
        results["ratio_1000_group8m_vs_seq"] = \
            results["add_batch_1000_group8m"]["mb_per_s"] / seq
    if "add_batch_1" in results:
        results["ratio_1_vs_fsync"] = results["add_batch_1"]["batches_per_s"] / fsync
    return results


def print_table(r: dict) -> None:
    for label, dk in (("before", r["disk"]), ("after", r["disk_after"])):
        print(f"disk {label}: 4 KiB write+fdatasync {dk['fsync_4k']['ops_per_s']:.0f}/s "
              f"(p50 {dk['fsync_4k']['p50_ms']:.2f} ms, p99 {dk['fsync_4k']['p99_ms']:.2f} ms); "
              f"sequential write {dk['seq_write']['mb_per_s']:.0f} MB/s (fdatasync / 64 MiB), "
              f"{dk['sync_1m_write']['mb_per_s']:.0f} MB/s (fdatasync / 1 MiB)")
    print(f"{'batch':>16} {'entries/s':>12} {'MB/s':>8} {'batches/s':>10} "
          f"{'server CPU':>10} {'(kernel)':>8} {'client CPU':>10}")
    for n in ("1", "100", "1000", "1000_sustained", "1000_group8m"):
        x = r.get(f"add_batch_{n}")
        if x is None:
            continue
        print(f"{n:>16} {x['entries_per_s']:>12.0f} {x['mb_per_s']:>8.1f} "
              f"{x['batches_per_s']:>10.0f} {x['server_cpu_per_s']:>10.0%} "
              f"{x.get('server_sys_cpu_per_s', float('nan')):>8.0%} "
              f"{x['client_cpu_per_s']:>10.0%}")
    if "ratio_1000_vs_seq" in r:
        print(f"bookie(1000 x 1 KiB) / disk sequential (mean) = {r['ratio_1000_vs_seq']:.2f} "
              f"fresh, {r['ratio_1000_sustained_vs_seq']:.2f} sustained (target >= 0.50)")
        print(f"same with 8 MiB group commits / disk sequential (mean) = "
              f"{r['ratio_1000_group8m_vs_seq']:.2f}")
    if "ratio_1_vs_fsync" in r:
        print(f"bookie(1 x 1 KiB) batches/s / disk fdatasync/s = {r['ratio_1_vs_fsync']:.2f}")


def main(argv=None) -> dict:
    p = argparse.ArgumentParser()
    p.add_argument("--quick", action="store_true")
    p.add_argument("--data-dir")
    p.add_argument("--json", action="store_true")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="bookie conf override (repeatable)")
    p.add_argument("--sizes", default="1,100,1000")
    p.add_argument("--transport", choices=("lane", "grpc"), default="lane")
    a = p.parse_args(argv)
    conf = dict(kv.split("=", 1) for kv in a.set)
    r = run(a.quick, a.data_dir, conf, tuple(int(x) for x in a.sizes.split(",")), a.transport)
    print(json.dumps(r, indent=1)) if a.json else print_table(r)
    return r


if __name__ == "__main__":
    main()
