"""`python -m bench.run --quick` runs end to end and writes the ratio keys.

Checks the harness, never the figures (no timing thresholds).  A ratio may be
null only when the JSON names the missing component under ``missing``.
"""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from bench.run import RATIO_KEYS

ROOT = Path(__file__).resolve().parents[1]
QUICK_JSON = ROOT / "bench" / "results" / "quick.json"


@pytest.mark.slow
def test_bench_quick_writes_every_ratio(tmp_path):
    latest = ROOT / "bench" / "results" / "latest.json"
    latest_before = latest.read_bytes() if latest.exists() else None
    env = dict(os.environ, PYSPARK_PYTHON=sys.executable, PYSPARK_DRIVER_PYTHON=sys.executable,
               SPARK_LOCAL_IP="127.0.0.1")
    proc = subprocess.run([sys.executable, "-m", "bench.run", "--quick", "--data-dir", str(tmp_path)],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    result = json.loads(QUICK_JSON.read_text())
    assert result["mode"] == "quick"
    assert set(result["ratios"]) == set(RATIO_KEYS)
    assert result["errors"] == {}, result["errors"]     # every figure's code path ran
    for key, value in result["ratios"].items():
        if value is None:
            assert result["missing"].get(key), f"ratio {key} is null without a documented reason"
        else:
            assert isinstance(value, (int, float))
    for field in ("nproc", "memory_gib", "disk_free_gib", "python", "pyspark", "pyarrow"):
        assert result["machine"].get(field) is not None, field
    # figure 8 times the pull path at the operators' concurrency beside its peers
    rr = result["figures"]["8_rereplication"]
    assert rr["available"], rr.get("reason")
    for key in ("copy_mb_per_s", "pull_sequential_mb_per_s", "client_copy_mb_per_s"):
        assert isinstance(rr[key], float), key
    # ... and its floor, the bare copy read from the disk as a pull's source
    # reads, at the same concurrency, with the copy from the page cache beside it
    floor = result["figures"]["8_copy_floor"][str(rr["parallel"])]
    assert floor["mb_per_s"] > 0 and floor["cpu_s_per_gb"]["total"] >= 0
    assert floor["source"] == "disk" and floor["read_mode"]
    cached = result["figures"]["8_copy_floor"]["cached"][str(rr["parallel"])]
    assert cached["source"] == "cached" and cached["mb_per_s"] > 0
    assert "bare copy between two processes" in (ROOT / "bench" / "results" / "quick.md").read_text()
    # figure 6's write beside its two floors: the no-op sink and the bare replicated sink
    spark = result["figures"]["6_spark"]
    for side in ("noop_write", "bare_write", "bookkeeper_write"):
        assert spark[side]["median_s"] > 0 and spark[side]["cpu_s"]["machine"] >= 0, side
    assert "bare replicated sink" in (ROOT / "bench" / "results" / "quick.md").read_text()
    # ... and the least CPU storing its bytes twice costs, with the bound that puts on any sink
    assert spark["store_floor"]["cpu_s"] >= 0 and spark["store_floor"]["copies"] == 2
    assert 0 < spark["write_bound_vs_floor"] <= 1
    assert "no sink that stores the rows twice passes" in (
        ROOT / "bench" / "results" / "quick.md").read_text()
    # figure 4 and its floor, measured side by side, each say what else ran meanwhile
    for cpu in (result["figures"]["4_sync_floor"], result["figures"]["4_sync_latency"]["cpu"]):
        assert cpu["others_cores"] is None or cpu["others_cores"] >= 0
    # the O_DIRECT disk probe ran, or says why it could not
    direct = result["figures"]["1_disk"]["seq_direct"]
    assert direct["mb_per_s"] or direct["reason"]
    # figure 9 (scaling over test hosts) ran, or says why it was skipped
    sc = result["figures"].get("9_scaling")
    assert sc is not None, "figure 9 neither measured nor skipped with a reason"
    if sc["available"]:
        assert set(sc["rounds"]) == {"3", "5", "7"}
        for rnd in sc["rounds"].values():
            for phase in ("append", "read"):
                assert set(rnd[phase]["cpu_s_per_m_entries"]) == {"writers", "bookies", "etcd", "total"}
        assert "| 9 |" in (ROOT / "bench" / "results" / "quick.md").read_text()
    else:
        assert sc["reason"]
    assert (ROOT / "bench" / "results" / "quick.md").exists()
    assert (ROOT / "bench" / "results" / "quick.png").exists()
    # quick mode never overwrites the committed full-run figures
    after = latest.read_bytes() if latest.exists() else None
    assert after == latest_before


def test_scaling_skipped_is_reported_not_absent():
    from bench import report
    from bench.run import compute_ratios
    skipped = {"available": False, "reason": "test hosts unavailable: no CAP_NET_ADMIN"}
    ratios, missing = compute_ratios({"9_scaling": skipped}, {})
    assert ratios["entry_cpu_7_vs_3_bookies"] is None
    assert "no CAP_NET_ADMIN" in missing["entry_cpu_7_vs_3_bookies"]
    assert "skipped: test hosts unavailable" in report.scaling_rows(skipped)[0]


def test_scaling_ratio_and_rows_beside_the_3_bookie_round():
    from bench import report
    from bench.run import compute_ratios

    def phase(eps, total):
        return {"entries_per_s": eps, "cpu_s_per_m_entries":
                {"writers": total / 2, "bookies": total / 2, "etcd": 0.0, "total": total}}
    fig = {"available": True, "writers": 4, "etcd_members": 3, "quorum": "E=3 Qw=3 Qa=2",
           "rounds": {str(n): {"append": phase(50_000.0, t), "read": phase(200_000.0, 5.0)}
                      for n, t in ((3, 20.0), (5, 21.0), (7, 22.0))}}
    ratios, missing = compute_ratios({"9_scaling": fig}, {})
    assert ratios["entry_cpu_7_vs_3_bookies"] == 22.0 / 20.0
    assert "entry_cpu_7_vs_3_bookies" not in missing
    rows = report.scaling_rows(fig)
    assert len(rows) == 6 and "1.10x" in rows[2]


def test_scaling_ensembles_spread_round_robin():
    from bench.scaling import ensembles
    ids = [f"bookie-{i}" for i in range(1, 8)]
    got = ensembles(7, 4, ids)
    assert all(len(set(e)) == 3 for e in got)
    assert {b for e in got for b in e} == set(ids)
    assert ensembles(3, 4, ids[:3]) == [ids[:3]] * 4


def test_a_disk_too_full_for_a_run_stops_it_before_it_starts(tmp_path, capsys, monkeypatch):
    """The bookies turn read-only near a full disk and the run would lose its
    later figures: the bench refuses in one line that names the way out."""
    import shutil as _shutil

    from bench import run as bench_run
    # a run whose peak is the whole disk never fits
    monkeypatch.setitem(bench_run.PEAK_BYTES, True, _shutil.disk_usage(tmp_path).total)
    assert bench_run.main(["--quick", "--data-dir", str(tmp_path), "--no-docs"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "--data-dir" in err and str(tmp_path) in err


def test_scaling_runs_on_loopback_where_hosts_cannot_be_made(tmp_path):
    """``--loopback`` runs the scaling rounds on a LocalCluster (one etcd, every
    process on this host): each round reports appends and reads for its
    bookie count.  Checks the harness, never the figures."""
    proc = subprocess.run([sys.executable, "-m", "bench.scaling", "--quick", "--loopback",
                           "--bookies", "3,4", "--writers", "2", "--data-dir", str(tmp_path)],
                          cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    fig = json.loads(proc.stdout)
    assert fig["available"] and fig["bookie_counts"] == [3, 4] and fig["writers"] == 2
    assert fig["etcd_members"] == 1 and "loopback" in fig["writer_layout"]
    for n in ("3", "4"):
        for phase in ("append", "read"):
            got = fig["rounds"][n][phase]
            assert got["entries"] == 2 * 10_000 and got["entries_per_s"] > 0
        assert len(fig["rounds"][n]["append"]["cpu_s_by_process"]["bookies"]) == int(n)


def test_scaling_refuses_bookie_counts_it_cannot_run():
    proc = subprocess.run([sys.executable, "-m", "bench.scaling", "--loopback", "--bookies", "2,5"],
                          cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "at least 3" in proc.stderr.strip().splitlines()[-1]
