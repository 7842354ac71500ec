"""The floor of a Python sink that stores its rows twice: a bare replicated
write timed in figure 6 beside the no-op sink and ours.

The no-op sink (bench/noop_source.py) is what a Python sink costs before it
stores anything.  This one stores every row twice, durably, with nothing
but what that needs:

* ``df.write.format("pybk_bare").option("ports", "P1,P2").save()``: each
  write task connects to every receiver, turns each Arrow batch Spark hands
  it into one IPC message (``RecordBatch.serialize``, one copy), and sends
  the messages in chunks of at least ``chunk_bytes`` (16 MiB, ours' add
  request) to every receiver with one gathered ``sendmsg``, at most
  ``window`` (2, ours' 32 MiB in flight) chunks unanswered.  It ends when
  every chunk is answered.
* A receiver (``Receivers``: ``python -m bench.bare_sink``, one process per
  copy) takes each connection on a thread of its own, receives each chunk
  into a reused buffer on huge pages, computes its CRC32C, writes it with
  ``O_DIRECT`` into a preallocated file (``posix_fallocate``, as the
  journal's files are; a buffered write where the file system refuses
  ``O_DIRECT``), ``fdatasync``s and answers 8 bytes.

No entries, digests per entry, ledgers, metadata or commit: ours / this is
what our protocol costs beyond storing the rows twice on this machine, and
this / the no-op sink is how close any sink that stores them twice can
come to the no-op sink here.

``store_floor`` times less still: the write's bytes sent from one reused
buffer (no Spark, no serialization) to the same receivers, which write them
durably without a CRC.  Its CPU is the least that storing the rows twice
costs on this machine, whatever the sink; ``write_bound`` turns it into the
most any such sink can reach of the no-op sink when both share its cores.
"""
from __future__ import annotations

import os
import socket
import statistics
import struct
import subprocess
import sys
import threading
import time

import pyarrow as pa
from pyspark.sql.datasource import DataSource, DataSourceArrowWriter, WriterCommitMessage

NAME = "pybk_bare"
CHUNK_BYTES = 16 << 20
WINDOW = 2
MAX_CHUNK_BYTES = 64 << 20          # a chunk is at most chunk_bytes plus one batch
FILE_BYTES = 256 << 20              # each connection's preallocated file, written round
_ALIGN = 4096                       # O_DIRECT writes whole blocks
_ACK = 8
NO_CHECK = 1 << 63                  # in a chunk's header: store it without its CRC (store_floor)


def _recv_into(conn: socket.socket, view: memoryview) -> bool:
    """Fill ``view``; False where the peer closed first."""
    got = 0
    while got < len(view):
        k = conn.recv_into(view[got:])
        if not k:
            return False
        got += k
    return True


class BareCommit(WriterCommitMessage):
    def __init__(self, rows: int):
        self.rows = rows


class _Replicas:
    """One connection to each receiver: chunks sent to all, each answered by all."""

    def __init__(self, ports: list[int]):
        self.socks = [socket.create_connection(("127.0.0.1", p)) for p in ports]
        self.unanswered = 0
        self._ack = memoryview(bytearray(_ACK))

    def send(self, parts: list, size: int, flags: int = 0) -> None:
        """``parts`` (``size`` bytes in all) as one chunk to every receiver,
        with one gathered ``sendmsg`` each."""
        head = struct.pack("<Q", size | flags)
        for s in self.socks:
            sent = s.sendmsg([head, *parts])
            if sent < size + len(head):        # a gathered send cut short: the rest
                s.sendall(b"".join([head, *map(bytes, parts)])[sent:])
        self.unanswered += 1

    def receive_acks(self) -> None:
        """The oldest unanswered chunk's answer from every receiver."""
        for s in self.socks:
            if not _recv_into(s, self._ack):
                raise ConnectionError("a bare receiver closed its connection")
        self.unanswered -= 1

    def close(self) -> None:
        for s in self.socks:
            s.close()


class BareWriter(DataSourceArrowWriter):
    def __init__(self, options):
        self.ports = [int(p) for p in options["ports"].split(",")]
        self.chunk = int(options.get("chunk_bytes", CHUNK_BYTES))
        self.window = int(options.get("window", WINDOW))

    def write(self, iterator):
        replicas = _Replicas(self.ports)
        parts: list = []
        size = rows = 0
        try:
            for batch in iterator:
                rows += batch.num_rows
                msg = batch.serialize()
                parts.append(msg)
                size += msg.size
                if size >= self.chunk:
                    replicas.send(parts, size)
                    parts, size = [], 0
                    while replicas.unanswered > self.window:
                        replicas.receive_acks()
            if parts:
                replicas.send(parts, size)
            while replicas.unanswered:
                replicas.receive_acks()
        finally:
            replicas.close()
        return BareCommit(rows)


class BareSink(DataSource):
    @classmethod
    def name(cls) -> str:
        return NAME

    def writer(self, schema, overwrite):
        return BareWriter(self.options)


def register(spark) -> None:
    """Register the sink; its module is pickled by value, so the Python
    workers need not import ``bench``."""
    from pyspark import cloudpickle
    cloudpickle.register_pickle_by_value(sys.modules[__name__])
    spark.dataSource.register(BareSink)


class Receivers:
    """``copies`` receiver processes, each writing into ``work_dir``;
    ``ports`` once entered.  Stopped (and their files gone) on exit."""

    def __init__(self, work_dir: str, copies: int = 2):
        self.work_dir, self.copies = work_dir, copies
        self.procs: list[subprocess.Popen] = []
        self.ports: list[int] = []

    def __enter__(self) -> Receivers:
        try:
            for _ in range(self.copies):
                p = subprocess.Popen([sys.executable, "-m", "bench.bare_sink", self.work_dir],
                                     stdout=subprocess.PIPE, text=True)
                self.procs.append(p)
                assert p.stdout is not None, "started with stdout=PIPE"
                self.ports.append(int(p.stdout.readline()))
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return self

    def __exit__(self, *exc) -> None:
        for p in self.procs:
            p.kill()
            p.wait()


def store_floor(receivers: Receivers, nbytes: int, warmups: int, reps: int,
                busy_s) -> dict:
    """Send ``nbytes`` to every receiver in chunks of ``CHUNK_BYTES`` from one
    reused buffer, ``WINDOW`` chunks unanswered, the receivers writing them
    durably without a CRC: ``warmups`` untimed rounds, then ``reps`` timed
    -> the median wall seconds and machine CPU-seconds (``busy_s``: the
    machine's busy CPU-seconds so far) of a round."""
    data = memoryview(bytearray(CHUNK_BYTES))
    replicas = _Replicas(receivers.ports)
    walls, cpus = [], []
    try:
        for rep in range(warmups + reps):
            c0, t0 = busy_s(), time.perf_counter()
            left = nbytes
            while left > 0 or replicas.unanswered:
                if left > 0 and replicas.unanswered < WINDOW:
                    n = min(CHUNK_BYTES, left)
                    replicas.send([data[:n]], n, NO_CHECK)
                    left -= n
                else:
                    replicas.receive_acks()
            if rep >= warmups:
                walls.append(time.perf_counter() - t0)
                cpus.append(busy_s() - c0)
    finally:
        replicas.close()
    return {"bytes_each": nbytes, "copies": len(replicas.socks), "median_s": statistics.median(walls),
            "cpu_s": statistics.median(cpus)}


def write_bound(noop_s: float, noop_cpu_s: float, store_cpu_s: float, cores: int) -> float:
    """The most a sink that stores the rows twice can reach of the no-op
    sink's speed: it spends the no-op sink's CPU and at least
    ``store_cpu_s`` more on the same ``cores``, so a write takes at least
    their sum spread over every core (and no less than the no-op write)."""
    return noop_s / max(noop_s, (noop_cpu_s + store_cpu_s) / cores)


def _serve(conn: socket.socket, work_dir: str, buffers: list, lock: threading.Lock) -> None:
    import google_crc32c

    from bookie_server.direct_buffers import huge_mapping
    with lock:
        raw, view = buffers.pop() if buffers else huge_mapping(MAX_CHUNK_BYTES)
    whole = pa.py_buffer(view)                # what google_crc32c takes without a copy
    path = os.path.join(work_dir, f"bare-{os.getpid()}-{threading.get_ident()}")
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        os.posix_fallocate(fd, 0, FILE_BYTES)
        os.fsync(fd)
        os.close(fd)
        try:
            fd = os.open(path, os.O_WRONLY | os.O_DIRECT)
        except OSError:                       # a file system without O_DIRECT
            fd = os.open(path, os.O_WRONLY)
        os.unlink(path)                       # gone with the descriptor, however this ends
        head = memoryview(bytearray(8))
        pos = 0
        while _recv_into(conn, head):
            n = struct.unpack("<Q", head)[0]
            check = not n & NO_CHECK
            n &= ~NO_CHECK
            if n > MAX_CHUNK_BYTES or not _recv_into(conn, view[:n]):
                break
            if check:                         # the check a receiver makes; not needed after
                google_crc32c.value(whole.slice(0, n))
            whole_blocks = -(-n // _ALIGN) * _ALIGN
            if pos + whole_blocks > FILE_BYTES:
                pos = 0
            os.pwrite(fd, view[:whole_blocks], pos)
            pos += whole_blocks
            os.fdatasync(fd)
            conn.sendall(b"\0" * _ACK)
    finally:
        os.close(fd)
        conn.close()
        with lock:
            buffers.append((raw, view))


def _main(work_dir: str) -> None:
    srv = socket.create_server(("127.0.0.1", 0))
    print(srv.getsockname()[1], flush=True)
    buffers: list = []
    lock = threading.Lock()
    while True:
        conn, _ = srv.accept()
        threading.Thread(target=_serve, args=(conn, work_dir, buffers, lock), daemon=True).start()


if __name__ == "__main__":
    _main(sys.argv[1])
