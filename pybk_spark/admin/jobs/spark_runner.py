"""Run admin tasks as Spark tasks (used by jobs/recover_ledgers.py and
jobs/rereplicate.py): one partition per item, results collected on the
driver, a progress line on stderr from Spark's status tracker.

The SparkSession is created only when there is work, so a no-op run (e.g.
a second recovery pass) costs no Spark start-up.  Spark's own log level is
WARN unless ``--verbose`` (``spark.log.level``, set when the session is
built: only the 3 lines Spark logs before it reads its conf stay), and under
spark-submit the driver's stderr is moved off stdout first (job_output.py),
so stdout holds the report alone: exactly one JSON document with ``--json``.
"""
from __future__ import annotations

import argparse
import json
import sys
import threading
from typing import TYPE_CHECKING, Any, Callable, Optional, Sequence

from pybk_spark import errors
from pybk_spark.admin.jobs.job_output import separate_stderr
from pybk_spark.ledger.client import BookKeeper
from pybk_spark.ledger.port import LedgerClient

if TYPE_CHECKING:
    from pyspark import SparkContext
    from pyspark.sql import SparkSession

# a job's work on the driver: (client, mapper) -> (report, text, exit status)
JobBody = Callable[[LedgerClient, "SparkMapper"], tuple[dict, str, int]]


class SparkMapper:
    def __init__(self, app_name: str, progress: bool = True, verbose: bool = False) -> None:
        self.app_name = app_name
        self.progress = progress
        self.verbose = verbose
        self._spark: Optional[SparkSession] = None

    @property
    def spark(self) -> SparkSession:
        if self._spark is None:
            self._spark = job_session(self.app_name, self.verbose)
        return self._spark

    def warm_up(self) -> None:
        """Start the session and a Python worker, so timings of the real work
        (the MB/s figure) exclude Spark start-up."""
        self.spark.sparkContext.parallelize([0], 1).map(lambda x: x).collect()

    def __call__(self, task: Callable[[Any], Any], items: Sequence[Any], label: str,
                 one_per_task: bool = True) -> list:
        """One Spark task per item, or (``one_per_task=False``, for many small
        items such as per-ledger verification) items grouped into about
        2 x defaultParallelism tasks."""
        if not items:
            return []
        sc = self.spark.sparkContext
        parts = len(items) if one_per_task else min(len(items),
                                                    max(2, 2 * sc.defaultParallelism))
        sc.setJobDescription(f"{self.app_name}: {label} ({len(items)} tasks)")
        stop = threading.Event()
        watcher = None
        if self.progress:
            watcher = threading.Thread(target=self._watch, args=(sc, label, parts, stop),
                                       daemon=True)
            watcher.start()
        try:
            return sc.parallelize(list(items), parts).map(task).collect()
        finally:
            stop.set()
            if watcher is not None:
                watcher.join(timeout=2)
            print(f"{label}: {parts}/{parts} tasks done ({len(items)} items)", file=sys.stderr,
                  flush=True)

    @staticmethod
    def _watch(sc: SparkContext, label: str, total: int, stop: threading.Event) -> None:
        last: Optional[int] = None
        while not stop.wait(1.0):
            try:
                tracker = sc.statusTracker()
                done = 0
                for sid in tracker.getActiveStageIds():
                    info = tracker.getStageInfo(sid)
                    if info is not None:
                        done += info.numCompletedTasks
            except Exception:  # noqa: BLE001 - progress is best effort
                return
            if done != last:
                last = done
                print(f"{label}: {done}/{total} tasks done", file=sys.stderr, flush=True)

    def stop(self) -> None:
        if self._spark is not None:
            self._spark.stop()
            self._spark = None


def job_session(app_name: str, verbose: bool = False) -> SparkSession:
    """The SparkSession of a job: Spark logs at WARN unless ``verbose``."""
    from pyspark.sql import SparkSession   # why: pyspark is imported only by a run that has work
    builder = SparkSession.builder.appName(app_name)
    if not verbose:
        builder = builder.config("spark.log.level", "WARN")
    return builder.getOrCreate()


def run_job(prog: str, app_name: str, metadata_uri: str, as_json: bool, body: JobBody,
            verbose: bool = False, client_conf: str | None = None) -> int:
    """The shared driver of the spark-submit jobs: a SparkMapper and a client,
    ``body(bk, mapper) -> (report, text, status)``, typed errors -> exit 2,
    the report as text or JSON (for a typed error the document ``pybk --json``
    prints: ``{"error", "code", "message", "outcome_known"}``), the job's status as exit code.
    ``client_conf``: a client.conf path (TLS files, ``operator = true``); the
    tasks open their clients with the same settings."""
    separate_stderr(as_json)
    mapper = SparkMapper(app_name, verbose=verbose)
    try:
        with BookKeeper(metadata_uri, conf=client_conf, background=False) as bk:
            report, text, status = body(bk, mapper)
    except errors.BKError as exc:
        if as_json:                       # the same document as `pybk --json`
            print(json.dumps({"error": type(exc).__name__, "code": exc.code,
                              "message": str(exc), "outcome_known": exc.outcome_known}),
                  flush=True)
        else:
            print(f"{prog}: {type(exc).__name__}: {exc}", file=sys.stderr, flush=True)
        return 2
    finally:
        mapper.stop()
    print(json.dumps(report, sort_keys=True, default=str) if as_json else text, flush=True)
    return status


def job_arguments(prog: str, doc: str, add_own: Callable[[argparse.ArgumentParser], None],
                  argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
    """The command line of a spark-submit job: ``--metadata-uri`` and
    ``--client-conf``, the job's own options (``add_own``), then
    ``--password``, ``--json`` and ``--verbose``; ``args.password`` as bytes
    (or None)."""
    p = argparse.ArgumentParser(prog=prog, description=doc.splitlines()[0])
    p.add_argument("--metadata-uri", required=True)
    p.add_argument("--client-conf", default=None,
                   help="client conf file: TLS files and operator = true (conf/client.conf)")
    add_own(p)
    p.add_argument("--password", default=None)
    p.add_argument("--json", action="store_true",
                   help="stdout: exactly one JSON document (progress goes to stderr)")
    p.add_argument("--verbose", action="store_true", help="Spark's INFO log lines too")
    args = p.parse_args(argv)
    args.password = None if args.password is None else args.password.encode()
    return args
