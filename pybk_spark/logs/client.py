"""``BookKeeper`` with named logs: the client ``from pybk_spark import
BookKeeper`` gives.

It is the ledger client (``pybk_spark/ledger/client.py``) plus the ways into
logs, which the ledger layer does not know:

    bk = BookKeeper("etcd://127.0.0.1:2379/pybk")
    w = bk.open_log_writer("events")            # logs/log_writer.py
    r = bk.open_log_reader("events", "earliest")   # logs/log_reader.py
    bk.list_logs()                              # logs/log.py

The same are plain functions over any ``LedgerClient``
(``open_log_writer``, ``LogReader``, ``list_logs``).
"""
from __future__ import annotations

from typing import Any

from pybk_spark.ledger import client
from pybk_spark.logs.log import list_logs
from pybk_spark.logs.log_reader import LogReader, Start
from pybk_spark.logs.log_writer import LogWriter, open_log_writer


class BookKeeper(client.BookKeeper):
    def open_log_writer(self, name: str, **options: Any) -> LogWriter:
        """Become the leader of log ``name`` (the fence-then-CAS open)."""
        return open_log_writer(self, name, **options)

    def open_log_reader(self, name: str, start: Start = "earliest", **options: Any) -> LogReader:
        """A non-fencing reader of log ``name`` from ``start`` ("earliest",
        "latest" or a position)."""
        return LogReader(self, name, start, **options)

    def list_logs(self) -> list[str]:
        return list_logs(self.metadata_store)
