"""What every ``pybk`` command promises, checked over the registered commands
themselves (enumerated from the parser, so a new command is covered as soon
as it is registered): its ``--help`` says what it writes or that it only
reads; the global flags work before and after it; every read-only command's
``--json`` output is one JSON document, against the shared real cluster.
Plus output into a pipe its reader closed early, through a real process."""
import argparse
import json
import subprocess
import sys
import uuid

import pytest

from admin_helpers import pybk
from pybk_spark.admin.commands.shell_common import READS_ONLY, WRITES
from pybk_spark.commands import cli


def _subparsers() -> dict[str, argparse.ArgumentParser]:
    parser = cli.build_parser()
    [sub] = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    return dict(sub.choices)


def _commands() -> dict:
    return {c.name: c for c in [*cli.COMMANDS, *cli.shell_common.COMMANDS]}


def _global_flags() -> list[argparse.Action]:
    return [a for a in cli.build_parser()._actions
            if a.option_strings and not isinstance(a, argparse._HelpAction)]


def _required_args(parser: argparse.ArgumentParser, values: dict) -> list[str]:
    """The arguments ``parser`` requires, from ``values`` by destination
    (of a required group of alternatives, the first)."""
    out: list[str] = []
    firsts = [g._group_actions[0] for g in parser._mutually_exclusive_groups if g.required]
    for action in parser._actions:
        if (not (action.required or action in firsts)
                or isinstance(action, argparse._SubParsersAction)):
            continue
        if action.dest not in values:
            raise AssertionError(f"give the test a value for {action.dest!r} "
                                 f"(required by pybk {parser.prog})")
        value = str(values[action.dest])
        out += [action.option_strings[0], value] if action.option_strings else [value]
    return out


def test_every_command_help_says_what_it_writes():
    commands = _commands()
    subparsers = _subparsers()
    assert set(subparsers) == set(commands) and len(commands) > 20
    for name in subparsers:
        res = pybk(name, "--help")
        assert res.rc == 0, (name, res.err)
        text = " ".join(res.out.split())
        writes = commands[name].writes
        if writes is None:
            assert READS_ONLY in text and WRITES not in text, (name, res.out)
        else:
            assert WRITES + " ".join(writes.split()) in text, (name, res.out)
    verify = " ".join(pybk("rereplicate", "--help").out.split())
    assert "--verify also writes" in verify and "copy each one short of them" in verify


def test_every_global_flag_works_before_and_after_every_command(tmp_path):
    flags = _global_flags()
    assert {f.option_strings[0] for f in flags} >= {"--json", "--metadata-uri", "--client-conf"}
    parser = cli.build_parser()
    for name, sub in _subparsers().items():
        rest = _required_args(sub, {"ledger_id": 1, "name": "n", "log": "l", "bookie": "b-1",
                                    "bookie_id": "b-1", "data_dir": str(tmp_path),
                                    "before": 1})
        for flag in flags:
            given = [flag.option_strings[0]] + ([] if flag.nargs == 0 else ["etcd://h:1/given"])
            want = True if flag.nargs == 0 else "etcd://h:1/given"
            for argv in ([*given, name, *rest], [name, *rest, *given]):
                got = getattr(parser.parse_args(argv), flag.dest)
                assert got == want, (argv, got)


def test_global_flags_before_the_command_reach_it(uri, tmp_path, monkeypatch):
    monkeypatch.delenv("PYBK_METADATA_URI", raising=False)
    monkeypatch.delenv("PYBK_CLIENT_CONF", raising=False)
    for argv in (["--metadata-uri", uri, "listlogs"], ["listlogs", "--metadata-uri", uri],
                 ["--json", "--metadata-uri", uri, "listlogs"],
                 ["--metadata-uri", uri, "listlogs", "--json"]):
        res = pybk(*argv)
        assert res.rc == 0, (argv, res.err)
        if "--json" in argv:
            assert isinstance(json.loads(res.out), list)
    missing = str(tmp_path / "no-such.conf")
    for argv in (["--client-conf", missing, "--metadata-uri", uri, "listledgers"],
                 ["listledgers", "--metadata-uri", uri, "--client-conf", missing]):
        res = pybk(*argv)
        assert res.rc == 1 and f"cannot read --client-conf {missing}" in res.err, (argv, res.err)


def test_every_read_only_command_prints_one_json_document(uri, cluster, cluster_bk):
    from pybk_spark.logs.log_writer import LogWriter
    lh = cluster_bk.create_ledger(3, 2, 2)
    lh.add_entries([b"one", b"two"])
    lh.close()
    log = f"contract-{uuid.uuid4().hex[:8]}"
    w = LogWriter(cluster_bk, log).open()
    w.append_batch([b"rec0", b"rec1"])
    w.close()
    values = {"ledger_id": lh.ledger_id, "name": log, "log": log,
              "data_dir": cluster.bookie_data_dir(cluster.bookie_ids[0])}
    bounded = {"readjournal": ["--max", "20"]}       # the shared cluster's journal may be long
    read_only = [c for c in _commands().values() if c.writes is None]
    assert {"listbookies", "listledgers", "readlog", "readjournal"} <= {c.name for c in read_only}
    for cmd in read_only:
        rest = _required_args(_subparsers()[cmd.name], values)
        res = pybk("--json", cmd.name, *rest, *bounded.get(cmd.name, []), "--metadata-uri", uri)
        assert res.rc == 0, (cmd.name, res.out, res.err)
        json.loads(res.out)


def _pybk_process(*argv, stdout) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "pybk_spark.commands.cli", *argv],
                            stdout=stdout, stderr=subprocess.PIPE, text=True)


def test_output_into_a_closed_pipe_ends_quietly(uri, cluster_bk):
    for i in range(3):                             # something to print
        cluster_bk.create_ledger(3, 2, 2).close()
    proc = _pybk_process("--json", "listledgers", "--metadata-uri", uri, stdout=subprocess.PIPE)
    proc.stdout.close()                            # the reader is gone before anything is written
    err = proc.stderr.read()
    assert proc.wait(timeout=120) == cli.SIGPIPE_EXIT
    assert err == "", err

    shell = subprocess.run(
        ["bash", "-o", "pipefail", "-c",
         f"{sys.executable} -m pybk_spark.commands.cli --json listledgers --metadata-uri {uri} "
         "| head -c 10"], capture_output=True, text=True, timeout=120)
    assert shell.returncode in (0, cli.SIGPIPE_EXIT) and len(shell.stdout) == 10, shell
    assert "Traceback" not in shell.stderr and "BrokenPipe" not in shell.stderr, shell.stderr


def test_a_misspelt_log_name_gets_did_you_mean(uri, cluster_bk):
    from pybk_spark.logs.log_writer import LogWriter
    name = f"clickstream-{uuid.uuid4().hex[:6]}"
    LogWriter(cluster_bk, name).open().close()
    res = pybk("logmetadata", "--metadata-uri", uri, name.replace("click", "clik"))
    assert res.rc == 1 and "LogNotFound" in res.err, res.err
    assert "did you mean" in res.err and f"'{name}'" in res.err, res.err
    far = pybk("--json", "readlog", "--metadata-uri", uri, "zzzzzzzzzzzzzzzzzzzzzzzzzzzzzz")
    assert far.rc == 1 and far.json()["error"] == "LogNotFound"
    assert "did you mean" not in far.json()["message"]


@pytest.mark.parametrize("given, says", [
    ([], "no password given for a ledger that has one: set the 'password' option"),
    (["--password", "nope"], "wrong password for ledger"),
])
def test_readledger_tells_no_password_from_a_wrong_one(uri, cluster_bk, given, says):
    lh = cluster_bk.create_ledger(3, 2, 2, password=b"secret")
    lh.add_entries([b"a"])
    lh.close()
    res = pybk("readledger", "--metadata-uri", uri, lh.ledger_id, *given)
    assert res.rc == 1 and "Unauthorized" in res.err and says in res.err, res.err
    assert len(res.err.strip().splitlines()) == 1, res.err
