"""One local SparkSession for all Spark tests (a session costs ~5 s to start)."""
import os
import sys

import pytest


def spark_env() -> dict:
    """Environment for Spark processes: workers must run this venv's Python."""
    return {"PYSPARK_PYTHON": sys.executable, "PYSPARK_DRIVER_PYTHON": sys.executable,
            "SPARK_LOCAL_IP": "127.0.0.1"}


@pytest.fixture(scope="session")
def spark():
    os.environ.update(spark_env())
    from pyspark.sql import SparkSession
    session = (SparkSession.builder
               .master("local[2,2]")          # 2 cores, a failed task is retried once
               .appName("pybk-spark-tests")
               .config("spark.ui.enabled", "false")
               .config("spark.sql.shuffle.partitions", "2")
               .config("spark.driver.host", "127.0.0.1")
               .config("spark.driver.bindAddress", "127.0.0.1")
               .config("spark.python.worker.reuse", "true")
               .getOrCreate())
    session.sparkContext.setLogLevel("ERROR")
    try:
        yield session
    finally:
        session.stop()


@pytest.fixture(scope="session")
def metadata_uri(cluster):
    """The shared real cluster's URI (etcd + 3 bookie-server processes)."""
    return cluster.metadata_uri


@pytest.fixture(scope="module")
def bk(metadata_uri):
    from pybk_spark import BookKeeper
    client = BookKeeper(metadata_uri)
    try:
        yield client
    finally:
        client.close()
