"""A log CAS whose outcome is unknown (etcd went away after applying it) must
never lead to deleting a ledger the log may now list (chaos seed 12002: a
roll's CAS landed, its reply was lost, the writer deleted the new ledger, and
every reader of the log then failed with NoSuchLedger at that segment).  In-
memory store and bookies; the store's CAS on the log key applies the change
and then raises MetadataUnavailable, as a lost etcd reply does."""
import json
import random

import pytest

from pybk_spark import errors
from pybk_spark.ledger.client import BookKeeper
from pybk_spark.logs.log import read_log
from pybk_spark.logs.log_writer import LogWriter, RollPolicy
from pybk_spark.logs.log_reader import LogReader
from pybk_spark.metadata.memory_store import MemoryMetadataStore
from pybk_spark.metadata.store import ledger_key
from pybk_spark.protocol import log_metadata as logmd
from pybk_spark.transport.memory import MemoryTransportPool


class LostReplyStore(MemoryMetadataStore):
    """``lose_next_log_reply``: the next CAS of a log key applies, then raises."""

    def __init__(self):
        super().__init__()
        self.lose_next_log_reply = False

    def compare_and_swap(self, key, value, expected_version, *a, **k):
        out = super().compare_and_swap(key, value, expected_version, *a, **k)
        if self.lose_next_log_reply and key.startswith("logs/"):
            self.lose_next_log_reply = False
            raise errors.MetadataUnavailable("etcd went away (reply lost)")
        return out


@pytest.fixture
def bk():
    store, pool = LostReplyStore(), MemoryTransportPool()
    for i in range(3):
        pool.add_bookie(f"b{i}")
        store.put(f"bookies/writable/b{i}", json.dumps({"bookie_id": f"b{i}", "address": "",
                                                          "rack": ""}).encode())
    client = BookKeeper(store=store, transports=pool, rng=random.Random(7), background=False)
    yield client
    client.close()


def _read_all(bk, name):
    with LogReader(bk, name, poll_timeout_s=0) as reader:
        return [r.payload for r in reader.read_available()]


def test_a_roll_whose_cas_reply_was_lost_keeps_its_ledger(bk):
    w = LogWriter(bk, "lost", roll_policy=RollPolicy(max_entries=3)).open()
    for i in range(3):
        w.append(b"a%d" % i)
    bk.metadata_store.lose_next_log_reply = True
    with pytest.raises(errors.BKError) as info:
        w.append(b"a3")                           # rolls first: the CAS lands, its reply is lost
    assert not info.value.outcome_known
    md, _ = read_log(bk.metadata_store, "lost")
    new_id = md.segments[-1].ledger_id
    assert bk.metadata_store.get(ledger_key(new_id)) is not None   # listed and not deleted
    with pytest.raises(errors.BKError):           # this writer stops: a reopen recovers
        w.append(b"never")
    w2 = LogWriter(bk, "lost").open()
    w2.append(b"b0")
    w2.close()
    assert _read_all(bk, "lost") == [b"a0", b"a1", b"a2", b"b0"]


def test_a_listed_ledger_deleted_by_an_older_writer_is_healed_by_the_next_leader(bk):
    w = LogWriter(bk, "healed").open()
    w.append(b"x0")
    w.roll()
    md, _ = read_log(bk.metadata_store, "healed")
    gone = md.segments[-1].ledger_id
    bk.metadata_store.delete(ledger_key(gone))    # the damage the old writer code left
    w2 = LogWriter(bk, "healed").open()           # recovers the tail: the gone ledger is empty
    w2.append(b"y0")
    w2.close()
    md, _ = read_log(bk.metadata_store, "healed")
    seg = md.segments[md.segment_index(gone)]
    assert (seg.state, seg.entry_count) == (logmd.SEGMENT_CLOSED, 0)
    assert _read_all(bk, "healed") == [b"x0", b"y0"]
