"""The layering of docs/architecture.md ("Dependency direction"), enforced.

Every import of every module under ``pybk_spark/`` and ``bookie_server/`` is
read with ``ast`` (module level, inside functions, under ``TYPE_CHECKING``),
resolved to the layer it lands in, and checked against ``ALLOWED``: the one
table of permitted arrows, which mirrors the drawing in docs/architecture.md.
"""
from __future__ import annotations

import ast
import pathlib

ROOT = pathlib.Path(__file__).resolve().parents[2]

# The shared layer: what the client and the bookie both stand on.
ERRORS = "pybk_spark.errors"
PROTOCOL = "pybk_spark.protocol"
WIRE = "pybk_spark.wire"
METADATA = "pybk_spark.metadata"
CONFIG = "pybk_spark.config"        # the `key = value` conf-file parser both conf files use
DIRLOCK = "pybk_spark.dirlock"
SHARED = {ERRORS, PROTOCOL, WIRE, METADATA, CONFIG, DIRLOCK}

# Client layers, bottom to top.
TRANSPORT = "pybk_spark.transport"
LEDGER = "pybk_spark.ledger"
LOGS = "pybk_spark.logs"
SPARK = "pybk_spark.spark"
ADMIN = "pybk_spark.admin"
CLUSTER = "pybk_spark.cluster"
COMMANDS = "pybk_spark.commands"
TESTING = "pybk_spark.testing"
PACKAGE = "pybk_spark"              # pybk_spark/__init__.py: the lazy client entry point

BOOKIE = "bookie_server"

# layer -> the layers it may import (besides itself).
ALLOWED: dict[str, set[str]] = {
    ERRORS: set(),
    PROTOCOL: {ERRORS},
    CONFIG: {ERRORS},
    DIRLOCK: {ERRORS},
    WIRE: {ERRORS, PROTOCOL},
    METADATA: {ERRORS, PROTOCOL, CONFIG},
    BOOKIE: SHARED,
    TRANSPORT: SHARED,
    LEDGER: SHARED | {TRANSPORT},
    LOGS: SHARED | {TRANSPORT, LEDGER},
    SPARK: SHARED | {TRANSPORT, LEDGER, LOGS},
    ADMIN: SHARED | {TRANSPORT, LEDGER, LOGS},
    CLUSTER: SHARED | {TRANSPORT, ADMIN},
    COMMANDS: SHARED | {TRANSPORT, LEDGER, LOGS, ADMIN, CLUSTER},
    TESTING: SHARED | {TRANSPORT, LEDGER, LOGS, SPARK, ADMIN, CLUSTER},
    PACKAGE: {ERRORS, LOGS},
}

# Single modules allowed one arrow their layer may not take, and why (none:
# the ways into logs are on logs/client.py's BookKeeper, above the ledger client).
EXCEPTIONS: dict[tuple[str, str], str] = {}


def layer_of(module: str) -> str | None:
    parts = module.split(".")
    if parts[0] == BOOKIE:
        return BOOKIE
    if parts[0] != PACKAGE:
        return None
    return PACKAGE if len(parts) == 1 else f"{PACKAGE}.{parts[1]}"


def module_name(path: pathlib.Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _is_module(name: str) -> bool:
    p = ROOT.joinpath(*name.split("."))
    return p.with_suffix(".py").is_file() or (p / "__init__.py").is_file()


def imported(path: pathlib.Path, name: str) -> list[tuple[str, int]]:
    """(module, line) of every import in module ``name`` (read from ``path``),
    relative ones resolved; ``from package import submodule`` counts as
    importing the submodule."""
    here = name.split(".")
    package = here if path.name == "__init__.py" else here[:-1]
    found: list[tuple[str, int]] = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found += [(a.name, node.lineno) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[:len(package) - (node.level - 1)]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            for a in node.names:
                sub = f"{module}.{a.name}"
                found.append((sub if _is_module(sub) else module, node.lineno))
    return found


def sources() -> list[pathlib.Path]:
    return sorted([*ROOT.glob("pybk_spark/**/*.py"), *ROOT.glob("bookie_server/**/*.py")])


def broken_arrows(path: pathlib.Path, src: str) -> list[str]:
    """The imports of module ``src`` (read from ``path``) its layer may not take."""
    bad = []
    src_layer = layer_of(src)
    assert src_layer in ALLOWED, f"{src}: layer {src_layer} is missing from ALLOWED"
    for target, line in imported(path, src):
        dst_layer = layer_of(target)
        if dst_layer is None or dst_layer == src_layer:
            continue
        if dst_layer in ALLOWED[src_layer] or (src, dst_layer) in EXCEPTIONS:
            continue
        arrow = f"{src}:{line} ({src_layer}) -> {target}"
        if arrow not in bad:
            bad.append(arrow)
    return bad


def violations() -> list[str]:
    return [b for path in sources() for b in broken_arrows(path, module_name(path))]


def test_every_import_follows_the_layering():
    bad = violations()
    assert not bad, f"{len(bad)} imports break docs/architecture.md's layering:\n" + "\n".join(bad)


def test_the_ledger_client_never_imports_logs_admin_or_spark():
    above = {LOGS, ADMIN, SPARK}
    assert not ALLOWED[LEDGER] & above
    assert not [k for k in EXCEPTIONS if layer_of(k[0]) == LEDGER and k[1] in above]
    upward = [f"{module_name(path)}:{line} -> {target}"
              for path in sorted(ROOT.glob("pybk_spark/ledger/**/*.py"))
              for target, line in imported(path, module_name(path))
              if layer_of(target) in above]
    assert not upward, "the ledger layer imports a layer above it:\n" + "\n".join(upward)


def test_every_layer_exists_and_the_table_is_acyclic():
    for layer in ALLOWED:
        assert layer == PACKAGE or layer_of(layer) == layer
        assert _is_module(layer), layer
    seen: dict[str, int] = {}

    def depth(layer: str, stack: tuple[str, ...] = ()) -> int:
        assert layer not in stack, f"cycle: {' -> '.join(stack + (layer,))}"
        if layer not in seen:
            seen[layer] = 1 + max((depth(d, stack + (layer,)) for d in ALLOWED[layer]), default=0)
        return seen[layer]

    for layer in ALLOWED:
        depth(layer)


def test_the_checker_sees_imports_inside_functions_and_type_checking(tmp_path):
    probe = tmp_path / "probe.py"
    probe.write_text("from typing import TYPE_CHECKING\n"
                     "if TYPE_CHECKING:\n    from pybk_spark.ledger import client\n"
                     "def f():\n    import pybk_spark.transport.base\n"
                     "    from ..wire import entries\n"
                     "    from .. import pybk_spark\n")
    bad = broken_arrows(probe, "bookie_server.serving.probe")
    assert [b.rsplit(" -> ", 1)[1] for b in bad] == [
        "pybk_spark.ledger.client", "pybk_spark.transport.base"], bad


def _docs_table() -> dict[str, set[str]]:
    """docs/architecture.md's "may import" table, as layer -> layers."""
    text = (ROOT / "docs" / "architecture.md").read_text()
    rows = text[text.index("| layer | may import |"):].split("\n\n", 1)[0].splitlines()[2:]

    def layer(name: str) -> str:
        name = name.strip().strip("`")
        if name in ("pybk_spark/__init__.py", PACKAGE):
            return PACKAGE
        if name == BOOKIE:
            return BOOKIE
        return f"{PACKAGE}.{name.removeprefix('pybk_spark').lstrip('.')}"

    table: dict[str, set[str]] = {}
    for row in rows:
        left, right = [c.strip() for c in row.strip("|").split("|")]
        right = right.split(":", 1)[-1] if right.startswith("the shared layer:") else right
        targets: set[str] = set()
        for part in right.replace("(lazily)", "").split(","):
            part = part.strip()
            if part == "the shared layer":
                targets |= SHARED
            elif part and part != "nothing":
                targets.add(layer(part))
        for name in left.split(","):
            table[layer(name)] = targets
    return table


def test_the_docs_draw_the_same_table():
    assert _docs_table() == ALLOWED
