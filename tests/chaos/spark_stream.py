"""The chaos run's Spark workload: a streaming query per source log, bookkeeper
source -> bookkeeper exactly-once sink, in one in-process ``local[2]``
SparkSession (its own test host on the host topology, like every worker).

    python -m tests.chaos.spark_stream --uri URI --hist FILE --proc NAME
        --seed S --until EPOCH --logs a,b --workdir DIR --catchup FILE
        --result FILE

* Until ``--until``: for each log L in ``--logs`` a query reads L (raw:
  ``ledger_id, entry_id, payload``) and writes it to the log ``L-sink``
  through the exactly-once sink, checkpoint ``DIR/ckpt-L``, a micro-batch
  every 5 s, one task (one sink
  ledger) per micro-batch.  A query that fails (a task that exhausted its attempts under a
  fault, an etcd CAS that could not be made) is restarted from its
  checkpoint: the replay is what the exactly-once sink must absorb.  Each
  restart is a history note (``spark_restart``).
* Then it stops the queries and waits for the runner to create
  ``--catchup`` (written after the cluster healed and every ledger was
  recovered, so every source segment is CLOSED), runs each query once more
  with ``trigger(availableNow=True)`` from the same checkpoint (it catches
  up), then writes ``--result`` (``{"catchup_attempts": {L: n}}``).  The
  runner reads every ``L-sink`` with the client (``checker.read_sink``) and
  compares it with the source log's final contents (``check_sink``, I8):
  every source entry exactly once, byte-identical, nothing else.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
import traceback

from .history import History

TRIGGER = "5 seconds"
CATCHUP_WAIT_S = 1800.0


def fast_spark_home(workdir: str) -> str:
    """A SPARK_HOME for this JVM whose entries link to the pyspark package's,
    except ``python/``: Spark puts ``$SPARK_HOME/python/lib/pyspark.zip``
    first on its Python workers' path, and that zip holds no ``.pyc``, so
    every worker (a streaming source's runner, a task) compiles pyspark from
    source before it connects back; on an overloaded machine that outlasts
    Spark's hard-coded 10 s.  Without the zip the workers import the
    installed, compiled pyspark (the same version)."""
    import pyspark
    real = os.path.dirname(pyspark.__file__)
    home = os.path.join(workdir, "spark-home")
    os.makedirs(home, exist_ok=True)
    for name in os.listdir(real):
        link = os.path.join(home, name)
        if name != "python" and not os.path.lexists(link):
            os.symlink(os.path.join(real, name), link)
    return home


def _session(workdir: str):
    os.environ["SPARK_HOME"] = fast_spark_home(workdir)
    # Spark's Python workers (the data source lookup among them) must be this
    # interpreter: with the default `python3` from PATH, `format("bookkeeper")`
    # is not found when the runner was started outside `make chaos`
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from pyspark.sql import SparkSession
    return (SparkSession.builder.master("local[2,4]")      # 4 attempts per task
            .appName("pybk-chaos-stream")
            .config("spark.ui.enabled", "false")
            .config("spark.sql.shuffle.partitions", "2")
            .config("spark.driver.memory", "768m")
            .config("spark.sql.streaming.stopTimeout", "60s")
            .getOrCreate())


def _log_exists(uri: str, log: str) -> bool:
    from pybk_spark.metadata import open_store
    store = open_store(uri)
    try:
        return store.get(f"logs/{log}") is not None
    except Exception:  # noqa: BLE001 - etcd cut off or restarting
        return False
    finally:
        store.close()


def _start(spark, uri: str, log: str, ckpt: str, available_now: bool = False):
    w = (spark.readStream.format("bookkeeper").option("metadataServiceUri", uri)
         .option("log", log).option("maxEntriesPerTrigger", "5000").load()
         .coalesce(1)                # one sink ledger per micro-batch
         .writeStream.format("bookkeeper").option("metadataServiceUri", uri)
         .option("log", f"{log}-sink").option("checkpointLocation", ckpt)
         .queryName(f"chaos-{log}"))
    w = w.trigger(availableNow=True) if available_now else w.trigger(processingTime=TRIGGER)
    return w.start()


def _error_name(exc: BaseException | None) -> str:
    text = str(exc or "")
    if "failed to connect back" in text:     # Spark's hard-coded 10 s, an overloaded host
        return "PythonWorkerConnectBack"
    for name in ("LedgerFenced", "MetadataUnavailable", "BookieUnavailable", "Timeout",
                 "NotEnoughBookies", "BadVersion", "LogTruncated"):
        if name in text:
            return name
    return type(exc).__name__ if exc is not None else "stopped"


def stream(uri: str, hist: History, until: float, logs: list[str], workdir: str) -> None:
    spark = _session(workdir)
    queries: dict[str, object] = {}
    while time.time() < until:
        for log in logs:
            q = queries.get(log)
            if q is not None and q.isActive:
                continue
            if q is not None:
                exc = q.exception()
                hist.note("spark_restart", log=log, error=_error_name(exc))
                print(f"spark: query on {log} ended: {str(exc)[:500]}", flush=True)
            if not _log_exists(uri, log):
                continue
            try:
                queries[log] = _start(spark, uri, log, os.path.join(workdir, f"ckpt-{log}"))
                hist.note("spark_start", log=log)
            except Exception as exc:  # noqa: BLE001 - start needs etcd (schema, sink prep)
                hist.note("spark_restart", log=log, error=_error_name(exc))
                print(f"spark: start on {log} failed: {exc!r}"[:500], flush=True)
        time.sleep(1.0)
    for log, q in queries.items():
        try:
            q.stop()
        except Exception as exc:  # noqa: BLE001
            print(f"spark: stop of {log}: {exc!r}"[:500], flush=True)
    return spark


def catch_up(spark, uri: str, hist: History, logs: list[str], workdir: str,
             catchup: str, result: str) -> None:
    deadline = time.time() + CATCHUP_WAIT_S
    while not os.path.exists(catchup):
        if time.time() > deadline:
            raise RuntimeError(f"no {catchup} after {CATCHUP_WAIT_S}s")
        time.sleep(0.5)
    out: dict = {"catchup_attempts": {}}
    for log in logs:
        if not _log_exists(uri, log):
            continue
        attempt = 0
        while True:
            attempt += 1
            try:
                q = _start(spark, uri, log, os.path.join(workdir, f"ckpt-{log}"),
                           available_now=True)
                q.awaitTermination()
                break
            except Exception as exc:  # noqa: BLE001 - restart from the checkpoint
                hist.note("spark_restart", log=log, error=_error_name(exc), catchup=True)
                print(f"spark: catch-up of {log} attempt {attempt}: {str(exc)[:300]}",
                      flush=True)
                if time.time() > deadline:
                    raise
                time.sleep(min(30.0, 2.0 * attempt))
        out["catchup_attempts"][log] = attempt
    tmp = result + ".tmp"
    with open(tmp, "w") as fh:
        json.dump(out, fh)
    os.replace(tmp, result)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="tests.chaos.spark_stream")
    for name in ("--uri", "--hist", "--proc", "--workdir", "--catchup", "--result", "--logs"):
        p.add_argument(name, required=True)
    p.add_argument("--seed", type=int, required=True)     # nothing random here: for symmetry
    p.add_argument("--until", type=float, required=True)
    a = p.parse_args(argv)
    os.makedirs(a.workdir, exist_ok=True)
    hist = History(a.hist, a.proc)
    logs = [x for x in a.logs.split(",") if x]
    try:
        spark = stream(a.uri, hist, a.until, logs, a.workdir)
        catch_up(spark, a.uri, hist, logs, a.workdir, a.catchup, a.result)
        spark.stop()
    except Exception:  # noqa: BLE001 - the runner reports a missing result
        traceback.print_exc()
        hist.note("spark_failed")
        return 1
    finally:
        hist.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
