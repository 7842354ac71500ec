"""Spark 4 auto-discovers top-level ``pyspark_<name>`` modules that expose
``DefaultSource``; this makes ``spark.read.format("bookkeeper")`` work right
after ``pip install`` with no ``spark.dataSource.register`` call."""
from pybk_spark.spark.datasource import BookKeeperDataSource as DefaultSource

__all__ = ["DefaultSource"]
