"""``make demo-cluster``: the demo job on a many-host cluster, with a bookie
host and the etcd leader killed while it writes.

    python -m pybk_spark.commands.demo_cluster [--keep-data] [--timeout S] [-- extra jobs/demo.py args]

Layout, every process on its own test host (network namespace,
``pybk_spark.cluster.hosts``; needs root / CAP_NET_ADMIN, etcd, java):

    etcd-1..3        a 3-member etcd cluster (multi-endpoint metadata URI)
    bookie-1..5      one bookie-server each; racks /rack-a (1, 3, 5), /rack-b (2, 4)
    spark-master     Spark standalone master
    spark-worker-1,2 Spark workers (executors: the demo's Spark reads)
    spark-driver     spark-submit jobs/demo.py --placement-policy rack-aware

While the job runs, this process (in the root namespace) watches etcd; as
soon as the job's first ledger exists it SIGKILLs the bookie-server of one
bookie in that ledger's current ensemble (the host stays, its bookie is
gone) and then SIGKILLs the etcd leader.  The job must still print
``RESULT: OK`` (it verifies every row itself, through the client and
through Spark), and then this process verifies independently: every ledger
closed with the expected number of entries, every payload equal to what the
job wrote (regenerated from the job's seed), every ensemble spread over
both racks.  It prints a timeline host by host and tears everything down
(also on failure and Ctrl-C).  Exit 0 on success, otherwise non-zero with
a one-line reason as the last line.
"""
from __future__ import annotations

import argparse
import importlib.util
import random
import re
import shutil
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

from pybk_spark import errors
from pybk_spark.cluster.host_cluster import HostCluster, unavailable_reason
from pybk_spark.cluster.hosts import HostNetwork
from pybk_spark.cluster.spark_cluster import SparkCluster
from pybk_spark.commands.demo_timeline import Timeline
from pybk_spark.ledger.client import BookKeeper
from pybk_spark.metadata.store import MetadataStore
from pybk_spark.metadata import keys

PROJECT_ROOT = Path(__file__).resolve().parents[2]       # the checkout: jobs/ is beside pybk_spark/
DEMO_JOB = PROJECT_ROOT / "jobs" / "demo.py"
RACKS = {"bookie-1": "/rack-a", "bookie-2": "/rack-b", "bookie-3": "/rack-a",
         "bookie-4": "/rack-b", "bookie-5": "/rack-a"}
METRICS_PORT = 8000
JOB_ARGS = ["--ledgers", "4", "--entries", "4000", "--max-entries-per-partition", "2000"]
JOB_TIMEOUT_S = 1200.0            # JVMs on shared cores: a bound, not an expectation
_HTTP = urllib.request.build_opener(urllib.request.ProxyHandler({}))


class DemoFailed(Exception):
    """The one-line reason the demo failed."""


def missing_requirement() -> str | None:
    """Why the demo cannot run here (None: it can)."""
    reason = unavailable_reason()
    if reason:
        return reason
    if shutil.which("java") is None:
        return "no 'java' on PATH (Spark needs a JRE 17+)"
    if importlib.util.find_spec("pyspark") is None:
        return "pyspark is not installed (make venv)"
    return None


def bookie_entries(address: str) -> int | None:
    """``bookie_add_entries_total`` from the bookie's /metrics (None: no answer)."""
    try:
        with _HTTP.open(f"http://{address}:{METRICS_PORT}/metrics", timeout=3) as resp:
            text = resp.read().decode()
    except OSError:
        return None
    m = re.search(r"^bookie_add_entries_total ([0-9.e+]+)$", text, re.MULTILINE)
    return int(float(m.group(1))) if m else None


def ledger_ids(store: MetadataStore) -> list[int]:
    return sorted(int(k.rsplit("/", 1)[1]) for k, _ in store.list_prefix(keys.LEDGERS_PREFIX)
                  if k.rsplit("/", 1)[1].isdigit())


def load_job_module():
    spec = importlib.util.spec_from_file_location("pybk_demo_job", DEMO_JOB)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


class Demo:
    def __init__(self, data_dir: Path, job_args: list[str], timeout: float, seed: int):
        self.data_dir = data_dir
        self.job_args = job_args
        self.timeout = timeout
        self.seed = seed
        self.tl = Timeline()
        self.cluster: Any = None
        self.spark: Any = None
        self.victim: str | None = None
        self.killed_etcd: str | None = None
        self.mid_write = False
        self.seen: tuple[int, int, tuple[str, ...]] | None = None   # (ledger, first entry, ensemble) at the kill

    def say(self, text: str) -> None:
        print(f"demo-cluster: [{time.monotonic() - self.tl.t0:6.1f}s] {text}", flush=True)

    # -- the run ------------------------------------------------------------------------
    def run(self, net) -> str:
        self.say(f"starting 3 etcd members and 5 bookies (racks {_rack_summary()}) "
                 f"on separate hosts under {self.data_dir}")
        self.cluster = HostCluster(self.data_dir / "bk", network=net, num_bookies=len(RACKS),
                                   racks=RACKS, bookie_conf={"journal_prealloc_bytes": 4 << 20,
                                                             "metrics_port": METRICS_PORT})
        self.cluster.start()
        for m in self.cluster.etcd.members:
            self.tl.add_host(m.name, m.host, "etcd member")
            self.tl.event(m.name, "etcd member ready")
        for bid, b in self.cluster.bookies.items():
            self.tl.add_host(bid, b.host.address, f"bookie {RACKS[bid]}")
            self.tl.event(bid, "bookie-server registered")
        leader = self.cluster.etcd.leader()
        self.tl.event(leader.name, "etcd leader")
        self.say(f"metadataServiceUri={self.cluster.metadata_uri}; etcd leader {leader.name}")

        self.say("starting Spark: master, 2 workers, driver host")
        self.spark = SparkCluster(net, self.data_dir / "spark").start()
        self.tl.add_host("spark-master", self.spark.master_host.address, "spark master")
        self.tl.event("spark-master", f"ALIVE ({self.spark.master_url})")
        for h in self.spark.worker_hosts:
            self.tl.add_host(h.name, h.address, "spark worker")
            self.tl.event(h.name, "worker ALIVE")
        driver = self.spark.driver_host
        self.tl.add_host(driver.name, driver.address, "spark driver (spark-submit)")
        self.say(f"Spark ready: {self.spark.master_url}, workers "
                 f"{', '.join(self.spark.alive_workers())}")
        return self._run_job()

    def _run_job(self) -> str:
        args = ["--metadata-uri", self.cluster.metadata_uri, "--placement-policy", "rack-aware",
                "--seed", str(self.seed), *self.job_args]
        result: dict = {}

        def submit():
            try:
                result["res"] = self.spark.submit(DEMO_JOB, *args, timeout=self.timeout,
                                                  name="demo")
            except BaseException as exc:  # noqa: BLE001 - reported by the main thread
                result["error"] = exc

        self.tl.event("spark-driver", "spark-submit jobs/demo.py " + " ".join(args[2:]))
        self.say("spark-submit jobs/demo.py " + " ".join(args))
        job = threading.Thread(target=submit, name="spark-submit", daemon=True)
        job.start()
        injected = self._inject_faults(job)
        if injected:
            self._watch_recovery(job)
        job.join()
        if "error" in result:
            raise DemoFailed(f"spark-submit failed: {result['error']}")
        res = result["res"]
        ok = res.returncode == 0 and "RESULT: OK" in res.stdout
        self.tl.event("spark-driver", f"job exited {res.returncode}: "
                      + next((ln for ln in res.stdout.splitlines() if ln.startswith("RESULT:")),
                             "no RESULT line"))
        print("---- jobs/demo.py output ----\n" + res.stdout.strip() + "\n----", flush=True)
        if not ok:
            raise DemoFailed(f"the demo job failed (exit {res.returncode}); stderr tail: "
                             + " | ".join(res.stderr.strip().splitlines()[-5:]))
        if not injected:
            raise DemoFailed("the job ended before it created a ledger; nothing was killed")
        return res.stdout

    def _inject_faults(self, job: threading.Thread) -> bool:
        """As soon as one of the job's ledgers is open (being written): SIGKILL
        a bookie of its current ensemble, then the etcd leader."""
        bk = BookKeeper(store=self.cluster.store, background=False)
        try:
            md = None
            while job.is_alive():
                try:
                    ids = ledger_ids(bk.metadata_store)
                    md = bk.get_ledger_metadata(ids[-1]) if ids else None
                except errors.MetadataError:
                    md = None
                if md is not None and not md.is_closed:
                    break
                time.sleep(0.02)
        finally:
            bk.close()
        if md is None:
            return False
        self.mid_write = not md.is_closed
        self.tl.event("spark-driver", f"job is writing ledger {ids[-1]} "
                      + ("(open)" if not md.is_closed else "(closed: the writes are over)")
                      + f" on {', '.join(md.ensembles[-1][1])}")
        self.victim = md.ensembles[-1][1][0]
        self.seen = (ids[-1], *md.ensembles[-1])
        b = self.cluster.bookies[self.victim]
        before = bookie_entries(b.host.address)
        self.cluster.kill_bookie(self.victim)
        self.tl.event(self.victim, f"SIGKILL bookie-server (had acknowledged {before} entries); "
                      "host stays up")
        self.tl.figure(self.victim, "entries acked", f"{before} (at kill)")
        self.say(f"killed bookie {self.victim} ({b.host.address}, {RACKS[self.victim]}), "
                 f"in the ensemble of ledger {ids[-1]}")
        leader = self.cluster.etcd.leader()
        leader.kill()
        self.killed_etcd = leader.name
        self.tl.event(leader.name, "SIGKILL etcd (it was the leader)")
        self.say(f"killed the etcd leader {leader.name} ({leader.host})")
        return True

    def _watch_recovery(self, job: threading.Thread) -> None:
        """Until the job ends: note the new etcd leader and the victim's
        registration expiring."""
        victim = self.victim
        assert victim is not None, "recovery is watched only after _inject_faults killed a bookie"
        new_leader = unregistered = False
        while job.is_alive() and not (new_leader and unregistered):
            if not new_leader:
                try:
                    found = self.cluster.etcd.leader(timeout=0.2)
                except TimeoutError:
                    found = None
                if found is not None:
                    self.tl.event(found.name, "elected etcd leader")
                    self.say(f"new etcd leader {found.name}")
                    new_leader = True
            if not unregistered:
                try:
                    gone = all(self.cluster.store.get(keys.bookie_key(m, victim)) is None
                               for m in ("writable", "readonly"))
                except errors.MetadataError:
                    gone = False
                if gone:
                    self.tl.event(victim, "registration expired (no longer writable)")
                    unregistered = True
            job.join(0.2)

    # -- independent verification -------------------------------------------------------
    def verify(self, job_stdout: str) -> list[str]:
        """Read every ledger back with a fresh client; returns the problems."""
        job = load_job_module()
        n_ledgers = int(_arg(self.job_args, "--ledgers", 3))
        entries = int(_arg(self.job_args, "--entries", 1000))
        size = int(_arg(self.job_args, "--entry-size", 100))
        rng = random.Random(self.seed)
        expected = {n: job.make_payloads(rng, n, entries, size) for n in range(n_ledgers)}
        problems, rows = [], 0
        bk = BookKeeper(self.cluster.metadata_uri)
        try:
            ids = ledger_ids(bk.metadata_store)
            if len(ids) != n_ledgers:
                problems.append(f"{len(ids)} ledgers in etcd, the job wrote {n_ledgers}")
            for lid in ids:
                md = bk.get_ledger_metadata(lid)
                changes = len(md.ensembles) - 1
                self._note_replacements(lid, md)
                print(f"  ledger {lid}: closed={md.is_closed} last_entry={md.last_entry_id} "
                      f"ensembles {[list(e) for _, e in md.ensembles]}"
                      + (f" (at the kill: {list(self.seen[2])} from entry {self.seen[1]})"
                         if self.seen and self.seen[0] == lid else "")
                      + (f" ({changes} ensemble change{'s' * (changes > 1)})" if changes else ""),
                      flush=True)
                for _, ens in md.ensembles:
                    if len({RACKS[b] for b in ens}) < 2:
                        problems.append(f"ledger {lid}: ensemble {list(ens)} on one rack")
                if not md.is_closed or md.last_entry_id != entries - 1:
                    problems.append(f"ledger {lid}: closed={md.is_closed} "
                                    f"last_entry={md.last_entry_id}, expected {entries - 1}")
                    continue
                rh = bk.open_ledger(lid, recovery=False)
                got: list = []
                for lo in range(0, entries, 500):
                    got.extend(e.payload for e in rh.read(lo, min(entries - 1, lo + 499)))
                m = re.match(rb"ledger (\d+) entry 0\|", got[0] if got else b"")
                want = expected.get(int(m.group(1))) if m else None
                if got != want:
                    problems.append(f"ledger {lid}: read back differs from what the job wrote")
                rows += len(got)
        finally:
            bk.close()
        print(f"  independently read back {rows} entries of {n_ledgers * entries}: "
              + ("every one identical" if not problems else "PROBLEMS"), flush=True)
        return problems

    def _note_replacements(self, lid: int, md) -> None:
        """Timeline events for the ensemble changes (who replaced whom, from which entry)."""
        pairs = list(zip(md.ensembles, md.ensembles[1:]))
        if self.seen is not None and self.seen[0] == lid:
            # an ensemble that had no entry yet is replaced in place (same first entry)
            _, first, ens = self.seen
            now = dict(md.ensembles).get(first)
            if now is not None and tuple(now) != tuple(ens):
                pairs.insert(0, ((first, ens), (first, now)))
        for (_, old), (first, new) in pairs:
            for gone, came in zip(old, new):
                if gone != came:
                    self.tl.event(gone, f"replaced by {came} in ledger {lid} from entry {first} "
                                  "(seen in the ledger's metadata after the job)")

    def final_figures(self) -> None:
        for bid, b in self.cluster.bookies.items():
            if bid != self.victim:
                self.tl.figure(bid, "entries acked", bookie_entries(b.host.address))


def _arg(args: list[str], flag: str, default) -> str:
    return args[args.index(flag) + 1] if flag in args else str(default)


def _rack_summary() -> str:
    out: dict[str, list[str]] = {}
    for bid, rack in RACKS.items():
        out.setdefault(rack, []).append(bid.split("-")[1])
    return ", ".join(f"{rack}: {'+'.join(ids)}" for rack, ids in out.items())


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m pybk_spark.commands.demo_cluster",
                                 description=__doc__.splitlines()[0])
    ap.add_argument("--keep-data", action="store_true", help="do not delete the temp data dir")
    ap.add_argument("--timeout", type=float, default=JOB_TIMEOUT_S)
    ap.add_argument("--seed", type=int, default=None)
    ap.add_argument("job_args", nargs="*", help="extra arguments for jobs/demo.py (after --)")
    args = ap.parse_args(argv)
    missing = missing_requirement()
    if missing:
        print(f"demo-cluster: FAILED: cannot run here: {missing}", flush=True)
        return 2
    seed = args.seed if args.seed is not None else random.SystemRandom().randrange(2**32)
    data_dir = Path(tempfile.mkdtemp(prefix="pybk-demo-cluster-"))
    demo = Demo(data_dir, JOB_ARGS + args.job_args, args.timeout, seed)
    reason, t0 = None, time.monotonic()
    try:
        with HostNetwork() as net:
            try:
                stdout = demo.run(net)
                demo.say("job passed; verifying independently with a fresh client")
                problems = demo.verify(stdout)
                if problems:
                    reason = "; ".join(problems)
                demo.final_figures()
            finally:
                demo.say("tearing down")
                if demo.spark is not None:
                    demo.spark.close()
                if demo.cluster is not None:
                    demo.cluster.close()
        print(demo.tl.format(), flush=True)
    except DemoFailed as exc:
        reason = str(exc)
        print(demo.tl.format(), flush=True)
    except KeyboardInterrupt:
        reason = "interrupted; everything stopped"
    except Exception as exc:  # noqa: BLE001 - the command's top level: any launcher failure, one line
        reason = f"{type(exc).__name__}: " + (str(exc).splitlines() or [""])[0]
        print(f"demo-cluster: {exc}", file=sys.stderr, flush=True)
    finally:
        if args.keep_data:
            print(f"demo-cluster: data kept in {data_dir}")
        else:
            shutil.rmtree(data_dir, ignore_errors=True)
    wall = time.monotonic() - t0
    if reason:
        print(f"demo-cluster: FAILED after {wall:.0f} s: {reason}", flush=True)
        return 1
    print(f"demo-cluster: PASSED in {wall:.0f} s (seed {seed}): bookie {demo.victim} and etcd "
          f"leader {demo.killed_etcd} killed "
          f"{'mid-write' if demo.mid_write else 'after the writes'}, every row verified", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
