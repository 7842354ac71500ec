"""One password per log, on a real cluster (etcd + bookie-server processes):
a writer with another password is refused before it writes anything; a
log written before the password was recorded adopts the one that opens its
newest ledger; a log whose segments were written under different passwords
(by older writers) stays readable with every one of them."""
import uuid

import pytest

from pybk_spark import BookKeeper, errors
from pybk_spark.logs.log import read_log, read_or_create_log, update_log
from pybk_spark.logs.log_writer import LogWriter
from pybk_spark.logs.log_reader import LogReader
from pybk_spark.metadata.store import log_key
from pybk_spark.protocol import log_metadata as logmd
from pybk_spark.protocol.ledger_metadata import key_check

pytestmark = pytest.mark.slow


@pytest.fixture
def bk(cluster, fresh_scope):
    client = BookKeeper(fresh_scope)
    yield client
    client.close()


def log_name(tag):
    return f"{tag}-{uuid.uuid4().hex[:8]}"


def snapshot(bk, name):
    """What a refused writer must leave as it was: the ledgers and the log's value."""
    got = bk.metadata_store.get(log_key(name))
    return set(bk.list_ledgers()), (got.value, got.version)


def legacy_log(bk, name, passwords):
    """A log as older writers left it: one closed segment per password, each
    ledger written under it, and no password recorded in the log."""
    read_or_create_log(bk.metadata_store, name, bk.rng)
    segments = []
    for i, password in enumerate(passwords):
        lh = bk.create_ledger(ensemble=3, write_quorum=2, ack_quorum=2, password=password,
                              custom_metadata={"log": name})
        payloads = [f"{i}-{k}".encode() for k in range(3)]
        lh.add_entries(payloads)
        lh.close()
        segments.append((lh.ledger_id, len(payloads), sum(map(len, payloads)), -1))
    update_log(bk.metadata_store, name, lambda m: logmd.append_closed(m, segments)[0])
    md, _ = read_log(bk.metadata_store, name)
    assert md.password_check == ""
    return [f"{i}-{k}".encode() for i in range(len(passwords)) for k in range(3)]


def test_log_writer_with_another_password_is_refused_before_writing(bk):
    name = log_name("pw-writer")
    with LogWriter(bk, name, password=b"pw1").open() as w:
        w.append(b"first")
    md, _ = read_log(bk.metadata_store, name)
    assert md.password_check == key_check(b"pw1")
    before = snapshot(bk, name)
    with pytest.raises(errors.Unauthorized, match=f"wrong password for log '{name}'"):
        LogWriter(bk, name, password=b"pw2").open()
    assert snapshot(bk, name) == before          # no ledger created, nothing fenced or changed
    with LogWriter(bk, name, password=b"pw1").open() as w:
        w.append(b"second")
    with LogReader(bk, name, password=b"pw1") as reader:
        assert [r.payload for r in reader.read_available()] == [b"first", b"second"]


def test_a_new_log_records_its_first_writers_password(bk):
    name = log_name("pw-new")
    LogWriter(bk, name).open().close()              # no password: the empty one is the log's
    with pytest.raises(errors.Unauthorized, match=name):
        LogWriter(bk, name, password=b"pw").open()


def test_log_without_a_recorded_password_adopts_the_one_of_its_newest_ledger(bk):
    name = log_name("pw-legacy")
    payloads = legacy_log(bk, name, [b"pw1"])
    before = snapshot(bk, name)
    with pytest.raises(errors.Unauthorized, match="does not open the log's newest ledger"):
        LogWriter(bk, name, password=b"pw2").open()
    assert snapshot(bk, name) == before
    with LogWriter(bk, name, password=b"pw1").open() as w:
        w.append(b"new")
    md, _ = read_log(bk.metadata_store, name)
    assert md.password_check == key_check(b"pw1")
    with LogReader(bk, name, password=b"pw1") as reader:
        assert [r.payload for r in reader.read_available()] == payloads + [b"new"]


def test_mixed_password_log_stays_readable_with_every_password(bk):
    name = log_name("pw-mixed")
    payloads = legacy_log(bk, name, [b"pw1", b"pw2", b"pw1"])
    with pytest.raises(errors.Unauthorized, match="wrong password for ledger"):
        with LogReader(bk, name, password=b"pw1") as reader:
            reader.read_available()
    with LogReader(bk, name, password=b"pw1", other_passwords=[b"pw2"]) as reader:
        assert [r.payload for r in reader.read_available()] == payloads
    # the newest segment decides which password later writers use
    with pytest.raises(errors.Unauthorized, match=name):
        LogWriter(bk, name, password=b"pw2").open()
    with LogWriter(bk, name, password=b"pw1").open() as w:
        w.append(b"after")
    with LogReader(bk, name, password=b"pw2", other_passwords=[b"pw1"]) as reader:
        assert [r.payload for r in reader.read_available()] == payloads + [b"after"]
