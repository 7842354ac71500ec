"""The floor of a bookie-to-bookie copy on this machine (figure 8's peer).

Re-replication's target is half the disk's sequential bandwidth.  Before
asking how far our pull is from it, this measures how far the bare copy is:
the same bytes moved from one process to another and made durable with
nothing but the system calls, the way the sync-add floor
(bench/sync_floor.py) does for a sync add.

* A *source* process per stream (``python -c``) sends its share of a
  stored file, a chunk at a time.  From the disk (``source="disk"``, the
  floor of ``rereplication_vs_copy_floor``): each chunk is read with
  ``O_DIRECT`` into one reused buffer on huge pages and sent from it, as
  a pull's source reads its stored batches (``segment_files.read_direct``:
  the journal writes big groups around the page cache, so a fragment's
  bytes are on the disk, not in memory); where the file system refuses
  ``O_DIRECT``, a buffered ``pread``.  From the page cache
  (``source="cached"``, printed beside it): ``os.sendfile`` of a file just
  written, with no read from the disk and no user-space copy.  On one
  machine the disk source shares the disk between reading and writing, as
  a pull between two bookies of the same machine does.
* A *replacement* process per stream receives each ``CHUNK_BYTES`` chunk
  into one reused buffer on huge pages, computes its CRC32C (the digest check
  a pull must make), writes it with ``O_DIRECT`` when the file system allows
  (no page-cache copy; else a buffered write), ``fdatasync``s, and answers
  8 bytes.
* Huge pages (``bookie_server/direct_buffers.py``), as the bookies' direct
  reads and journal writes use: in 4 KiB pages the same ``pread`` of 4 MiB
  goes to the disk as requests of 0.5-1 MiB, and this disk's bandwidth
  follows the number of requests, not the bytes (a copy from 4 KiB pages
  moves 600-1,280 MB/s as the pages' physical order lets the block layer
  merge them; from huge pages 1,070-1,260).
* one pair, then ``orchestrate.DEFAULT_PARALLEL`` pairs at once, each over
  its own slice of the file (figure 8 copies that many fragments at once).
  Figure 8 runs the copy from the disk right before its timed pull and
  again right after it (a big copy slows whatever writes next on this
  disk, so either alone favours one side), and divides by the mean
  (``around``).  Both read a file written before the pull's ledgers
  (``stored_file``), so the copy reads bytes as old as the ones the pull
  reads: a virtual disk's host keeps recent writes, and a file read right
  after it is written reads faster than one written gigabytes ago.

No Arrow, no protobuf, no index, no digest per entry, no metadata: ours /
this is how much of a copy's cost is our protocol's and how much is the
kernel's and the disk's on this machine, and this / the disk says whether
half the disk is within reach of any copy between two processes here.  CPU
is each process's own user + system time (``os.times``), reported by it.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from typing import IO

CHUNK_BYTES = 4 << 20

# both helpers' buffers: huge pages, as a bookie's direct I/O uses, so the
# disk gets requests of 4 MiB (bookie_server/direct_buffers.py)
_HUGE = "from bookie_server.direct_buffers import huge_mapping as huge\n"

_REPLACEMENT = _HUGE + r"""
import os, socket, sys
import google_crc32c, pyarrow
path, chunks, size = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC
mode = "direct"
try:
    fd = os.open(path, flags | os.O_DIRECT, 0o644)
except (OSError, AttributeError):
    fd, mode = os.open(path, flags, 0o644), "buffered"
raw, view = huge(size)                   # huge pages, reused for every chunk
whole = pyarrow.py_buffer(view)          # what google_crc32c takes without a copy
srv = socket.create_server(("127.0.0.1", 0))
print(srv.getsockname()[1], flush=True)
conn, _ = srv.accept()
t0 = os.times()                          # start-up (imports) not counted
crc = 0
for _ in range(chunks):
    got = 0
    while got < size:
        k = conn.recv_into(view[got:])
        if not k:
            sys.exit("source ended early")
        got += k
    crc ^= google_crc32c.value(whole)   # the digest work a pull does; the value is not needed
    try:
        os.write(fd, view)
    except OSError:                      # a file system that refuses this O_DIRECT write
        os.close(fd)
        fd, mode = os.open(path, os.O_WRONLY | os.O_APPEND), "buffered"
        os.write(fd, view)
    os.fdatasync(fd)
    conn.sendall(b"\0" * 8)
t = os.times()
print(mode, t.user + t.system - t0.user - t0.system, flush=True)
"""

_SOURCE = _HUGE + r"""
import os, socket, sys
path, port, offset, length, size, source = (sys.argv[1], int(sys.argv[2]), int(sys.argv[3]),
                                            int(sys.argv[4]), int(sys.argv[5]), sys.argv[6])
fd = os.open(path, os.O_RDONLY)
mode = "sendfile"
if source == "disk":
    mode = "direct"
    try:
        rfd = os.open(path, os.O_RDONLY | os.O_DIRECT)
    except (OSError, AttributeError):
        rfd, mode = fd, "buffered"
    raw, view = huge(size)               # huge pages, reused for every chunk
s = socket.create_connection(("127.0.0.1", port))
sys.stdin.readline()                     # go
t0 = os.times()
end, pos = offset + length, offset
while pos < end:
    if source == "disk":
        try:
            n = os.preadv(rfd, [view], pos)
        except OSError:                  # a file system that refuses this O_DIRECT read
            rfd, mode = fd, "buffered"
            n = os.preadv(rfd, [view], pos)
        s.sendall(view[:n])
        pos += n
    else:
        pos += os.sendfile(s.fileno(), fd, pos, end - pos)
acks = 0
while acks < length // size * 8:
    got = s.recv(65536)
    if not got:
        sys.exit("replacement ended early")
    acks += len(got)
t = os.times()
print(mode, t.user + t.system - t0.user - t0.system, flush=True)
"""


def _out(proc: subprocess.Popen) -> IO[str]:
    """A helper process's stdout (each is started with stdout=PIPE, in text mode)."""
    assert proc.stdout is not None, "helpers are started with stdout=PIPE"
    return proc.stdout

def stored_file(work_dir: str, total_bytes: int) -> str:
    """A file of ``total_bytes`` in ``work_dir``, written and fsynced: what
    the copy from the disk reads (the caller removes it)."""
    fd, path = tempfile.mkstemp(prefix="copy-floor-", dir=work_dir)
    block = os.urandom(CHUNK_BYTES)
    with os.fdopen(fd, "wb") as fh:
        for _ in range(total_bytes // CHUNK_BYTES):
            fh.write(block)
        fh.flush()
        os.fsync(fh.fileno())         # on the disk before the disk source reads it
    return path


def measure(work_dir: str, total_bytes: int, streams_list=None, cached: bool = True,
            src: str | None = None) -> dict:
    """MB/s and CPU-s per GB of the bare copy from the disk, one stream and
    as many as figure 8 copies at once (``orchestrate.DEFAULT_PARALLEL``),
    under ``str(streams)``; with ``cached``, the copy from the page cache at
    that many at once under ``"cached"``.  ``src``: the stored file the copy
    from the disk reads (``stored_file``), else one written here first."""
    from pybk_spark.admin.operations.orchestrate import DEFAULT_PARALLEL
    if streams_list is None:
        streams_list = sorted({1, DEFAULT_PARALLEL})
    out: dict = {"chunk_bytes": CHUNK_BYTES, "bytes": total_bytes,
                 "source_file": "written before the pull's ledgers" if src else "just written"}
    with tempfile.TemporaryDirectory(dir=work_dir) as d:
        disk_src = src if src is not None else stored_file(d, total_bytes)
        for streams in streams_list:
            out[str(streams)] = _run(d, disk_src, total_bytes, streams, "disk")
        if cached:
            # a file just written (after the copies from the disk, which it
            # would slow): its pages are in the page cache, where the cached
            # copy reads them (a direct read neither uses nor drops them)
            fresh = disk_src if src is None else stored_file(d, total_bytes)
            out["cached"] = {str(DEFAULT_PARALLEL): _run(d, fresh, total_bytes, DEFAULT_PARALLEL,
                                                         "cached")}
    return out


def around(before: dict, after: dict, streams: int) -> dict:
    """Figure 8's floor from a copy right before its pull and one right
    after: at ``streams`` at once the mean of the two (each kept under
    ``before`` / ``after``), the rest from ``after``."""
    key = str(streams)
    b, a = before[key], after[key]
    mean = {"mb_per_s": (b["mb_per_s"] + a["mb_per_s"]) / 2,
            "seconds": (b["seconds"] + a["seconds"]) / 2, "source": a["source"],
            "read_mode": sorted(set(a["read_mode"]) | set(b["read_mode"])),
            "write_mode": sorted(set(a["write_mode"]) | set(b["write_mode"])),
            "cpu_s_per_gb": {k: (b["cpu_s_per_gb"][k] + v) / 2 for k, v in a["cpu_s_per_gb"].items()},
            "before": b, "after": a}
    return {**after, key: mean}


def _run(d: str, src: str, total: int, streams: int, source: str) -> dict:
    share = total // streams // CHUNK_BYTES * CHUNK_BYTES
    chunks = share // CHUNK_BYTES
    reps, sources = [], []
    try:
        for i in range(streams):
            rep = subprocess.Popen([sys.executable, "-c", _REPLACEMENT, os.path.join(d, f"copy{streams}-{i}"),
                                    str(chunks), str(CHUNK_BYTES)], stdout=subprocess.PIPE, text=True)
            reps.append(rep)
            port = int(_out(rep).readline())
            sources.append(subprocess.Popen(
                [sys.executable, "-c", _SOURCE, src, str(port), str(i * share), str(share),
                 str(CHUNK_BYTES), source], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True))
        t0 = time.perf_counter()
        for s in sources:
            go = s.stdin
            assert go is not None, "sources are started with stdin=PIPE"
            go.write("go\n")
            go.flush()
        rep_out = [_out(r).readline().split() for r in reps]
        elapsed = time.perf_counter() - t0
        src_out = [_out(s).readline().split() for s in sources]
    finally:
        for p in reps + sources:
            try:
                p.wait(30)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
    copied = share * streams
    rep_cpu = sum(float(cpu) for _mode, cpu in rep_out)
    src_cpu = sum(float(cpu) for _mode, cpu in src_out)
    gb = copied / 1e9
    return {"mb_per_s": copied / elapsed / 1e6, "seconds": elapsed, "source": source,
            "read_mode": sorted({mode for mode, _ in src_out}),
            "write_mode": sorted({mode for mode, _ in rep_out}),
            "cpu_s_per_gb": {"source": src_cpu / gb, "replacement": rep_cpu / gb,
                             "total": (src_cpu + rep_cpu) / gb}}


if __name__ == "__main__":
    print(json.dumps(measure(tempfile.gettempdir(), 512 << 20), indent=1))
