"""What every ``pybk`` subcommand module shares: the ``Command`` record, the
registry ``register`` fills, and the helpers for ``--metadata-uri``,
``--client-conf`` and output (``emit``).

``pybk_spark.commands.cli`` builds the parser from the registry; the
``pybk_spark.admin.shell_*`` modules register their subcommands here when
imported, and import nothing from the cli.
"""
from __future__ import annotations

import argparse
import json
import os
from dataclasses import dataclass
from typing import Any, Callable

from pybk_spark import errors


@dataclass(frozen=True)
class Command:
    name: str
    help: str
    add_arguments: Callable[[argparse.ArgumentParser], None]
    run: Callable[[argparse.Namespace], int]


COMMANDS: list[Command] = []


def register(name: str, help: str, add_arguments, run) -> None:
    """Add (or replace) a subcommand."""
    COMMANDS[:] = [c for c in COMMANDS if c.name != name]
    COMMANDS.append(Command(name, help, add_arguments, run))


# -- helpers for subcommands --------------------------------------------------------
def add_metadata_uri(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--metadata-uri", default=os.environ.get("PYBK_METADATA_URI"),
                        help="etcd://HOST:PORT[,HOST:PORT...]/SCOPE "
                             "(default: $PYBK_METADATA_URI)")
    parser.add_argument("--client-conf", default=os.environ.get("PYBK_CLIENT_CONF"),
                        help="client conf file (conf/client.conf: TLS files, operator = "
                             "true, timeouts; default: $PYBK_CLIENT_CONF)")


def client_conf(args: argparse.Namespace):
    """The client settings of ``--client-conf`` (None: the defaults)."""
    path = getattr(args, "client_conf", None)
    if not path:
        return None
    from pybk_spark.config import load_client_conf
    try:
        return load_client_conf(path)
    except OSError as exc:
        raise errors.IncorrectParameter(f"cannot read --client-conf {path}: "
                                        f"{exc.strerror or exc}") from None


def require_metadata_uri(args: argparse.Namespace) -> str:
    if not getattr(args, "metadata_uri", None):
        raise errors.IncorrectParameter("no metadata URI: pass --metadata-uri or set "
                                        "PYBK_METADATA_URI")
    return args.metadata_uri


def open_store_from(args: argparse.Namespace):
    from pybk_spark.metadata import open_store
    return open_store(require_metadata_uri(args))


def emit(args: argparse.Namespace, data: Any, text: str | None = None) -> None:
    """Print ``data`` as JSON under ``--json``, else ``text`` (or a plain rendering)."""
    if getattr(args, "json", False):
        print(json.dumps(data, sort_keys=True, default=str), flush=True)
    else:
        print(text if text is not None else _plain(data), flush=True)


def _plain(data: Any) -> str:
    if isinstance(data, (list, tuple)):
        return "\n".join(_plain(d) for d in data)
    if isinstance(data, dict):
        return " ".join(f"{k}={v}" for k, v in data.items())
    return str(data)
