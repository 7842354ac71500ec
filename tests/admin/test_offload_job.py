"""``jobs/offload.py`` through spark-submit on the shared real cluster: one
Spark task per segment stages its files, the driver commits; the log reads
back the same through LogReader."""
import json
import uuid

import pytest

from admin_helpers import spark_submit
from pybk_spark.logs.log import read_log
from pybk_spark.logs.log_writer import LogWriter, RollPolicy
from pybk_spark.logs.log_reader import LogReader

pytestmark = [pytest.mark.slow, pytest.mark.spark]


def test_offload_job_offloads_each_segment_in_its_own_task(uri, cluster_bk, tmp_path):
    log = f"offjob-{uuid.uuid4().hex[:8]}"
    with LogWriter(cluster_bk, log, roll_policy=RollPolicy(max_entries=10)).open() as w:
        for k in range(5):
            w.append_batch([b"j%d" % (k * 10 + i) for i in range(10)])
    res = spark_submit("offload.py", "--metadata-uri", uri, "--log", log, "--location",
                       tmp_path, "--grace-s", "0", "--json")
    assert res.rc == 0, res.out[-3000:] + res.err[-3000:]
    (report,) = json.loads(res.out.strip().splitlines()[-1])["logs"]
    md, _ = read_log(cluster_bk.metadata_store, log)
    assert report["offloaded"] == md.ledger_ids[:-2] == report["ledgers_deleted"]
    assert report["rows"] == 10 * len(report["offloaded"])
    with LogReader(cluster_bk, log) as reader:
        assert [r.payload for r in reader.read_available()] == [b"j%d" % i for i in range(50)]
