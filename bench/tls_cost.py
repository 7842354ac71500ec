"""Figure 10: what TLS costs, as ratios measured in the same run.

Two LocalClusters of 3 bookies on this machine, one plaintext and one with
mutual TLS on every bookie port (throwaway certificates, pybk_spark/testing/
certs.py; the client presents a certificate, the bookies verify it and check
its identity).  On each, the same two measurements as figures 3 and 5, at a
smaller size: a batched append (``add_entries``, 1 KiB entries, E=3 Qw=3
Qa=2) and the catch-up read of that ledger (``read_batches`` over [0, last],
digests verified).  The clusters take turns (plain, TLS, plain, TLS ...) so
a drift of the machine's load hits both; each figure is the median over the
rounds.  Ratios: TLS entries/s over plaintext entries/s (1.0 = free; 0.8 =
TLS costs 20%):

    tls_append_vs_plain, tls_catchup_vs_plain
"""
from __future__ import annotations

import os
import statistics
import time

from bench.client_append import ENTRY_BYTES, payloads
from bench.stats import rate

RATIO_KEYS = ("tls_append_vs_plain", "tls_catchup_vs_plain")


def _round(uri: str, conf, data: list) -> dict:
    from pybk_spark.ledger.client import BookKeeper
    with BookKeeper(uri, conf=conf) as bk:
        lh = bk.create_ledger(3, 3, 2)
        lh.add_entries(data[:2000])                 # warm: connections, handshakes
        t0 = time.perf_counter()
        ids = lh.add_entries(data)
        append_s = time.perf_counter() - t0
        lh.close()
        if len(ids) != len(data):
            raise RuntimeError(f"add_entries acknowledged {len(ids)} of {len(data)}")
        rh = bk.open_ledger(lh.ledger_id, recovery=False)
        rows = 0
        t0 = time.perf_counter()
        for batch in rh.read_batches(0, rh.last_add_confirmed):
            rows += batch.num_rows
        read_s = time.perf_counter() - t0
        if rows != len(data) + 2000:
            raise RuntimeError(f"catch-up read {rows} entries, expected {len(data) + 2000}")
    return {"append_entries_per_s": rate(len(data), append_s),
            "catchup_entries_per_s": rate(rows, read_s)}


def measure(quick: bool, work: str) -> dict:
    from pybk_spark.cluster.certs import WRITER, make_cert_files
    from pybk_spark.cluster.local import LocalCluster
    n = 20_000 if quick else 200_000
    rounds = 1 if quick else 3
    certs = make_cert_files(os.path.join(work, "tls-certs"))
    data = payloads(n)
    runs: dict = {"plain": [], "tls": []}
    with LocalCluster(os.path.join(work, "tls-plain"), num_bookies=3) as plain, \
            LocalCluster(os.path.join(work, "tls-on"), num_bookies=3,
                         bookie_conf=certs.bookie_conf()) as tls:
        targets = {"plain": (plain.metadata_uri, None),
                   "tls": (tls.metadata_uri, certs.client_conf(WRITER))}
        for _ in range(rounds):
            for name in ("plain", "tls"):
                uri, conf = targets[name]
                runs[name].append(_round(uri, conf, data))
    out: dict = {"entries": n, "entry_bytes": ENTRY_BYTES, "rounds": rounds}
    for name, rows in runs.items():
        for key in ("append_entries_per_s", "catchup_entries_per_s"):
            out[f"{name}_{key}"] = statistics.median(r[key] for r in rows)
    out["runs"] = runs
    return out


def add_ratios(ratios: dict, missing: dict, figures: dict, errors: dict) -> None:
    """Put the two TLS ratios (or why they are missing) into the run's JSON."""
    f = figures.get("10_tls") or {}
    for key, what in (("tls_append_vs_plain", "append_entries_per_s"),
                      ("tls_catchup_vs_plain", "catchup_entries_per_s")):
        tls, plain = f.get(f"tls_{what}"), f.get(f"plain_{what}")
        ratios[key] = tls / plain if tls and plain else None
        if ratios[key] is None:
            missing[key] = (f"10_tls: {errors['10_tls']}" if "10_tls" in errors
                            else "component missing")
