"""``orchestrate.local_mapper``: the in-process mapper of the operator jobs
(``pybk recover`` / ``rereplicate`` / ``decommission`` / ``autorecovery``)
runs ``parallel`` items at once and returns the results in item order."""
import threading

import pytest

from pybk_spark.admin.operations import orchestrate as orch


def test_results_come_back_in_item_order_whatever_finishes_first():
    release = {i: threading.Event() for i in range(5)}

    def task(i):
        release[i].wait(10)
        if i:                       # each item lets the one before it finish
            release[i - 1].set()
        return {"ledger": i, "outcome": "replicated"}

    release[4].set()                # the last item finishes first
    got = orch.local_mapper(progress=False, parallel=5)(task, range(5), "copy")
    assert [r["ledger"] for r in got] == [0, 1, 2, 3, 4]


def test_parallel_items_run_at_once_and_one_runs_them_in_turn():
    barrier = threading.Barrier(3, timeout=10)
    got = orch.local_mapper(progress=False, parallel=3)(lambda i: barrier.wait() >= 0,
                                                        [1, 2, 3], "copy")
    assert got == [True, True, True]        # a sequential mapper would break the barrier

    seen: list[int] = []
    running = threading.Lock()

    def alone(i):
        assert running.acquire(blocking=False), "two items at once"
        seen.append(i)
        running.release()
        return i

    assert orch.local_mapper(progress=False)(alone, [3, 1, 2], "copy") == [3, 1, 2]
    assert seen == [3, 1, 2]


def test_a_task_that_raises_is_raised_to_the_caller():
    def task(i):
        if i == 2:
            raise RuntimeError("boom")
        return i

    with pytest.raises(RuntimeError, match="boom"):
        orch.local_mapper(progress=False, parallel=2)(task, [1, 2, 3], "copy")


def test_parallel_below_one_is_refused_by_name():
    with pytest.raises(ValueError, match="parallel must be >= 1"):
        orch.local_mapper(parallel=0)


def test_the_shell_refuses_a_bad_parallel_naming_it(capsys):
    from pybk_spark.commands import cli
    with pytest.raises(SystemExit) as exc:
        cli.main(["rereplicate", "--metadata-uri", "etcd://127.0.0.1:1/x", "--parallel", "0"])
    assert exc.value.code == 2
    assert "--parallel: must be >= 1, not 0" in capsys.readouterr().err
