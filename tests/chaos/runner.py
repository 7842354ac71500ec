"""Chaos run: real etcd + N bookie-server processes + writer/reader processes
+ a seeded nemesis for --duration seconds, then heal, recover and check.

    .venv/bin/python -m tests.chaos.runner --duration 120 [--seed S]
    make chaos DURATION=600 SEED=S

Prints the seed first (replay: same --seed and --duration; the fault
schedule and every worker's choices derive from it, process timing does
not), then totals: operations by kind and outcome, faults by kind,
recoveries.  Exit status 0 = no violation, 1 = violation (the seed and the
minimal failing history are printed), 2 = the run itself broke.
"""
from __future__ import annotations

import argparse
import collections
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from pybk_spark import errors
from pybk_spark.ledger.client import BookKeeper
from pybk_spark.protocol import ledger_metadata as lm
from pybk_spark.cluster import procs
from pybk_spark.cluster.local import LocalCluster

from . import availability as avail
from . import checker as chk
from .history import load_histories, pair_ops
from .nemesis import KINDS, Nemesis
from .workers import CONFIGS

REPO = Path(__file__).resolve().parents[2]
MAX_ENSEMBLE = max(c[0] for c in CONFIGS)     # the workload's widest ensemble
BOOKIE_CONF = {"disk_check_interval_s": 0.5, "flush_interval_s": 2.0, "gc_interval_s": 30.0}


class Workers:
    """The worker processes; thread-safe (nemesis and supervisor share it)."""

    def __init__(self, uri: str, hist_dir: Path, log_dir: Path, seed: int, until: float,
                 env: dict | None = None, place=None, worker_args: dict | None = None):
        self.uri, self.hist_dir, self.log_dir = uri, hist_dir, log_dir
        self.place = place or _spawn_here      # (name, argv, **kw) -> Popen
        self.worker_args = dict(worker_args or {})   # kind -> extra argv (--plant ...)
        self.seed, self.until = seed, until
        self.env = dict(os.environ, **(env or {}))
        self._lock = threading.Lock()
        self._n = collections.Counter()
        self.procs: dict[str, subprocess.Popen] = {}
        self.kind_of: dict[str, str] = {}
        self.leader: dict[str, str] = {}     # log -> current leader's proc name
        self.spawned = collections.Counter()

    def spawn(self, kind: str, log: str | None = None) -> str:
        with self._lock:
            base = {"ledger-writer": "lw", "log-writer": f"log{log}", "tail-reader": "tail",
                    "recoverer": "rec", "autorecovery": "ar", "spark-stream": "spark",
                    "offloader": "off"}[kind]
            n = self._n[base]
            self._n[base] += 1
            name = f"{base}-{n}"
            seed = random.Random(f"{self.seed}/{name}").randrange(1 << 31)
            module = (["tests.chaos.spark_stream"] if kind == "spark-stream"
                      else ["tests.chaos.workers", kind])
            args = [sys.executable, "-m", *module, "--uri", self.uri,
                    "--hist", str(self.hist_dir / f"{name}.jsonl"), "--proc", name,
                    "--seed", str(seed), "--until", str(self.until)]
            if log:
                args += ["--log", log]
            args += self.worker_args.get(kind, [])
            out = open(self.log_dir / f"{name}.log", "ab")
            p = self.place(name, args, cwd=REPO, env=self.env, stdout=out,
                           stderr=subprocess.STDOUT)
            out.close()
            self.procs[name] = p
            self.kind_of[name] = kind
            self.spawned[kind] += 1
            if log:
                self.leader[log] = name
            return name

    def alive(self, name: str) -> bool:
        return self.procs[name].poll() is None

    def kill_random_writer(self, rng) -> str | None:
        with self._lock:
            cands = sorted(n for n, p in self.procs.items() if p.poll() is None
                           and self.kind_of[n] in ("ledger-writer", "log-writer", "offloader"))
        if not cands:
            return None
        name = rng.choice(cands)
        p = self.procs[name]
        try:
            p.send_signal(signal.SIGKILL)
            p.wait(30)
        except (ProcessLookupError, subprocess.TimeoutExpired):
            pass
        procs.unregister(p)
        return name

    def takeover(self, rng) -> str | None:
        logs = sorted(self.leader)
        if not logs or time.time() > self.until - 5:
            return None
        return self.spawn("log-writer", rng.choice(logs))

    def supervise(self) -> None:
        """Keep one writer per log and the ledger-writer and offloader counts
        (successors)."""
        if time.time() > self.until - 3:
            return
        with self._lock:
            dead_leaders = [log for log, n in self.leader.items() if self.procs[n].poll() is not None]
            lw_dead = [n for n, k in self.kind_of.items() if k in ("ledger-writer", "offloader")
                       and self.procs[n].poll() is not None and not n.endswith("+")]
        for log in dead_leaders:
            self.spawn("log-writer", log)
        for n in lw_dead:
            with self._lock:
                kind = self.kind_of.pop(n)
                self.kind_of[n + "+"] = kind                   # mark replaced
                self.procs[n + "+"] = self.procs.pop(n)
            self.spawn(kind)

    def wait_all(self, grace: float, skip: tuple = ()) -> list[str]:
        """Wait for every worker (but those of the kinds in ``skip``) to stop
        by itself; SIGKILL stragglers."""
        deadline = time.monotonic() + grace
        stragglers = []
        for name, p in list(self.procs.items()):
            if self.kind_of.get(name) in skip:
                continue
            try:
                p.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                stragglers.append(name)
                p.send_signal(signal.SIGUSR1)      # thread dump into its log
                time.sleep(0.5)
                p.kill()
                p.wait()
            procs.unregister(p)
        return stragglers


def _spawn_here(name: str, argv: list, **kw) -> subprocess.Popen:
    return procs.spawn(argv, stdin=subprocess.DEVNULL, **kw)


def _make_cluster(topology: str, base: Path, bookies: int, etcd_members: int, out):
    """(cluster, topology actually used): "hosts" puts every etcd member,
    bookie and worker on its own test host; "auto" falls back to loopback
    (printing why) where test hosts cannot be made."""
    if topology in ("auto", "hosts"):
        from .host_topology import ChaosHosts, unavailable_reason
        reason = unavailable_reason()
        if reason is None:
            return ChaosHosts(base / "cluster", num_bookies=bookies, etcd_members=etcd_members,
                              bookie_conf=dict(BOOKIE_CONF, journal_prealloc_bytes=4 << 20)), \
                "hosts"
        if topology == "hosts":
            raise RuntimeError(f"--topology hosts: test hosts unavailable: {reason}")
        out(f"chaos: test hosts unavailable ({reason}); every process on 127.0.0.1")
    return LocalCluster(base / "cluster", num_bookies=bookies, bookie_conf=BOOKIE_CONF), \
        "loopback"


def _watch_metadata(uri: str, stop: threading.Event, out: list) -> None:
    """Record every observed change of ledger metadata (for I4)."""
    last: dict[int, tuple] = {}
    bk = None
    while not stop.wait(0.5):
        try:
            if bk is None:
                bk = BookKeeper(uri, background=False)
            for key, value in bk.metadata_store.list_prefix("ledgers/"):
                md = lm.LedgerMetadata.from_json(value.value)
                snap = chk.snapshot_of(md)
                if last.get(md.ledger_id) != snap:
                    last[md.ledger_id] = snap
                    out.append((time.time(), md.ledger_id, snap))
        except Exception:  # noqa: BLE001 - etcd restarting
            continue
    if bk is not None:
        bk.close()


def _registry_store(uri: str, opened: list):
    bk = BookKeeper(uri, background=False)
    opened.append(bk)
    return bk.metadata_store


def run(duration: float, seed: int, *, workdir: str | None = None, bookies: int = 5,
        ledger_writers: int = 2, logs: int = 2, tail_readers: int = 1, recoverers: int = 1,
        autorecoverers: int = 0, spark: bool = False, offloaders: int = 0,
        nemesis: bool = True, rereplicate: bool = True, strict_replicas: bool = True,
        worker_env: dict | None = None, kinds: list | None = None, topology: str = "auto",
        etcd_members: int = 3, worker_args: dict | None = None, out=print) -> dict:
    """One chaos run; returns a summary dict (``violations`` is a list of str)."""
    t_start = time.time()
    # a directory of the run's own goes when the run finds no violation
    # (hundreds of MB of journals, segments and logs); one it was given stays
    own_dir = workdir is None
    base = Path(workdir or tempfile.mkdtemp(prefix="pybk-chaos-"))
    hist_dir, log_dir = base / "history", base / "logs"
    hist_dir.mkdir(parents=True, exist_ok=True)
    log_dir.mkdir(parents=True, exist_ok=True)
    out(f"chaos: seed={seed} duration={duration}s workdir={base}")
    rng = random.Random(seed)
    min_qa = min(c[2] for c in CONFIGS)
    max_faults = max(0, min(min_qa - 1, bookies - MAX_ENSEMBLE))
    cluster, topology = _make_cluster(topology, base, bookies, etcd_members, out)
    summary: dict = {"seed": seed, "workdir": str(base), "topology": topology}
    snapshots: list = []
    stop_watch = threading.Event()
    workers = None
    registry = None
    opened: list = []           # the registry watch's clients, closed at the end
    try:
        cluster.start()
        until = time.time() + duration
        workers = Workers(cluster.metadata_uri, hist_dir, log_dir, seed, until, worker_env,
                          place=getattr(cluster, "spawn_worker", None),
                          worker_args=worker_args)
        for _ in range(ledger_writers):
            workers.spawn("ledger-writer")
        for i in range(logs):
            workers.spawn("log-writer", chr(ord("a") + i))
        for _ in range(tail_readers):
            workers.spawn("tail-reader")
        for _ in range(recoverers):
            workers.spawn("recoverer")
        for _ in range(autorecoverers):
            workers.spawn("autorecovery")
        if offloaders:
            workers.worker_args["offloader"] = ["--offload-location", str(base / "offload")]
        for _ in range(offloaders):
            workers.spawn("offloader")
        spark_files = None
        if spark and logs:
            spark_files = (base / "spark" / "catchup", base / "spark" / "result.json")
            workers.worker_args["spark-stream"] = [
                "--logs", ",".join(chr(ord("a") + i) for i in range(logs)),
                "--workdir", str(base / "spark"), "--catchup", str(spark_files[0]),
                "--result", str(spark_files[1])]
            workers.spawn("spark-stream")
        watcher = threading.Thread(target=_watch_metadata,
                                   args=(cluster.metadata_uri, stop_watch, snapshots), daemon=True)
        watcher.start()
        registry = avail.RegistryWatch(lambda: _registry_store(cluster.metadata_uri, opened))
        registry.start()
        t0, t0_wall = time.monotonic(), time.time()   # the nemesis log's zero, both clocks
        nem = Nemesis(cluster, workers, random.Random(rng.randrange(1 << 31)),
                      max_bookie_faults=max_faults, kinds=kinds,
                      log=lambda m: out(f"[{time.monotonic() - t0:7.1f}s] {m}"))
        nem.relay_log_dir = str(log_dir)
        nem_thread = threading.Thread(
            target=lambda: nem.run(time.monotonic() + duration) if nemesis else None, daemon=True)
        nem_thread.start()
        while time.time() < until:
            workers.supervise()
            time.sleep(0.5)
        nem.stop()
        nem_thread.join(300)
        nem.heal_all()
        stragglers = workers.wait_all(grace=HANG_GRACE_S, skip=("spark-stream",))
        if stragglers:
            out(f"chaos: SIGKILLed workers that did not stop by themselves: {stragglers}")
        stop_watch.set()
        watcher.join(30)
        registry.stop()
        out("chaos: healed; recovering every ledger and checking")
        ops = pair_ops(load_histories(str(hist_dir)))
        bk = BookKeeper(cluster.metadata_uri, background=False)
        try:
            final = chk.collect_final_state(bk, log=out)
            if offloaders:
                out(f"chaos: read {chk.add_offloaded(bk, final)} offloaded segments "
                    "back from their files")
            sink = _spark_catch_up(workers, spark_files, out) if spark_files else None
            if sink is not None:       # the sink ledgers written since: read them too
                chk.extend_final_state(bk, final, log=out)
                for i in range(logs):
                    name = chr(ord("a") + i)
                    sink[name] = chk.read_sink(bk, name)
                out("chaos: Spark sink read back: " + ", ".join(
                    f"{k}-sink {len(v)} rows" for k, v in sorted(sink.items())
                    if isinstance(v, list)))
            t_check = time.time()
            if rereplicate:
                _rereplicate_phase(cluster, bk, final, rng, out)
            summary["rereplicate_s"] = round(time.time() - t_check, 1)
        finally:
            bk.close()
        violations = chk.check(ops, final, snapshots, strict_replicas=strict_replicas)
        windows = nem.all_windows()
        violations += avail.check_registration(registry.samples, windows, REGISTRATION_GRACE_S,
                                               t0=t0)
        summary["registration"] = avail.registration_totals(registry.samples, windows,
                                                            REGISTRATION_GRACE_S)
        violations += avail.check_autorecovery(ops, autorecoverers, AUTORECOVERY_STANDBY_S,
                                               t0=t0_wall)
        if spark_files:
            violations += chk.check_sink(sink, final)
            summary["spark"] = chk.sink_totals(sink, final)
        summary["replication"] = chk.under_replicated(final)
        summary.update(_totals(ops, final, nem.counts, workers))
        summary["fault_shapes"] = dict(sorted(nem.shapes.items()))
        summary["violations"] = [str(v) for v in violations]
        summary["elapsed_s"] = round(time.time() - t_start, 1)
        _report(out, seed, duration, ops, violations, summary)
        return summary
    finally:
        stop_watch.set()
        if registry is not None:
            registry.stop()
        for client in opened:
            client.close()
        if workers is not None:
            workers.wait_all(grace=0.1)
        cluster.stop()
        if own_dir and summary.get("violations") == []:
            shutil.rmtree(base, ignore_errors=True)
            out(f"chaos: removed {base} (no violation; --workdir DIR keeps a run's files)")


HANG_GRACE_S = 100.0
# I9: how long after its fault is repaired a bookie may still be unregistered
# (a lease that lapsed during a pause is renewed by the next refresh, ttl/3;
# one etcd RPC may take its 10 s timeout)
REGISTRATION_GRACE_S = 15.0
SPARK_CATCHUP_S = 1200.0
# I10: how long a lone autorecovery daemon may stand by behind its own earlier
# key (its leader lease, 15 s, if the revoke did not reach etcd; one etcd RPC
# may take its 10 s timeout; rounds every 2 s)
AUTORECOVERY_STANDBY_S = 40.0


def _spark_catch_up(workers, files, out) -> dict | None:
    """Tell the Spark worker that every ledger is recovered (its queries can
    now read every source segment to the end), wait for its sink read-back;
    None if it produced none (I8 reports that)."""
    catchup, result = files
    catchup.write_text("healed\n")
    names = [n for n, k in workers.kind_of.items() if k == "spark-stream"]
    deadline = time.monotonic() + SPARK_CATCHUP_S
    for name in names:
        p = workers.procs[name]
        try:
            p.wait(max(1.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            out(f"chaos: {name} did not catch up in {SPARK_CATCHUP_S:g}s; killed")
            p.send_signal(signal.SIGUSR1)
            time.sleep(0.5)
            p.kill()
            p.wait()
        procs.unregister(p)
    if not result.exists():
        out("chaos: the Spark worker wrote no sink result (see logs/spark-0.log)")
        return None
    return json.loads(result.read_text())


def _rereplicate_phase(cluster, bk, final, rng, out) -> str | None:
    """I6: stop one bookie for good, run the re-replication tool (if it exists)
    naming it lost, then count every entry's replicas in its write set."""
    try:
        from pybk_spark.admin.operations import orchestrate
        from pybk_spark.admin.operations import rereplicate as rr
    except ImportError:
        out("chaos: no pybk_spark.admin.operations.orchestrate; I6 skipped")
        return None
    victim = rng.choice(sorted(cluster.bookie_ids))
    cluster.kill_bookie(victim, signal.SIGTERM)
    try:
        report, _text, status = orchestrate.run_rereplicate(
            bk, cluster.metadata_uri, orchestrate.local_mapper(progress=False), bookies=[victim],
            verify=True)                 # verify also fills in copies live bookies lack
    except Exception as exc:  # noqa: BLE001
        out(f"chaos: rereplicate raised {exc!r}")
        report, status = {}, -1
    s = report.get("summary", {})
    copies = report.get("copies", [])
    failed = [c for c in copies if c.get("outcome") == "failed"]
    out(f"chaos: rereplicated away from {victim}: status={status} "
        f"copies={len(copies)} entries={s.get('entries')} failed={len(failed)}"
        + (f" {rr.failure_reasons(copies)}; first: {failed[0]}" if failed else ""))
    for lid, fl in list(final.ledgers.items()):
        if fl.state != lm.CLOSED or fl.offloaded:     # offloaded: the ledger left the bookies
            continue
        try:
            md = bk.get_ledger_metadata(lid)
        except errors.NoSuchLedger:
            if not fl.foreign:
                raise
            # a Spark task's ledger whose batch was never committed: the sink
            # deletes it when the next query starts (seed 2026112702, ledger 2730)
            out(f"chaos: ledger {lid} (a Spark attempt's, never committed) was cleaned by the sink")
            del final.ledgers[lid]
            continue
        fl.snapshot = chk.snapshot_of(md)
        fl.replicas = chk.count_entry_replicas(bk, md, fl.lacking)
    final.replicas_checked = True
    return victim


def _totals(ops, final, faults, workers) -> dict:
    by = collections.Counter((op.get("op"), op.get("outcome")) for op in ops)
    errs = collections.Counter(f"{op.get('op')}:{op['error']}" for op in ops
                               if op.get("error") and op.get("outcome") in ("fail", "unknown"))
    spark = collections.Counter(op["op"] for op in ops if str(op.get("op")).startswith("spark_"))
    entries = collections.Counter()
    for op in ops:
        if op.get("op") in ("add", "append"):
            entries[op["outcome"]] += len(op.get("digests") or [])
    return {
        "operations": sum(op.get("outcome") != "note" for op in ops),
        "recovery_decisions": by.get(("recovery", "note"), 0),
        "ops": {f"{k[0]}:{k[1]}": v for k, v in sorted(by.items())},
        "entries": dict(entries),
        "faults": {k: v for k, v in faults.items() if v},
        "faults_total": sum(faults.values()),
        "recoveries_during_run": by.get(("recover", "ok"), 0),
        "recoveries_final": final.recoveries,
        "recovery_failures_final": len(final.recovery_failures),
        "ledgers": len(final.ledgers),
        "logs": {k: len(v) for k, v in final.logs.items()},
        "workers_started": dict(workers.spawned),
        "autorecovery": chk.autorecovery_totals(ops),
        "errors": dict(sorted(errs.items())),      # typed errors by op (LedgerFenced, ...)
        "spark_notes": dict(spark),
    }


def _report(out, seed, duration, ops, violations, summary) -> None:
    out("chaos: totals " + json.dumps({k: v for k, v in summary.items() if k != "violations"},
                                      sort_keys=True))
    if not violations:
        out(f"chaos: OK, no violation (seed={seed})")
        return
    out(f"chaos: {len(violations)} VIOLATION(S)  seed={seed}  replay: "
        f".venv/bin/python -m tests.chaos.runner --duration {duration:g} --seed {seed}")
    for v in violations[:10]:
        out(f"  {v}")
        for op in chk.minimal_history(ops, v):
            out(f"      {chk.format_op(op)}")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="tests.chaos.runner", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--duration", type=float, default=120)
    p.add_argument("--seed", type=int)
    p.add_argument("--workdir")
    p.add_argument("--bookies", type=int, default=5)
    p.add_argument("--ledger-writers", type=int, default=2)
    p.add_argument("--logs", type=int, default=2)
    p.add_argument("--autorecoverers", type=int, default=0,
                   help="autorecovery daemons (workers.py autorecovery), each on its own host")
    p.add_argument("--offloaders", type=int, default=0,
                   help="offload workers (workers.py offloader): every log's closed segments "
                        "to Parquet and their ledgers deleted while the run goes on; I11 "
                        "checks the files (one is the supported setup)")
    p.add_argument("--tail-readers", type=int, default=1)
    p.add_argument("--recoverers", type=int, default=1)
    p.add_argument("--spark", action="store_true",
                   help="a Spark streaming query per log (source -> exactly-once sink, "
                        "spark_stream.py) on its own host; I8 checks the sink")
    p.add_argument("--no-nemesis", action="store_true")
    p.add_argument("--no-rereplicate", action="store_true")
    p.add_argument("--lenient-replicas", action="store_true",
                   help="I6: accept Qa..Qw-1 replicas (default: every entry needs Qw)")
    p.add_argument("--faults", help="comma-separated subset of " + ",".join(KINDS))
    p.add_argument("--topology", choices=["auto", "hosts", "loopback"], default="auto",
                   help="hosts: every etcd member, bookie and worker on its own test host "
                        "(network namespace; needed by the link faults); auto (default): "
                        "hosts where they can be made, else loopback, saying why")
    p.add_argument("--etcd-members", type=int, default=3,
                   help="etcd members on the host topology (loopback runs one)")
    p.add_argument("--json", help="write the summary here")
    a = p.parse_args(argv)
    if not a.no_rereplicate and a.bookies <= MAX_ENSEMBLE:
        # I6 re-replicates away from one bookie: an ensemble as wide as the
        # cluster has no bookie outside it (every copy NotEnoughBookies)
        p.error(f"--bookies {a.bookies}: the workload's ensembles are up to {MAX_ENSEMBLE} wide, "
                f"so re-replication (I6) needs at least {MAX_ENSEMBLE + 1} bookies "
                f"(or pass --no-rereplicate)")
    seed = a.seed if a.seed is not None else random.SystemRandom().randrange(1 << 31)
    print(f"chaos: seed {seed}", flush=True)
    procs_out = lambda m: print(m, flush=True)  # noqa: E731
    try:
        summary = run(a.duration, seed, workdir=a.workdir, bookies=a.bookies,
                      ledger_writers=a.ledger_writers, logs=a.logs, nemesis=not a.no_nemesis,
                      autorecoverers=a.autorecoverers, spark=a.spark,
                      offloaders=a.offloaders,
                      tail_readers=a.tail_readers, recoverers=a.recoverers,
                      rereplicate=not a.no_rereplicate, strict_replicas=not a.lenient_replicas,
                      kinds=a.faults.split(",") if a.faults else None, topology=a.topology,
                      etcd_members=a.etcd_members, out=procs_out)
    except Exception as exc:  # noqa: BLE001
        print(f"chaos: run broke (seed {seed}): {exc!r}", flush=True)
        return 2
    if a.json:
        Path(a.json).write_text(json.dumps(summary, indent=2, sort_keys=True))
    return 1 if summary["violations"] else 0


if __name__ == "__main__":
    sys.exit(main())
