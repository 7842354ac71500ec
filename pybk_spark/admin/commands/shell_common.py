"""What every ``pybk`` subcommand module shares: the ``Command`` record, the
registry ``register`` fills, the global flags (``--json``, ``--metadata-uri``,
``--client-conf``) and output (``emit``).

``pybk_spark.commands.cli`` builds the parser from the registry; the
``pybk_spark.admin.commands.shell_*`` modules register their subcommands here when
imported, and import nothing from the cli.
"""
from __future__ import annotations

import argparse
import json
import os
import textwrap
from dataclasses import dataclass
from typing import Any, Callable

from pybk_spark import errors
from pybk_spark.config import ClientConfig, load_client_conf
from pybk_spark.metadata import open_store
from pybk_spark.metadata.store import MetadataStore


READS_ONLY = "Reads only."
WRITES = "Writes: "


@dataclass(frozen=True)
class Command:
    """A subcommand.  ``writes`` says what it changes (the metadata store,
    bookies, files), or is None for a command that only reads; ``pybk CMD
    --help`` shows it after ``help``."""
    name: str
    help: str
    add_arguments: Callable[[argparse.ArgumentParser], None]
    run: Callable[[argparse.Namespace], int]
    writes: str | None

    def description(self) -> str:
        said = READS_ONLY if self.writes is None else f"{WRITES}{self.writes}."
        return "\n\n".join(textwrap.fill(part, 78, break_on_hyphens=False)
                             for part in (self.help, said))


COMMANDS: list[Command] = []


def register(name: str, help: str, add_arguments: Callable[[argparse.ArgumentParser], None],
             run: Callable[[argparse.Namespace], int], *, writes: str | None) -> None:
    """Add (or replace) a subcommand; ``writes``: what it changes (None: it only reads)."""
    COMMANDS[:] = [c for c in COMMANDS if c.name != name]
    COMMANDS.append(Command(name, help, add_arguments, run, writes))


# -- global flags ---------------------------------------------------------------------
def add_global_flags(parser: argparse.ArgumentParser, *, top_level: bool) -> None:
    """``--json``, ``--metadata-uri``, ``--client-conf``: on the top-level
    parser (before the command) with their defaults, and on every
    subcommand's parser (after it) without one, so that a flag given before
    the command is not overwritten by the subcommand's default."""
    def default(value: Any) -> Any:
        return value if top_level else argparse.SUPPRESS
    group = parser.add_argument_group(
        "global options" if top_level else "global options (also accepted before the command)")
    group.add_argument("--json", action="store_true", default=default(False),
                       help="machine-readable output: one JSON document")
    group.add_argument("--metadata-uri", default=default(os.environ.get("PYBK_METADATA_URI")),
                       help="etcd://HOST:PORT[,HOST:PORT...]/SCOPE "
                            "(default: $PYBK_METADATA_URI)")
    group.add_argument("--client-conf", default=default(os.environ.get("PYBK_CLIENT_CONF")),
                       help="client conf file (conf/client.conf: TLS files, operator = "
                            "true, timeouts; default: $PYBK_CLIENT_CONF)")


# -- helpers for subcommands --------------------------------------------------------


def client_conf(args: argparse.Namespace) -> ClientConfig | None:
    """The client settings of ``--client-conf`` (None: the defaults)."""
    path = getattr(args, "client_conf", None)
    if not path:
        return None
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


def open_store_from(args: argparse.Namespace) -> MetadataStore:
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
