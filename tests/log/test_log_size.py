"""A log is one etcd value: past etcd's request limit its next change is
refused, with the log, its size and the way out named (docs/operations.md,
"Log size"); a warning comes first."""
from __future__ import annotations

import logging

import pytest

from pybk_spark import errors
from pybk_spark.logs.log import read_log, read_or_create_log, update_log
from pybk_spark.metadata.memory_store import MemoryMetadataStore
from pybk_spark.protocol import log_metadata as logmd
from pybk_spark.testing.fixtures import unique_scope


def _append(store, first: int, n: int):
    ledgers = [(lid, 10, 1_000_000, 10_000) for lid in range(first, first + n)]
    times = {lid: (1_764_200_000_000_000 + lid, 1_764_200_000_000_005 + lid) for lid, *_ in ledgers}
    return update_log(store, "events",
                      lambda md: logmd.append_closed(md, ledgers, times=times)[0])


def test_a_log_past_etcds_request_limit_names_itself_and_the_way_out(caplog):
    store = MemoryMetadataStore(unique_scope("logsize"))
    try:
        read_or_create_log(store, "events")
        lid, warned = 1, False
        with caplog.at_level(logging.WARNING, logger="pybk_spark.logs"):
            with pytest.raises(errors.MetadataTooLarge) as info:
                while True:
                    _append(store, lid, 500)
                    lid += 500
                    warned = warned or "event=log_metadata_large" in caplog.text
        text = str(info.value)
        assert "log 'events'" in text and "pybk truncatelog events" in text
        assert info.value.context["segments"] == lid + 499
        assert warned, "a warning before the refusal"
        md, _ = read_log(store, "events")
        assert len(md.segments) == lid - 1, "the refused change wrote nothing"
        assert 7_000 < len(md.segments) < 9_000, len(md.segments)   # ~190 bytes a segment
    finally:
        store.close()
