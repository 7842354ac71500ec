"""The Python workers that plan and commit (a write's ``writer()`` and
commit, a read's schema and partitions) freeze their long-lived objects out
of the cyclic garbage collector before they open a store or a client, as
the task workers do: Spark's worker daemon runs a full ``gc.collect()``
after every task (spark/client_cache.py ``freeze_long_lived_objects``)."""
import subprocess
import sys


def _freeze_count_after(code: str) -> int:
    probe = code + "\nimport gc\nprint(gc.get_freeze_count())"
    out = subprocess.run([sys.executable, "-c", probe], check=True, capture_output=True,
                         text=True, timeout=300)
    return int(out.stdout.strip().splitlines()[-1])


def test_nothing_is_frozen_by_importing_the_source():
    assert _freeze_count_after("import pyspark_bookkeeper") == 0


def test_a_planning_workers_store_freezes_what_is_loaded():
    code = ("from pybk_spark.spark.client_cache import worker_store\n"
            "worker_store('memory://gc-probe').close()")
    assert _freeze_count_after(code) > 0


def test_a_committing_workers_client_freezes_what_is_loaded():
    code = ("from pybk_spark.spark.client_cache import new_client\n"
            "try:\n    new_client('memory://gc-probe').close()\nexcept Exception:\n    pass")
    assert _freeze_count_after(code) > 0


def test_a_task_workers_cached_client_is_frozen_with_it():
    code = ("import gc\n"
            "from pybk_spark.spark.client_cache import worker_client\n"
            "bk = worker_client('memory://gc-probe')\n"
            "assert not any(o is bk for o in gc.get_objects())\n")
    assert _freeze_count_after(code) > 0


def test_a_dropped_client_is_collected_and_the_next_one_frozen():
    """A failed task drops the worker's client (reader.py, writer.py): the
    frozen client must not stay in memory for the worker's life."""
    code = ("import gc, weakref\n"
            "from pybk_spark.spark.client_cache import drop_client, worker_client\n"
            "ref = weakref.ref(worker_client('memory://gc-probe'))\n"
            "drop_client('memory://gc-probe')\n"
            "gc.collect()\n"
            "assert ref() is None, 'the dropped client is still alive'\n"
            "bk = worker_client('memory://gc-probe')\n"
            "assert not any(o is bk for o in gc.get_objects())\n")
    assert _freeze_count_after(code) > 0
