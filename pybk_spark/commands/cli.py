"""``pybk``: the operator's shell (``bookkeeper shell`` / ``localbookie`` analogue).

Adding a subcommand: write ``add_arguments(parser)`` and ``run(args) -> int``
and either append ``Command(name, help, add_arguments, run, writes)`` to
``COMMANDS`` below, or call ``shell_common.register(..., writes=...)`` from a
``pybk_spark.admin.commands.shell_*`` module imported below (the import order is the
order of ``pybk --help``).  ``writes`` says what the command changes (None:
it only reads); ``pybk CMD --help`` shows it.

Conventions every subcommand follows:
  * the global flags ``--json``, ``--metadata-uri`` (default
    ``$PYBK_METADATA_URI``) and ``--client-conf`` are accepted before or
    after the command (``shell_common.add_global_flags``);
  * results through ``emit(args, data, text)``: ``pybk --json CMD`` prints the
    data as one JSON document, otherwise the text;
  * failures are ``pybk_spark.errors`` exceptions: ``main`` prints them (JSON
    with code when ``--json``) and exits 1, as it does an ``OSError`` (one
    line naming the file); bad usage exits 2, and so does
    ``standalone`` refused because its data dir is in use;
  * stdout closed by its reader (``pybk ... | head``): ``main`` ends quietly
    with exit status 141, as a process killed by SIGPIPE does.
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import threading
from typing import Any

from pybk_spark import errors
from pybk_spark.admin.commands import shell_common
from pybk_spark.admin.commands.shell_common import Command, emit, open_store_from
from pybk_spark.admin.report import table
from pybk_spark.cluster import certs
from pybk_spark.cluster.local import BookieStartError, LocalCluster
from pybk_spark.cluster.serving import wait_serving
from pybk_spark.config import conf_pairs, load_client_conf
from pybk_spark.metadata import keys
from pybk_spark.transport.tls import ClientTls
# Each registers its subcommands when imported, in this order (that of ``pybk --help``).
from pybk_spark.admin.commands import shell_recovery  # noqa: F401  (the import registers)
from pybk_spark.admin.commands import shell_ledgers  # noqa: F401
from pybk_spark.admin.commands import shell_bookies  # noqa: F401
from pybk_spark.admin.commands import shell_logs  # noqa: F401
from pybk_spark.admin.commands import shell_operator  # noqa: F401
from pybk_spark.admin.commands import shell_offline  # noqa: F401
from pybk_spark.admin.commands import etcd_roles  # noqa: F401
from pybk_spark.admin.commands import shell_positions  # noqa: F401
from pybk_spark.admin.commands import shell_offload  # noqa: F401


# -- standalone ------------------------------------------------------------------------
def _standalone_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--bookies", type=int, default=3, help="number of bookies (default 3)")
    p.add_argument("--data-dir", default="./data/standalone",
                   help="cluster data dir; a restart on it keeps all data")
    p.add_argument("--scope", default="pybk", help="metadata scope (default pybk)")
    p.add_argument("--bookie-conf", help="bookie conf file (default: built-in defaults)")
    p.add_argument("--tls", action="store_true",
                   help="mutual TLS on every bookie port, with a throwaway CA and certificates "
                        "made in DATA_DIR/tls (needs trustme: pip install 'pybk-spark[tls]'); "
                        "prints the client settings to use")


def _standalone(args: argparse.Namespace) -> int:
    """Exit 0 after a clean stop; 2 when refused to start because another
    process runs a cluster on the data dir (one line naming its pid); 1 when
    a child failed to start (its reason and log path on the first line).
    The metadata URI is printed only once etcd and every bookie serve
    (registered and answering on their addresses, cluster/serving.py);
    with ``--json`` it is one JSON document, the only thing on stdout."""
    if args.bookies < 1:
        raise errors.IncorrectParameter("--bookies must be >= 1")
    as_json = getattr(args, "json", False)
    bookie_conf, tls_info = args.bookie_conf, dict[str, Any]()
    if args.tls:
        bookie_conf, tls_info = _standalone_tls(args)
    cluster = LocalCluster(args.data_dir, num_bookies=args.bookies, scope=args.scope,
                           bookie_conf=bookie_conf)
    try:
        cluster.lock()                       # before anything in the dir is touched
    except errors.DataDirInUse as exc:
        print(f"pybk standalone: refusing to start: {exc}", file=sys.stderr, flush=True)
        return 2
    stop = threading.Event()
    status = sys.stderr if as_json else sys.stdout     # --json: stdout holds the document only

    def on_signal(signum, _frame):
        if not stop.is_set():
            stop.set()
            raise KeyboardInterrupt          # also interrupts a start in progress
    previous = {s: signal.signal(s, on_signal) for s in (signal.SIGTERM, signal.SIGINT,
                                                          signal.SIGHUP)}
    rc = 0
    try:
        cluster.start()
        regs = wait_serving(cluster, _probe_tls(tls_info))
        ready = (f"standalone ready: etcd pid={cluster.started_etcd().pid} data_dir={cluster.data_dir} "
                 "(Ctrl-C or SIGTERM to stop)")
        if as_json:
            print(json.dumps(_standalone_document(cluster, regs, tls_info)), flush=True)
        else:
            print(f"metadataServiceUri={cluster.metadata_uri}", flush=True)
            for reg in regs:
                bid = reg["bookie_id"]
                print(f"bookie {bid} {reg['address']} pid={cluster.bookie_pid(bid)}", flush=True)
            for line in _tls_lines(tls_info):
                print(line, flush=True)
        print(ready, file=status, flush=True)
        while not stop.wait(1.0):
            pass
    except KeyboardInterrupt:
        pass
    except BookieStartError as exc:
        print(f"pybk standalone: {str(exc).splitlines()[0]}", file=sys.stderr, flush=True)
        rc = 1
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)    # no second interrupt mid-stop
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        cluster.stop()
        for s, handler in previous.items():
            signal.signal(s, handler)
        print("standalone stopped", file=status, flush=True)
    return rc


def _port(address: str) -> int | None:
    return int(address.rsplit(":", 1)[1]) if address and ":" in address else None


def _standalone_document(cluster, regs: list[dict], tls_info: dict) -> dict:
    """What ``pybk --json standalone`` prints once the cluster serves."""
    bookies = []
    for reg in regs:
        bid, lane = reg["bookie_id"], reg.get("add_lane_address") or ""
        bookies.append({"bookie_id": bid, "address": reg["address"],
                        "port": _port(reg["address"]), "add_lane_address": lane,
                        "lane_port": _port(lane), "metrics_port": reg.get("metrics_port") or None,
                        "state": reg.get("state", "writable"), "pid": cluster.bookie_pid(bid)})
    return {"metadataServiceUri": cluster.metadata_uri,
            "etcd": {"pid": cluster.etcd.pid, "client_port": cluster.etcd.client_port},
            "data_dir": str(cluster.data_dir), "bookies": bookies, "tls": tls_info or None}


def _probe_tls(tls_info: dict):
    """The client TLS the readiness probe connects with (None: plaintext)."""
    if not tls_info:
        return None
    return ClientTls.from_conf(load_client_conf(tls_info["client_conf_file"]))


def _standalone_tls(args: argparse.Namespace) -> tuple[dict, dict[str, Any]]:
    """(bookie conf with TLS on, how clients connect: their conf keys, conf
    files and Spark options)."""
    try:
        files = certs.ensure_cert_files(os.path.join(args.data_dir, "tls"))
    except RuntimeError as exc:               # trustme missing: say how to get it
        raise errors.IncorrectParameter(f"--tls: {exc}") from None
    conf: dict = {}
    if args.bookie_conf:
        # its keys are copied as text: the bookies check them when they start
        with open(args.bookie_conf, encoding="utf-8") as fh:
            conf.update((key, value) for _n, key, value in conf_pairs(fh.read(), _bad_bookie_conf_line))
    conf.update(files.bookie_conf())
    confs = certs.write_client_confs(files)
    client = files.client_conf(certs.WRITER)
    spark = {opt: client[key] for opt, key in (("tls.caFile", "tls_ca_file"),
                                               ("tls.certFile", "tls_cert_file"),
                                               ("tls.keyFile", "tls_key_file"))}
    return conf, {"client_settings": client, "client_conf_file": str(confs["client.conf"]),
                  "operator_conf_file": str(confs["operator.conf"]), "spark_options": spark}


def _bad_bookie_conf_line(n: int, _line: str) -> errors.BKError:
    return errors.IncorrectParameter(f"--bookie-conf line {n}: expected key = value")


def _tls_lines(tls_info: dict) -> list[str]:
    """The text form of ``_standalone_tls``'s client settings."""
    if not tls_info:
        return []
    return ["tls: client settings (conf/client.conf keys): "
            + " ".join(f"{k}={v}" for k, v in tls_info["client_settings"].items()),
            f"tls: client conf file: {tls_info['client_conf_file']} (pybk --client-conf, "
            f"BookKeeper(uri, conf=path)); operator: {tls_info['operator_conf_file']}",
            "tls: Spark options: " + " ".join(
                f"{opt}={v}" for opt, v in tls_info["spark_options"].items())]


# -- listbookies -------------------------------------------------------------------------
def _listbookies_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--readonly", action="store_true", help="list read-only bookies")
    p.add_argument("--all", action="store_true", help="list writable and read-only bookies")


def _listbookies(args: argparse.Namespace) -> int:
    store = open_store_from(args)
    try:
        modes = ["writable", "readonly"] if args.all else (
            ["readonly"] if args.readonly else ["writable"])
        rows = []
        for mode in modes:
            for key, versioned in store.list_prefix(keys.bookies_prefix(mode)):
                try:
                    info = json.loads(versioned.value)
                except ValueError:
                    info = {"bookie_id": key.rsplit("/", 1)[1], "raw": versioned.value.decode(
                        errors="replace")}
                info.setdefault("state", mode)
                rows.append(info)
    finally:
        store.close()
    human = [{"bookie": r.get("bookie_id"), "address": r.get("address"),
              "add_lane": r.get("add_lane_address") or "-", "rack": r.get("rack"),
              "state": r.get("state"), "metrics_port": r.get("metrics_port") or "-"}
             for r in rows]
    text = table(human, ["bookie", "address", "add_lane", "rack", "state", "metrics_port"],
                 empty="(no bookies)")
    emit(args, rows, text)
    return 0


COMMANDS: list[Command] = [
    Command("standalone", "run etcd + N bookies locally until Ctrl-C / SIGTERM (exit 2: "
            "data dir in use by another standalone, whose pid is named)",
            _standalone_args, _standalone,
            writes="DATA_DIR (etcd's and each bookie's data, their logs; with --tls a CA "
                   "and certificates in DATA_DIR/tls) and the bookies' registrations"),
    Command("listbookies", "list registered bookies", _listbookies_args, _listbookies,
            writes=None),
]


# -- entry point -----------------------------------------------------------------------------
def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="pybk", description="pybk-spark operator shell")
    shell_common.add_global_flags(parser, top_level=True)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    for cmd in [*COMMANDS, *shell_common.COMMANDS]:
        p = sub.add_parser(cmd.name, help=cmd.help, description=cmd.description(),
                           formatter_class=argparse.RawDescriptionHelpFormatter)
        shell_common.add_global_flags(p, top_level=False)
        cmd.add_arguments(p)
        p.set_defaults(_run=cmd.run)
    return parser


def main(argv: list[str] | None = None) -> int:
    try:
        return _main(argv)
    except BrokenPipeError:
        return _stdout_closed()


def _main(argv: list[str] | None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args._run(args) or 0)
    except errors.BKError as exc:
        if getattr(args, "json", False):
            print(json.dumps({"error": type(exc).__name__, "code": exc.code,
                              "message": str(exc), "outcome_known": exc.outcome_known}),
                  flush=True)
        else:
            print(f"pybk {args.command}: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    except BrokenPipeError:
        raise                        # stdout's reader is gone: main ends quietly
    except OSError as exc:           # a file or socket the operator named: one line, no traceback
        where = f" ({exc.filename})" if exc.filename else ""
        if getattr(args, "json", False):
            print(json.dumps({"error": type(exc).__name__, "code": errors.BKError.code,
                              "message": f"{exc.strerror or exc}{where}",
                              "outcome_known": True}), flush=True)
        else:
            print(f"pybk {args.command}: {exc.strerror or exc}{where}", file=sys.stderr)
        return 1


SIGPIPE_EXIT = 128 + signal.SIGPIPE      # 141: what a shell reports for a SIGPIPE'd process


def _stdout_closed() -> int:
    """``pybk ... | head``: the reader closed stdout.  Point stdout at
    /dev/null so that the interpreter's flush at exit cannot fail again (no
    "Exception ignored" traceback), and exit as a process killed by SIGPIPE."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError):    # stdout is no file (in-process callers): nothing to redirect
        pass
    return SIGPIPE_EXIT


if __name__ == "__main__":
    sys.exit(main())
