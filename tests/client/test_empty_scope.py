"""A metadata URI naming a scope no bookie ever registered in (a misspelt
scope) is answered with EmptyScope naming the scopes that have bookies, at
every client entry point, against the shared real cluster (etcd + 3
bookie-server processes); commands that only inspect metadata still work
there; a LogWriter whose open fails leaves no log behind.  The etcd store's
``scopes_with`` and the in-memory twin's are checked together in
tests/conformance/test_metadata_store.py."""
import io
import uuid
from contextlib import redirect_stderr, redirect_stdout

import pytest

from pybk_spark import errors
from pybk_spark.commands import cli
from pybk_spark import BookKeeper
from pybk_spark.ledger.placement import writable_bookies
from pybk_spark.logs.log import list_logs, read_log
from pybk_spark.logs.log_writer import LogWriter
from pybk_spark.logs.log_reader import LogReader
from pybk_spark.metadata import parse_uri


@pytest.fixture
def wrong_uri(cluster):
    kind, where, scope = parse_uri(cluster.metadata_uri)
    return f"etcd://{where}/{scope}x{uuid.uuid4().hex[:4]}"


def _expect_empty(info, cluster, wrong_uri) -> None:
    message = str(info.value)
    wrong_scope = parse_uri(wrong_uri)[2]
    assert message.startswith(f"metadata scope {wrong_scope!r} (etcd://"), message
    assert "holds no bookies and no ledgers" in message, message
    assert f"scopes with bookies: {parse_uri(cluster.metadata_uri)[2]!r}" in message, message


def test_the_ledger_client_names_the_empty_scope(cluster, wrong_uri):
    with BookKeeper(wrong_uri) as bk:
        with pytest.raises(errors.EmptyScope) as opened:
            bk.open_ledger(1)
        _expect_empty(opened, cluster, wrong_uri)
        with pytest.raises(errors.EmptyScope) as created:
            bk.create_ledger(3, 2, 2)
        _expect_empty(created, cluster, wrong_uri)
        with pytest.raises(errors.EmptyScope):
            bk.get_ledger_metadata(1)
        assert bk.list_ledgers() == [] and bk.list_logs() == []     # inspecting is allowed


def test_log_writer_and_reader_name_the_empty_scope_and_leave_nothing(cluster, wrong_uri):
    with BookKeeper(wrong_uri) as bk:
        with pytest.raises(errors.EmptyScope) as writing:
            LogWriter(bk, "events").open()
        _expect_empty(writing, cluster, wrong_uri)
        assert list_logs(bk.metadata_store) == []             # no empty log left behind
        with pytest.raises(errors.EmptyScope):
            LogReader(bk, "events", "earliest")
        with pytest.raises(errors.EmptyScope):
            read_log(bk.metadata_store, "events")


def test_a_failed_log_writer_open_leaves_no_log(cluster):
    name = f"never-{uuid.uuid4().hex[:8]}"
    with BookKeeper(cluster.metadata_uri) as bk:
        logs, ledgers = sorted(bk.list_logs()), bk.list_ledgers()
        too_many = len(writable_bookies(bk.metadata_store)) + 1   # the shared cluster may have grown
        with pytest.raises(errors.NotEnoughBookies) as info:
            LogWriter(bk, name, ensemble=too_many, write_quorum=too_many, ack_quorum=2).open()
        assert not isinstance(info.value, errors.EmptyScope)
        assert sorted(bk.list_logs()) == logs
        assert bk.list_ledgers() == ledgers


def _pybk(*argv):
    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        rc = cli.main([str(a) for a in argv])
    return rc, out.getvalue(), err.getvalue()


def test_the_shell_refuses_reads_and_lets_inspection_through(cluster, wrong_uri):
    rc, _, err = _pybk("--metadata-uri", wrong_uri, "ledgermetadata", "1")
    assert rc == 1
    assert err.startswith("pybk ledgermetadata: EmptyScope: metadata scope "), err
    assert "scopes with bookies" in err and err.count("\n") == 1, err
    rc, _, err = _pybk("--metadata-uri", wrong_uri, "readlog", "events")
    assert rc == 1 and "EmptyScope" in err, err
    for command in ("listlogs", "listbookies", "listledgers"):
        rc, _, err = _pybk("--metadata-uri", wrong_uri, command)
        assert rc == 0, (command, err)
