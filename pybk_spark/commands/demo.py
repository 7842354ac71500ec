"""``make demo``: a real local cluster, the demo job through spark-submit, teardown.

    python -m pybk_spark.commands.demo [--bookies 3] [--keep-data] [-- extra args for jobs/demo.py]

Starts etcd and N ``bookie-server`` processes on loopback (free ports, a temp
dir), runs ``spark-submit jobs/demo.py --metadata-uri URI --offload-location DIR/offload``
with this interpreter as the Spark Python, prints what happened, stops everything even
on failure or Ctrl-C, and exits with the job's status.
"""
from __future__ import annotations

import argparse
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from pybk_spark.cluster.local import LocalCluster

PROJECT_ROOT = Path(__file__).resolve().parents[2]       # the checkout: jobs/ is beside pybk_spark/
DEMO_JOB = PROJECT_ROOT / "jobs" / "demo.py"
JOB_TIMEOUT_S = 900


def spark_submit_path() -> str:
    beside = Path(sys.executable).parent / "spark-submit"
    if beside.exists():
        return str(beside)
    found = shutil.which("spark-submit")
    if not found:
        raise SystemExit("spark-submit not found next to the Python interpreter nor on PATH; "
                         "run `make demo` (it installs pyspark into .venv)")
    return found


def spark_env() -> dict:
    env = dict(os.environ)
    env.update(PYSPARK_PYTHON=sys.executable, PYSPARK_DRIVER_PYTHON=sys.executable,
               SPARK_LOCAL_IP="127.0.0.1")
    # the job imports pybk_spark; make that work even without an installed package
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(PROJECT_ROOT), env.get("PYTHONPATH")) if p)
    return env


def submit_command(metadata_uri: str, job_args: list[str]) -> list[str]:
    return [spark_submit_path(), "--master", "local[2]",
            "--conf", "spark.ui.enabled=false",
            "--conf", "spark.driver.host=127.0.0.1",
            "--conf", "spark.driver.bindAddress=127.0.0.1",
            "--conf", "spark.sql.shuffle.partitions=2",
            "--conf", "spark.log.level=WARN",
            str(DEMO_JOB), "--metadata-uri", metadata_uri, *job_args]


def run_job(cmd: list[str], timeout_s: float) -> int:
    """Run spark-submit in its own process group; on timeout or Ctrl-C kill the
    whole group (JVM and Python workers included) so nothing is left behind."""
    proc = subprocess.Popen(cmd, env=spark_env(), start_new_session=True)
    try:
        return proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        print(f"demo: spark-submit did not finish within {timeout_s:.0f} s; killing it",
              file=sys.stderr, flush=True)
        return 124
    finally:
        if proc.poll() is None:
            _kill_group(proc)


def _kill_group(proc: subprocess.Popen) -> None:
    for sig, grace in ((signal.SIGTERM, 10), (signal.SIGKILL, 10)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=grace)
            return
        except subprocess.TimeoutExpired:
            continue


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m pybk_spark.commands.demo", description=__doc__.splitlines()[0])
    ap.add_argument("--bookies", type=int, default=3)
    ap.add_argument("--keep-data", action="store_true", help="do not delete the temp data dir")
    ap.add_argument("--timeout", type=float, default=JOB_TIMEOUT_S)
    ap.add_argument("job_args", nargs="*", help="extra arguments for jobs/demo.py (after --)")
    args = ap.parse_args(argv)

    data_dir = tempfile.mkdtemp(prefix="pybk-demo-")
    rc = 1
    try:
        t0 = time.perf_counter()
        print(f"demo: starting etcd + {args.bookies} bookies in {data_dir}", flush=True)
        with LocalCluster(data_dir, num_bookies=args.bookies) as cluster:
            uri = cluster.metadata_uri
            print(f"demo: cluster up in {time.perf_counter() - t0:.1f} s: "
                  f"metadataServiceUri={uri}", flush=True)
            cmd = submit_command(uri, ["--offload-location", os.path.join(data_dir, "offload"),
                                       *args.job_args])
            print("demo: " + " ".join(cmd), flush=True)
            t1 = time.perf_counter()
            rc = run_job(cmd, args.timeout)
            print(f"demo: spark-submit exited {rc} after {time.perf_counter() - t1:.1f} s; "
                  "stopping the cluster", flush=True)
    except KeyboardInterrupt:
        print("demo: interrupted; cluster stopped", file=sys.stderr)
        rc = 130
    finally:
        if args.keep_data:
            print(f"demo: data kept in {data_dir}")
        else:
            shutil.rmtree(data_dir, ignore_errors=True)
    print("demo: " + ("PASSED" if rc == 0 else f"FAILED (exit {rc})"), flush=True)
    return rc


if __name__ == "__main__":
    sys.exit(main())
