"""What a Spark Python worker imports to register and plan the
``bookkeeper`` source: never gRPC, the etcd client or the ledger client.
Spark imports ``pyspark_bookkeeper`` in workers that only list data sources
or ask for a schema; the first task (or planning step) that needs a client
imports them (spark/client_cache.py, ``new_client``)."""
import json
import subprocess
import sys

HEAVY = ("grpc", "pyetcd", "pybk_spark.ledger.client", "pybk_spark.transport.grpc_bookie",
         "pybk_spark.metadata.etcd_store")


def _imported_after(code: str) -> list[str]:
    probe = (code + "\nimport json, sys\n"
             f"print(json.dumps(sorted(m for m in {HEAVY!r} if m in sys.modules)))")
    out = subprocess.run([sys.executable, "-c", probe], check=True, capture_output=True,
                         text=True, timeout=300)
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_registering_the_source_imports_no_grpc_etcd_or_ledger_client():
    assert _imported_after("import pyspark_bookkeeper") == []


def test_load_of_raw_ledgers_imports_no_grpc_etcd_or_ledger_client():
    code = ("from pyspark_bookkeeper import DefaultSource\n"
            "source = DefaultSource({'metadataServiceUri': 'etcd://127.0.0.1:1/x', "
            "'ledgers': '1,2'})\n"
            "assert [f.name for f in source.schema().fields][:2] == ['ledger_id', 'entry_id']")
    assert _imported_after(code) == []


def test_a_task_imports_the_client():
    code = ("from pybk_spark.spark.client_cache import new_client\n"
            "try:\n    new_client('memory://startup-probe')\nexcept Exception:\n    pass")
    assert "pybk_spark.ledger.client" in _imported_after(code)
