"""Turn one benchmark run (the dict ``bench.run`` builds) into a Markdown
table, a PNG plot and the generated section of docs/performance.md.

docs/performance.md keeps hand-written analysis outside the markers
``<!-- bench:begin -->`` / ``<!-- bench:end -->``; only the text between them
is regenerated.
"""
from __future__ import annotations

import os

BEGIN, END = "<!-- bench:begin -->", "<!-- bench:end -->"

TARGETS = {
    "append_vs_redis_pipelined_1c": (">=", 2.0, "(3) batched append E=3 Qw=3 Qa=2 / Redis 1-client pipelined"),
    "append_vs_redis_50c": (">=", 1.0, "(3) batched append / Redis 50 clients (aim beyond the bar)"),
    "sync_add_p99_ms": ("<=", 1.0, "(4) single-entry sync add p99, ms"),
    "sync_add_p50_vs_python_floor": ("<=", 2.0, "(4) sync add p50 / the floor's p50 (bench/sync_floor.py)"),
    "sync_add_p999_vs_python_floor": ("<=", 3.0, "(4) sync add p999 / the floor's p999: a checkpoint "
                                      "that stalls adds shows here"),
    "bookie_ingest_vs_disk": (">=", 0.5, "(2) bookie ingest 1000x1 KiB, sustained / disk sequential, overwriting allocated blocks"),
    "catchup_read_vs_redis_xrange": (">=", 1.0, "(5) catch-up read / Redis XRANGE"),
    "spark_write_vs_parquet": (">=", 0.5, "(6) Spark write / Parquet write"),
    "spark_read_vs_parquet": (">=", 0.5, "(6) Spark full scan / Parquet full scan"),
    "tls_append_vs_plain": (">=", 0.5, "(10) batched append, mutual TLS / plaintext"),
    "tls_catchup_vs_plain": (">=", 0.5, "(10) catch-up read, mutual TLS / plaintext"),
    "entry_cpu_7_vs_3_bookies": ("<=", 1.2, "(9) CPU-s per M batched entries, every process, "
                                 "7 bookie hosts / 3 (1.0 = flat)"),
    "sync_add_cpu_ms": ("<=", 0.8, "(4) CPU per sync add, ms, summed over client, bookies and etcd"),
    "sync_add_cpu_vs_python_floor": ("<=", 3.0, "(4) CPU per sync add / the same add's floor in plain "
                                     "Python (bench/sync_floor.py; the aim beyond the bar is 2x)"),
    "append_async_vs_redis_pipelined_1c": (">=", 1.0, "(3) add_entry_async E=3 Qw=3 Qa=2, one call "
                                           "per entry / Redis 1-client pipelined XADD"),
    "spark_read_vs_python_floor": (">=", 0.95, "(6) Spark full scan / no-op Python source scan"),
    "spark_write_vs_python_floor": (">=", 0.9, "(6) Spark write / no-op Python sink write (the floor "
                                    "of a Python data source's write)"),
    "spark_write_vs_bare_sink": (">=", 0.8, "(6) Spark write / the bare replicated Python sink "
                                 "(bench/bare_sink.py: every row to two receivers that write it "
                                 "durably, no protocol; the bar of figure 8's bare copy, the aim "
                                 "beyond it 0.9)"),
    "spark_count_vs_python_floor": (">=", 0.95, "(6) Spark count / no-op Python source count"),
    "rereplication_vs_disk": (">=", 0.5, "(8) re-replication copy MB/s / disk sequential, overwriting allocated blocks"),
    "rereplication_vs_copy_floor": (">=", 0.8, "(8) re-replication copy MB/s / the bare copy between two "
                                    "processes, as many at once, read from the disk (bench/copy_floor.py)"),
    "offload_vs_disk": (">=", 0.1, "(11) offload to Parquet (read, write, read back, check every "
                        "entry, commit) MB/s / disk sequential, overwriting allocated blocks"),
    "spark_offloaded_scan_vs_parquet": (">=", 0.5, "(11) Spark full scan of offloaded history "
                                        "(bookkeeper source) / spark.read.parquet of the same files"),
    "spark_read_log_vs_parquet": (">=", 0.9, "(11) the same scan through spark.history.read_log (the "
                                  "history by Spark's Parquet reader) / spark.read.parquet"),
}


def verdict(key: str, value) -> str:
    if value is None:
        return "n/a"
    op, target, _ = TARGETS[key]
    ok = value >= target if op == ">=" else value <= target
    return "met" if ok else "MISSED"


def _f(x, digits=0, unit="") -> str:
    if x is None:
        return "null"
    if isinstance(x, float):
        return f"{x:,.{digits}f}{unit}"
    return f"{x}{unit}"


def _get(d, *path):
    for p in path:
        if not isinstance(d, dict) or p not in d or d[p] is None:
            return None
        d = d[p]
    return d


def markdown(r: dict) -> str:
    f, m = r["figures"], r["machine"]
    lines = [f"Run: `{r['command']}` ({r['mode']}), {r['started_at']}, {r['duration_s']:.0f} s; "
             f"load average at start {m.get('loadavg_at_start')}, at end {r.get('loadavg_at_end')}.",
             "", "### Ratios (ours / peer, higher is better; p99 in ms)", "",
             "| Ratio | Value | Target | Verdict |", "|---|---|---|---|"]
    for key, (op, target, what) in TARGETS.items():
        v = r["ratios"].get(key)
        why = r.get("missing", {}).get(key)
        shown = _f(v, 2) if v is not None else f"null ({why})" if why else "null"
        if key == "spark_write_vs_python_floor" and _get(f, "6_spark", "write_bound_vs_floor"):
            shown += f" (at most {_f(f['6_spark']['write_bound_vs_floor'], 2)} on this machine, (6))"
        lines.append(f"| `{key}`: {what} | {shown} | {op} {target} | {verdict(key, v)} |")
    lines += ["", "### Figures", "", "| # | What | Ours | Peer |", "|---|---|---|---|"]
    d = f.get("1_disk") or {}
    lines.append(f"| 1 | disk 4 KiB write+fdatasync | {_f(_get(d, 'fsync_4k', 'ops_per_s'))}/s, "
                 f"p50 {_f(_get(d, 'fsync_4k', 'p50_ms'), 2)} ms, p99 {_f(_get(d, 'fsync_4k', 'p99_ms'), 2)} ms | - |")
    lines.append(f"| 1 | disk sequential, fdatasync every 64 MiB | 1 writer {_f(_get(d, 'seq_write', 'mb_per_s'))} MB/s; "
                 f"3 writers {_f(_get(d, 'seq_3_writers', 'total_mb_per_s_sum'))} MB/s total | - |")
    # journal-shaped; on a VM handing freed memory back to the host it can beat the line
    # above by landing in just-freed pages (docs/performance.md, (2))
    lines.append(f"| 1 | disk sequential, fdatasync every 1 MiB (run right after) | "
                 f"1 writer {_f(_get(d, 'sync_1m_write', 'mb_per_s'))} MB/s | - |")
    lines.append(f"| 1 | disk sequential, sustained (4x as long, second half timed) | "
                 f"{_f(_get(d, 'seq_sustained', 'mb_per_s'))} MB/s (whole probe "
                 f"{_f(_get(d, 'seq_sustained', 'whole_mb_per_s'))} MB/s) | burst (64 MiB row) / "
                 f"sustained = {_f(d.get('burst_vs_sustained'), 2)}x |")
    lines.append(f"| 1 | disk sequential, overwriting an allocated file (the ratios' disk figure) | "
                 f"{_f(_get(d, 'seq_overwrite', 'mb_per_s'))} MB/s | overwrite / fresh sustained = "
                 f"{_f(d.get('overwrite_vs_sustained'), 2)}x |")
    sd = d.get("seq_direct") or {}
    lines.append("| 1 | disk sequential, O_DIRECT into a preallocated file (the journal's big groups) | "
                 + (f"{_f(sd.get('mb_per_s'))} MB/s" if sd.get("mb_per_s") else f"null ({sd.get('reason')})")
                 + f" | direct / overwrite = {_f(d.get('direct_vs_overwrite'), 2)}x |")
    mt = d.get("memory_touch") or {}
    lines.append(f"| 1 | memory, first touch of fresh pages (what new page-cache and buffer pages cost) | "
                 f"{_f(mt.get('fresh_gb_per_s'), 2)} GB/s | the same pages written again "
                 f"{_f(mt.get('rewrite_gb_per_s'), 2)} GB/s ({_f(mt.get('rewrite_vs_fresh'), 1)}x) |")
    bi = f.get("2_bookie_ingest") or {}
    for n in ("1", "100", "1000", "1000_sustained"):
        x = bi.get(f"add_batch_{n}") or {}
        what = (f"batches of {n} x 1 KiB" if n.isdigit() else "batches of 1000 x 1 KiB, sustained "
                f"(after {_f(x.get('journaled_before_mb'))} MB, page-cache window full)")
        lines.append(f"| 2 | one bookie, {what} | {_f(x.get('entries_per_s'))} entries/s, "
                     f"{_f(x.get('mb_per_s'), 1)} MB/s | disk seq {_f(_get(d, 'seq_write', 'mb_per_s'))} MB/s |")
    a, red = f.get("3_append") or {}, f.get("peers_redis") or {}
    for key, label in (("batched_E3Qw3Qa2", "add_entries E=3 Qw=3 Qa=2"),
                       ("batched_E3Qw2Qa2", "add_entries E=3 Qw=2 Qa=2"),
                       ("async_E3Qw3Qa2", "add_entry_async E=3 Qw=3 Qa=2"),
                       ("async_E3Qw2Qa2", "add_entry_async E=3 Qw=2 Qa=2")):
        lines.append(f"| 3 | {label}, 1 KiB | {_f(_get(a, key, 'entries_per_s'))} entries/s | "
                     f"Redis P1000 1c {_f(red.get('redis_pipelined_1c_entries_per_s'))}/s, "
                     f"50c x P100 {_f(red.get('redis_50c_entries_per_s'))}/s |")
    s = f.get("4_sync_latency") or {}
    rs = red.get("redis_sync_xadd") or {}
    lines.append(f"| 4 | sync add_entry, 1 KiB, p50/p99/p999 ms | {_f(s.get('p50_ms'), 2)} / {_f(s.get('p99_ms'), 2)} / "
                 f"{_f(s.get('p999_ms'), 2)} ({_f(s.get('entries_per_s'))}/s) | Redis sync XADD {_f(rs.get('p50_ms'), 2)} / "
                 f"{_f(rs.get('p99_ms'), 2)} / {_f(rs.get('p999_ms'), 2)} ({_f(rs.get('entries_per_s'))}/s); "
                 f"fdatasync p50 {_f(_get(d, 'fsync_4k', 'p50_ms'), 2)}, p99 {_f(_get(d, 'fsync_4k', 'p99_ms'), 2)} |")
    fl = f.get("4_sync_floor") or {}
    if fl:
        fc = fl.get("cpu_us_per_add") or {}
        lines.append(f"| 4 | the floor: the same sync add in plain Python (bench/sync_floor.py), p50/p99/p999 ms, "
                     f"CPU per add | {_f(fl.get('p50_ms'), 2)} / {_f(fl.get('p99_ms'), 2)} / {_f(fl.get('p999_ms'), 2)} "
                     f"({_f(fl.get('entries_per_s'))}/s); "
                     f"client {_f(fc.get('client'))} us + bookies (3) {_f(fc.get('bookies'))} us = "
                     f"{_f(fc.get('total'))} us; other processes ran {_f(fl.get('others_cores'), 2)} "
                     f"cores meanwhile | ours: "
                     f"{_f(_get(s, 'cpu', 'cpu_s_per_m_entries', 'total'))} us, other processes "
                     f"{_f(_get(s, 'cpu', 'others_cores'), 2)} cores |")
    proj = s.get("projected_host_per_bookie") or {}
    if proj:
        lines.append(f"| 4 | sync add_entry projected to one host per process | {_f(proj.get('ms'), 2)} ms "
                     f"= client CPU {_f(proj.get('client_cpu_ms'), 2)} + one bookie's CPU "
                     f"{_f(proj.get('one_bookie_cpu_ms'), 2)} + fdatasync p50 {_f(proj.get('fsync_p50_ms'), 2)} "
                     f"+ RTT {_f(proj.get('rtt_ms'), 2)} (assumed) | measured p50 {_f(s.get('p50_ms'), 2)} ms "
                     f"on this machine |")
    c = f.get("5_catchup") or {}
    lines.append(f"| 5 | catch-up read {_f(c.get('entries'))} x 1 KiB, non-fencing | {_f(c.get('entries_per_s'))} entries/s "
                 f"({_f(c.get('mb_per_s'))} MB/s) | Redis XRANGE {_f(red.get('redis_xrange_entries_per_s'))}/s |")
    lines += cpu_rows(f)
    sp = f.get("6_spark") or {}
    rows = sp.get("rows")
    lines.append(f"| 6 | Spark write {_f(rows)} rows x {sp.get('payload_bytes')} B | "
                 f"{_f(_get(sp, 'bookkeeper_write', 'median_s'), 2, ' s') if sp.get('bookkeeper_write') else 'null (' + str(sp.get('bookkeeper_write_error')) + ')'} | "
                 f"Parquet {_f(_get(sp, 'parquet_write', 'median_s'), 2, ' s')}; no-op Python sink "
                 f"{_f(_get(sp, 'noop_write', 'median_s'), 2, ' s')}; bare replicated sink "
                 f"{_f(_get(sp, 'bare_write', 'median_s'), 2, ' s')} (no-op / bare = "
                 f"{_f(sp.get('bare_write_vs_floor'), 2)}x: what storing the rows twice leaves "
                 f"any sink here) |")
    if _get(sp, "bookkeeper_write", "cpu_s"):
        lines.append(f"| 6 | Spark write, CPU-s of a round: machine / stores (bookies+etcd; "
                     f"the bare sink's receivers) | "
                     f"{_f(_get(sp, 'bookkeeper_write', 'cpu_s', 'machine'), 2)} / "
                     f"{_f(_get(sp, 'bookkeeper_write', 'cpu_s', 'cluster'), 2)} | no-op Python sink "
                     f"{_f(_get(sp, 'noop_write', 'cpu_s', 'machine'), 2)} / "
                     f"{_f(_get(sp, 'noop_write', 'cpu_s', 'cluster'), 2)}; bare replicated sink "
                     f"{_f(_get(sp, 'bare_write', 'cpu_s', 'machine'), 2)} / "
                     f"{_f(_get(sp, 'bare_write', 'cpu_s', 'cluster'), 2)} |")
    if sp.get("store_floor"):
        lines.append(f"| 6 | storing the write's bytes twice, the least CPU here (bench/bare_sink.py "
                     f"store_floor: {_f(_get(sp, 'store_floor', 'bytes_each'))} B from one buffer to "
                     f"each receiver, written durably, no Spark, serialization or CRC) | "
                     f"{_f(_get(sp, 'store_floor', 'cpu_s'), 2)} CPU-s in "
                     f"{_f(_get(sp, 'store_floor', 'median_s'), 2, ' s')} | with the no-op sink's "
                     f"{_f(_get(sp, 'noop_write', 'cpu_s', 'machine'), 2)} CPU-s on {sp.get('cores')} "
                     f"cores, no sink that stores the rows twice passes "
                     f"{_f(sp.get('write_bound_vs_floor'), 2)}x of the no-op sink here |")
    lines.append(f"| 6 | Spark count | {_f(_get(sp, 'bookkeeper_count', 'median_s'), 2, ' s')} | "
                 f"Parquet {_f(_get(sp, 'parquet_count', 'median_s'), 2, ' s')}; no-op Python source "
                 f"{_f(_get(sp, 'noop_count', 'median_s'), 2, ' s')} |")
    lines.append(f"| 6 | Spark full scan (every column) | {_f(_get(sp, 'bookkeeper_scan', 'median_s'), 2, ' s')} | "
                 f"Parquet {_f(_get(sp, 'parquet_scan', 'median_s'), 2, ' s')}; no-op Python source "
                 f"{_f(_get(sp, 'noop_scan', 'median_s'), 2, ' s')} |")
    rc = f.get("7_recovery") or {}
    for t in ("0", "1000"):
        lines.append(f"| 7 | fence+recover+close, {t}-entry unconfirmed tail | "
                     f"{_f(_get(rc, 'tail_' + t, 'median_ms'), 1, ' ms')} (median) | - |")
    rr = f.get("8_rereplication") or {}
    lines.append("| 8 | re-replication of a lost bookie | "
                 + (f"{_f(rr.get('copy_mb_per_s'), 1)} MB/s copying, {_f(rr.get('total_mb_per_s'), 1)} MB/s with audit "
                    f"({_f(rr.get('bytes'))} B, {rr.get('fragments')} fragments, "
                    f"{rr.get('path', 'client')} path, {rr.get('parallel', 1)} at once)"
                    if rr.get("available") else f"null ({rr.get('reason')})")
                 + f" | pull one at a time {_f(rr.get('pull_sequential_mb_per_s'), 1)} MB/s; "
                 f"client path {_f(rr.get('client_copy_mb_per_s'), 1)} MB/s; {_copy_floor(f, rr)}; disk sequential, "
                 f"overwriting {_f(_get(f, '2_bookie_ingest', 'disk_overwrite_mb_per_s_mean'))} MB/s "
                 f"(fresh file, sustained {_f(_get(f, '2_bookie_ingest', 'disk_sustained_mb_per_s_mean'))}"
                 " MB/s) |")
    lines += scaling_rows(f.get("9_scaling"))
    ob = f.get("11_offload") or {}
    lines.append(f"| 11 | offload of {_f(ob.get('entries'))} x 1 KiB entries, {_f(ob.get('segments'))} "
                 f"segments, to Parquet on the bench disk | {_f(ob.get('mb_per_s'), 1)} MB/s "
                 f"({_f(ob.get('entries_per_s'))} entries/s) | disk sequential, overwriting "
                 f"{_f(_get(f, '2_bookie_ingest', 'disk_overwrite_mb_per_s_mean'))} MB/s |")
    lines.append(f"| 11 | Spark full scan of the offloaded history | "
                 f"{_f(_get(ob, 'offloaded_scan', 'median_s'), 2, ' s')} | spark.read.parquet of the "
                 f"same files {_f(_get(ob, 'parquet_scan', 'median_s'), 2, ' s')} |")
    lines.append(f"| 11 | the same scan through `read_log` (history by Spark's Parquet reader) | "
                 f"{_f(_get(ob, 'read_log_scan', 'median_s'), 2, ' s')} | spark.read.parquet "
                 f"{_f(_get(ob, 'parquet_scan', 'median_s'), 2, ' s')} |")
    half = ob.get("half_offloaded") or {}
    lines.append(f"| 11 | the log half offloaded ({_f(ob.get('half_offloaded_entries'))} rows in "
                 f"Parquet, the rest on bookies), full scan by `read_log` / by the bookkeeper "
                 f"source | {_f(_get(half, 'read_log', 'median_s'), 2, ' s')} / "
                 f"{_f(_get(half, 'bookkeeper_source', 'median_s'), 2, ' s')} | spark.read.parquet "
                 f"of all the rows {_f(_get(ob, 'parquet_scan', 'median_s'), 2, ' s')} |")
    errs = r.get("errors") or {}
    if errs:
        lines += ["", "Errors during the run:", ""] + [f"- {k}: {v}" for k, v in errs.items()]
    return "\n".join(lines) + "\n"


def _copy_floor(f: dict, rr: dict) -> str:
    """Figure 8's floor (bench/copy_floor.py) at the pull's concurrency, from
    the disk (the ratio's) and from the page cache, and what the first
    reaches of the disk figure ``rereplication_vs_disk`` divides by."""
    fl = f.get("8_copy_floor") or {}
    par = str(rr.get("parallel", 1))
    one = fl.get(par) or {}
    cached = (fl.get("cached") or {}).get(par) or {}
    disk = _get(f, "2_bookie_ingest", "disk_overwrite_mb_per_s_mean")
    if not one:
        return "bare copy floor null"
    share = one["mb_per_s"] / disk if disk else None
    sides = (f" (the mean of {_f(_get(one, 'before', 'mb_per_s'))} before the pull and "
             f"{_f(_get(one, 'after', 'mb_per_s'))} after it)" if "before" in one else "")
    return (f"bare copy between two processes, read from the disk, {_f(one.get('mb_per_s'))} MB/s{sides} at "
            f"{_f(_get(one, 'cpu_s_per_gb', 'total'), 2)} CPU-s/GB (= {_f(share, 2)} of the disk; ours: "
            f"{_f(_get(rr, 'cpu_s_per_gb_by_path', 'pull', 'bookies'), 2)} CPU-s/GB in the bookies), "
            f"from the page cache {_f(cached.get('mb_per_s'))} MB/s")


def cpu_rows(f: dict) -> list[str]:
    """CPU-s per million entries by process kind for figures 3 (batched E=3
    Qw=3 Qa=2), 4 (sync adds) and 5 (catch-up read), from rusage / /proc."""
    rows = []
    for label, fig in (("batched add_entries E=3 Qw=3 Qa=2", _get(f, "3_append", "batched_E3Qw3Qa2")),
                       ("sync add_entry", f.get("4_sync_latency")),
                       ("catch-up read", f.get("5_catchup"))):
        c = _get(fig or {}, "cpu", "cpu_s_per_m_entries")
        if not c:
            continue
        rows.append(f"| 3-5 | CPU-s per M entries, {label} | client {_f(c.get('client'), 1)}, "
                    f"bookies (3) {_f(c.get('bookies'), 1)}, etcd {_f(c.get('etcd'), 1)}, "
                    f"total {_f(c.get('total'), 1)} | - |")
    return rows


def _cpu_cell(ph: dict) -> str:
    c = ph.get("cpu_s_per_m_entries") or {}
    return (f"CPU-s per M entries: writers {_f(c.get('writers'), 1)}, bookies {_f(c.get('bookies'), 1)}, "
            f"etcd {_f(c.get('etcd'), 2)}, total {_f(c.get('total'), 1)}")


def scaling_rows(sc) -> list[str]:
    """Figure 9: one row per bookie count and phase, beside the 3-bookie row."""
    if not sc:
        return []
    if not sc.get("available"):
        return [f"| 9 | scaling over bookie hosts | skipped: {sc.get('reason')} | - |"]
    rounds = sc.get("rounds") or {}
    base_n = str(min(int(n) for n in rounds)) if rounds else None
    rows = []
    for phase, what in (("append", "batched append (add_entries) + close"),
                        ("read", "read back (read_batches, non-fencing)")):
        base = _get(rounds, base_n, phase) or {}
        for n in sorted(rounds, key=int):
            ph = rounds[n].get(phase) or {}
            ours = f"{_f(ph.get('entries_per_s'))} entries/s; {_cpu_cell(ph)}"
            if n == base_n:
                peer = "(the peer of the rows below)"
            else:
                eps = _ratio_txt(ph.get("entries_per_s"), base.get("entries_per_s"))
                cpu = _ratio_txt(_get(ph, "cpu_s_per_m_entries", "total"),
                                 _get(base, "cpu_s_per_m_entries", "total"))
                peer = (f"{base_n} bookies: {_f(base.get('entries_per_s'))} entries/s ({eps}), "
                        f"total {_f(_get(base, 'cpu_s_per_m_entries', 'total'), 1)} CPU-s/M ({cpu})")
            rows.append(f"| 9 | {what}, {n} bookie hosts, {sc.get('writers')} writer hosts, "
                        f"{sc.get('etcd_members')} etcd, {sc.get('quorum')}, 1 KiB | {ours} | {peer} |")
    return rows


def _ratio_txt(num, den) -> str:
    return f"{num / den:.2f}x" if num is not None and den else "n/a"


def machine_markdown(m: dict) -> str:
    return ("| nproc | CPU | memory | disk free | Python | PySpark | PyArrow | grpcio | Redis | Java |\n"
            "|---|---|---|---|---|---|---|---|---|---|\n"
            f"| {m.get('nproc')} | {m.get('cpu_model')} | {m.get('memory_gib')} GiB | "
            f"{m.get('disk_free_gib')} GiB of {m.get('disk_total_gib')} | {m.get('python')} | "
            f"{m.get('pyspark')} | {m.get('pyarrow')} | {m.get('grpcio')} | {m.get('redis_server')} | "
            f"{m.get('java')} |\n")


def plot(r: dict, path: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    sweep = r["figures"].get("sweep") or {}
    ours, redis = sweep.get("ours") or {}, sweep.get("redis") or {}
    fig, (ax1, ax2, ax3) = plt.subplots(1, 3, figsize=(18, 4.8))

    def series(src, mode, key):
        pts = sorted((int(n), v.get(key)) for n, v in (src.get(mode) or {}).items()
                     if v.get(key) is not None)
        return [p[0] for p in pts], [p[1] for p in pts]
    for src, mode, label, style, color in (
            (ours, "pipelined", "pybk add_entries, pipelined chunks of N", "o-", "tab:blue"),
            (ours, "one_in_flight", "pybk add_entries(N), one in flight", "o--", "tab:cyan"),
            (redis, "pipelined", "Redis redis-benchmark -c1 -P N", "s-", "tab:red"),
            (redis, "one_in_flight", "Redis redis-py pipeline(N), one in flight", "s--", "tab:orange")):
        x, y = series(src, mode, "entries_per_s")
        if x:
            ax1.plot(x, y, style, label=label, color=color)
    r50 = _get(r, "figures", "peers_redis", "redis_50c_entries_per_s")
    if r50:
        ax1.axhline(r50, color="grey", ls=":", label="Redis 50 clients x P100")
    ax1.set(xscale="log", yscale="log", xlabel="batch / pipeline size N (1 KiB entries)",
            ylabel="entries/s", title="Append throughput vs batch size")
    ax1.legend(fontsize=7)
    for src, label, style, color in ((ours, "pybk add_entries(N)", "o", "tab:blue"),
                                     (redis, "Redis pipeline(N)", "s", "tab:red")):
        for q, ls in (("p50_ms", "-"), ("p99_ms", "--")):
            x, y = series(src, "one_in_flight", q)
            if x:
                ax2.plot(x, y, style + ls, label=f"{label} {q[:3]}", color=color,
                         alpha=1.0 if q == "p50_ms" else 0.6)
    fs = _get(r, "figures", "1_disk", "fsync_4k", "p50_ms")
    if fs:
        ax2.axhline(fs, color="grey", ls=":", label="disk fdatasync p50")
    ax2.set(xscale="log", yscale="log", xlabel="batch / pipeline size N (1 KiB entries)",
            ylabel="latency per batch, ms", title="Batch latency (one in flight)")
    ax2.legend(fontsize=7)
    _plot_scaling(ax3, r["figures"].get("9_scaling"))
    fig.suptitle(f"pybk-spark vs Redis (appendfsync always), {r['mode']} run {r['started_at']}", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _plot_scaling(ax, sc) -> None:
    """Figure 9: stacked CPU-s per million batched entries by process kind
    for each bookie count, and entries/s (append and read) on a second axis."""
    ax.set(title="Scaling: CPU per entry vs bookie hosts", xlabel="bookie hosts")
    if not sc or not sc.get("available"):
        why = (sc or {}).get("reason") or "not measured"
        ax.text(0.5, 0.5, f"skipped: {why}", ha="center", va="center", wrap=True, fontsize=8,
                transform=ax.transAxes)
        return
    rounds = sc.get("rounds") or {}
    ns = sorted(rounds, key=int)
    x = [int(n) for n in ns]
    bottom = [0.0] * len(ns)
    for kind, color in (("writers", "tab:blue"), ("bookies", "tab:green"), ("etcd", "tab:purple")):
        h = [_get(rounds, n, "append", "cpu_s_per_m_entries", kind) or 0.0 for n in ns]
        ax.bar(x, h, bottom=bottom, width=1.2, color=color, label=f"append CPU: {kind}")
        bottom = [b + v for b, v in zip(bottom, h)]
    ax.set(ylabel="CPU-seconds per million entries (append)", xticks=x)
    ax2 = ax.twinx()
    for phase, style in (("append", "ko-"), ("read", "k^--")):
        ax2.plot(x, [_get(rounds, n, phase, "entries_per_s") for n in ns], style,
                 label=f"{phase} entries/s (2 cores shared)")
    ax2.set(ylabel="entries/s, all writers", ylim=(0, None))
    h1, l1 = ax.get_legend_handles_labels()
    h2, l2 = ax2.get_legend_handles_labels()
    ax.legend(h1 + h2, l1 + l2, fontsize=7, loc="lower left")


def update_docs(r: dict, doc_path: str, png_rel: str, md_table: str) -> None:
    section = "\n".join([
        BEGIN,
        "<!-- generated by `make bench` (bench/report.py); edit outside the markers -->",
        "", "## Latest run", "", md_table,
        f"![throughput and latency against batch size; CPU per entry against bookie hosts]({png_rel})",
        "",
        "## Machine", "", machine_markdown(r["machine"]), END])
    text = open(doc_path).read() if os.path.exists(doc_path) else "# Performance\n\n"
    if BEGIN in text and END in text:
        head, rest = text.split(BEGIN, 1)
        tail = rest.split(END, 1)[1]
        text = head + section + tail
    else:
        text = text.rstrip() + "\n\n" + section + "\n"
    tmp = doc_path + ".tmp"
    with open(tmp, "w") as fh:
        fh.write(text)
    os.replace(tmp, doc_path)
