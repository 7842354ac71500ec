"""Bookie restart time with millions of entries.

Run: ``.venv/bin/python -m bench.bookie_restart [--entries 2000000]``.
Writes N x 100 B entries (batches of 1000, 4 ledgers) into an in-process
Bookie core, then measures ``open()``:
  * after a checkpoint (index + states loaded, nothing to replay), and
  * after a "crash" with everything still in the journal (full replay),
and the time for a real ``bookie-server`` process to answer Health on the
checkpointed data dir.
"""
from __future__ import annotations

import argparse
import os
import tempfile
import time

import numpy as np
import pyarrow as pa

from bookie_server.bookie import Bookie
from bookie_server.config import BookieConfig
from pybk_spark.testing.bookie_process import BookieProcess
from pybk_spark.wire.entries import ENTRY_SCHEMA, batch_to_bytes


def _fill(bookie: Bookie, n_entries: int, batch: int = 1000, ledgers: int = 4) -> None:
    payload = pa.array([b"p" * 100] * batch, pa.binary())
    digest = pa.array([b""] * batch, pa.binary())
    per_ledger = n_entries // ledgers
    for ledger in range(1, ledgers + 1):
        lid = pa.array(np.full(batch, ledger, np.int64))
        for start in range(0, per_ledger, batch):
            ids = np.arange(start, start + batch, dtype=np.int64)
            rb = pa.RecordBatch.from_arrays([lid, pa.array(ids), pa.array(ids - 1), payload,
                                             digest, pa.array((ids + 1) * 100)],
                                            schema=ENTRY_SCHEMA)
            bookie.add(ledger, b"k", batch_to_bytes(rb))


def run(n_entries: int = 2_000_000, data_dir: str | None = None) -> dict:
    out: dict = {"entries": n_entries}
    with tempfile.TemporaryDirectory(dir=data_dir) as d:
        cfg = BookieConfig(data_dir=os.path.join(d, "replay"), flush_interval_s=1e9,
                           write_cache_max_bytes=1 << 40, journal_max_file_bytes=1 << 30)
        b = Bookie(cfg).open(background=False)
        t0 = time.perf_counter()
        _fill(b, n_entries)
        out["fill_s"] = time.perf_counter() - t0
        b.close(checkpoint=False)                 # everything stays in the journal
        t0 = time.perf_counter()
        b = Bookie(cfg).open(background=False)
        out["open_full_replay_s"] = time.perf_counter() - t0
        out["replayed_records"] = b.replayed_records
        assert b.store.entry_count() == n_entries
        t0 = time.perf_counter()
        b.checkpoint()
        out["checkpoint_s"] = time.perf_counter() - t0
        b.close(checkpoint=False)
        t0 = time.perf_counter()
        b = Bookie(cfg).open(background=False)
        out["open_after_checkpoint_s"] = time.perf_counter() - t0
        assert b.store.entry_count() == n_entries
        b.close(checkpoint=False)
        with open(os.path.join(cfg.data_dir, "cookie.json"), "w") as fh:
            fh.write('{"bookie_id": "restart-bench", "instance_id": "x"}')
        bp = BookieProcess(cfg.data_dir, bookie_id="restart-bench")
        t0 = time.perf_counter()
        bp.start()
        out["process_ready_s"] = time.perf_counter() - t0
        bp.terminate()
    return out


def main(argv=None) -> dict:
    p = argparse.ArgumentParser()
    p.add_argument("--entries", type=int, default=2_000_000)
    p.add_argument("--data-dir")
    a = p.parse_args(argv)
    r = run(a.entries, a.data_dir)
    for k, v in r.items():
        print(f"{k:>26}: {v:.3f}" if isinstance(v, float) else f"{k:>26}: {v}")
    return r


if __name__ == "__main__":
    main()
