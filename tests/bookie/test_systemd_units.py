"""The systemd units in deploy/systemd/ stay honest: their ExecStart lines use
the flags the test launcher uses (so every host test runs the bookie the way
the unit does), and the programs' own parsers accept them."""
from __future__ import annotations

import configparser
import shlex
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent.parent
UNITS = ROOT / "deploy" / "systemd"


def _exec_start(unit: str) -> list[str]:
    parser = configparser.ConfigParser(interpolation=None, strict=False)
    parser.optionxform = str
    parser.read(UNITS / unit)
    return shlex.split(parser["Service"]["ExecStart"])


def _flags(argv) -> list[str]:
    return [a for a in argv if a.startswith("--")]


def _substitute(argv, values: dict) -> list[str]:
    out = []
    for a in argv:
        for k, v in values.items():
            a = a.replace("${%s}" % k, v)
        assert "${" not in a, f"unset variable in {a!r}"
        out.append(a)
    return out


def test_bookie_unit_runs_the_launchers_command_line():
    from pybk_spark.cluster.host_cluster import bookie_command
    unit = _exec_start("bookie-server.service")
    assert Path(unit[0]).name == "bookie-server"
    launcher = bookie_command("/c", 3181, "0.0.0.0", "10.0.0.5", "/d", "etcd://e:2379/s", "b1")
    assert launcher[1:3] == ["-m", "bookie_server"]          # the console script's module
    assert _flags(unit[1:]) == _flags(launcher[3:])


def test_bookie_unit_flags_parse():
    from bookie_server.__main__ import _parse
    argv = _substitute(_exec_start("bookie-server.service")[1:], {
        "PORT": "3181", "BIND_ADDRESS": "0.0.0.0", "ADVERTISED_ADDRESS": "10.0.0.5",
        "DATA_DIR": "/var/lib/pybk/bookie", "METADATA_URI": "etcd://10.0.0.2:2379/pybk",
        "BOOKIE_ID": "bookie-1"})
    args = _parse(argv)
    assert (args.command, args.bind_address, args.advertised_address, args.port) == \
        ("run", "0.0.0.0", "10.0.0.5", 3181)


def test_autorecovery_unit_flags_parse():
    unit = _exec_start("pybk-autorecovery.service")
    assert Path(unit[0]).name == "pybk" and unit[1] == "autorecovery"
    code = ("import sys; from pybk_spark.commands.cli import build_parser; "
            "a = build_parser().parse_args(sys.argv[1:]); print(a.command, a.metadata_uri)")
    argv = _substitute(unit[1:], {"METADATA_URI": "etcd://10.0.0.2:2379/pybk"})
    out = subprocess.run([sys.executable, "-c", code, *argv], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["autorecovery", "etcd://10.0.0.2:2379/pybk"]


def test_units_refuse_restart_on_exit_2():
    parser = configparser.ConfigParser(interpolation=None, strict=False)
    parser.read(UNITS / "bookie-server.service")
    assert parser["Service"]["RestartPreventExitStatus"] == "2"
