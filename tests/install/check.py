"""``make install-check``: the wheel, installed (not editable) into a clean
virtualenv, runs.

1. build the wheel from a copy of what a source distribution holds (pip's
   ordinary isolated build; a stale build/ in the work tree cannot leak in);
2. ``python -m venv`` + ``pip install dist/*.whl`` (the wheel and its
   dependencies, from pip's cache when it has them);
3. from a directory outside the repository, with no PYTHONPATH:
   ``bookie-server --help``, ``pybk --help``, and roundtrip.py (a cluster
   whose bookies are the virtualenv's ``bookie-server`` script; create, add,
   read back, close).

Standard library only: it runs with the interpreter that makes the venv.
Prints how long each step took.  ``--keep`` leaves the work directory (it is
kept anyway when a step fails, and named).

    python tests/install/check.py [--keep] [--work DIR]
"""
from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
PACKAGES = ("pybk_spark", "bookie_server")
SDIST_FILES = ("setup.cfg", "pyproject.toml", "README.md", "pyspark_bookkeeper.py")
STEP_TIMEOUT_S = 1200


class StepFailed(Exception):
    pass


def copy_project(dest: Path) -> Path:
    dest.mkdir(parents=True)
    for name in SDIST_FILES:
        shutil.copy2(ROOT / name, dest / name)
    for pkg in PACKAGES:
        shutil.copytree(ROOT / pkg, dest / pkg,
                        ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    return dest


def clean_env() -> dict:
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV", "PYTHONSTARTUP")}
    env["PYTHONNOUSERSITE"] = "1"
    # the Makefile puts the repo's .venv/bin first: nothing may come from there
    env["PATH"] = os.pathsep.join(p for p in env.get("PATH", "").split(os.pathsep)
                                  if p and ROOT not in Path(p).resolve().parents)
    env.setdefault("GRPC_ENABLE_FORK_SUPPORT", "false")
    return env


def run(label: str, cmd: list, cwd: Path, timings: list, **kw) -> str:
    start = time.monotonic()
    done = subprocess.run([str(c) for c in cmd], cwd=cwd, env=clean_env(), text=True,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          stdin=subprocess.DEVNULL, timeout=STEP_TIMEOUT_S, **kw)
    took = time.monotonic() - start
    timings.append((label, took))
    print(f"install-check: {label}: {took:.1f} s", flush=True)
    if done.returncode != 0:
        raise StepFailed(f"{label} exited {done.returncode}:\n{done.stdout[-6000:]}")
    return done.stdout


def check(work: Path) -> list:
    timings: list = []
    src = copy_project(work / "src")
    dist = work / "dist"
    run("build wheel", [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q",
                        "-w", dist, src], work, timings)
    (wheel,) = dist.glob("*.whl")
    venv = work / "venv"
    run("create venv", [sys.executable, "-m", "venv", venv], work, timings)
    bin_dir = venv / "bin"
    run("pip install wheel", [bin_dir / "python", "-m", "pip", "install", "-q",
                              "--disable-pip-version-check", wheel], work, timings)
    outside = work / "run"                 # not the repository: nothing imported from it
    outside.mkdir()
    for script, needle in (("bookie-server", "--data-dir"), ("pybk", "standalone")):
        out = run(f"{script} --help", [bin_dir / script, "--help"], outside, timings)
        if needle not in out:
            raise StepFailed(f"{script} --help does not mention {needle}:\n{out}")
    shutil.copy2(HERE / "roundtrip.py", outside / "roundtrip.py")
    out = run("client round trip", [bin_dir / "python", "roundtrip.py",
                                    "--bookie-server", bin_dir / "bookie-server",
                                    "--work", work / "cluster"], outside, timings)
    print(out.strip().splitlines()[-1], flush=True)
    return timings


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--work", help="work directory (default: a new temporary one)")
    ap.add_argument("--keep", action="store_true", help="keep the work directory")
    args = ap.parse_args()
    work = Path(args.work) if args.work else Path(tempfile.mkdtemp(prefix="pybk-install-"))
    work.mkdir(parents=True, exist_ok=True)
    if ROOT in work.resolve().parents or work.resolve() == ROOT:
        print(f"install-check: --work must be outside the repository ({ROOT})")
        return 2
    start = time.monotonic()
    try:
        check(work)
    except (StepFailed, subprocess.TimeoutExpired) as exc:
        print(f"install-check: FAILED: {exc}\n(work directory kept: {work})", flush=True)
        return 1
    print(f"install-check: OK in {time.monotonic() - start:.1f} s", flush=True)
    if not args.keep:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
