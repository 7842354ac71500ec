"""The floor of a bookie-to-bookie copy on this machine (figure 8's peer).

Re-replication's target is half the disk's sequential bandwidth.  Before
asking how far our pull is from it, this measures how far the bare copy is:
the same bytes moved from one process to another and made durable with
nothing but the system calls, the way the sync-add floor
(bench/sync_floor.py) does for a sync add.

* A *source* process per stream (``python -c``) sends its share of a file
  that is in the page cache with ``os.sendfile`` (no user-space copy: the
  least a surviving bookie can do to serve its stored batches).
* A *replacement* process per stream receives each ``CHUNK_BYTES`` chunk
  into one reused page-aligned buffer, computes its CRC32C (the digest check
  a pull must make), writes it with ``O_DIRECT`` when the file system allows
  (no page-cache copy; else a buffered write), ``fdatasync``s, and answers
  8 bytes.
* one pair, then ``orchestrate.DEFAULT_PARALLEL`` pairs at once, each over
  its own slice of the file (figure 8 copies that many fragments at once).

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

_REPLACEMENT = r"""
import mmap, os, socket, sys
import google_crc32c, pyarrow
path, chunks, size = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC
mode = "direct"
try:
    fd = os.open(path, flags | os.O_DIRECT, 0o644)
except (OSError, AttributeError):
    fd, mode = os.open(path, flags, 0o644), "buffered"
buf = mmap.mmap(-1, size)                # page-aligned, reused for every chunk
view = memoryview(buf)
whole = pyarrow.py_buffer(buf)           # what google_crc32c takes without a copy
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

_SOURCE = r"""
import os, socket, sys
path, port, offset, length, size = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
fd = os.open(path, os.O_RDONLY)
s = socket.create_connection(("127.0.0.1", port))
sys.stdin.readline()                     # go
t0 = os.times()
end, pos = offset + length, offset
while pos < end:
    pos += os.sendfile(s.fileno(), fd, pos, end - pos)
acks = 0
while acks < length // size * 8:
    got = s.recv(65536)
    if not got:
        sys.exit("replacement ended early")
    acks += len(got)
t = os.times()
print(t.user + t.system - t0.user - t0.system, flush=True)
"""


def _out(proc: subprocess.Popen) -> IO[str]:
    """A helper process's stdout (each is started with stdout=PIPE, in text mode)."""
    assert proc.stdout is not None, "helpers are started with stdout=PIPE"
    return proc.stdout

def measure(work_dir: str, total_bytes: int, streams_list=None) -> dict:
    """MB/s and CPU-s per GB of the bare copy, one stream and as many as
    figure 8 copies at once (``orchestrate.DEFAULT_PARALLEL``)."""
    if streams_list is None:
        from pybk_spark.admin.operations.orchestrate import DEFAULT_PARALLEL
        streams_list = sorted({1, DEFAULT_PARALLEL})
    out: dict = {"chunk_bytes": CHUNK_BYTES, "bytes": total_bytes}
    with tempfile.TemporaryDirectory(dir=work_dir) as d:
        src = os.path.join(d, "stored")
        block = os.urandom(CHUNK_BYTES)
        with open(src, "wb") as fh:        # written, so in the page cache, as a
            for _ in range(total_bytes // CHUNK_BYTES):   # source's recent batches are
                fh.write(block)
        for streams in streams_list:
            out[str(streams)] = _run(d, src, total_bytes, streams)
    return out


def _run(d: str, src: str, total: int, streams: int) -> dict:
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
                 str(CHUNK_BYTES)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True))
        t0 = time.perf_counter()
        for s in sources:
            go = s.stdin
            assert go is not None, "sources are started with stdin=PIPE"
            go.write("go\n")
            go.flush()
        rep_out = [_out(r).readline().split() for r in reps]
        elapsed = time.perf_counter() - t0
        src_cpu = sum(float(_out(s).readline()) for s in sources)
    finally:
        for p in reps + sources:
            try:
                p.wait(30)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
    copied = share * streams
    rep_cpu = sum(float(cpu) for _mode, cpu in rep_out)
    gb = copied / 1e9
    return {"mb_per_s": copied / elapsed / 1e6, "seconds": elapsed,
            "write_mode": sorted({mode for mode, _ in rep_out}),
            "cpu_s_per_gb": {"source": src_cpu / gb, "replacement": rep_cpu / gb,
                             "total": (src_cpu + rep_cpu) / gb}}


if __name__ == "__main__":
    print(json.dumps(measure(tempfile.gettempdir(), 512 << 20), indent=1))
