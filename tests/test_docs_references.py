"""What README.md and docs/*.md name exists: every repository path, every
dotted ``pybk_spark.…`` / ``bookie_server.…`` / ``bench.…`` name, every
``pytest`` node id (``tests/…::test_…``), every ``pybk`` subcommand, every
``make`` target and every ``python -m`` module.

A renamed module or a moved test leaves the docs pointing at nothing; this
test names each such reference with its file and line, so the docs are fixed
with the code.  Pure: reads files and imports modules, starts nothing.
"""
from __future__ import annotations

import ast
import importlib
import importlib.util
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
TOP = ("pybk_spark", "bookie_server", "tests", "bench", "conf", "jobs", "docs", "deploy")

# a path under one of the project's top-level directories, optionally with a
# pytest node id; placeholders (<x>, DIR, *) are not paths and are skipped
PATH = re.compile(r"(?<![\w./-])((?:%s)/[\w./-]*[\w/])(?:::(\w+))?" % "|".join(TOP))
DOTTED = re.compile(r"(?<![\w./-])((?:pybk_spark|bookie_server|bench)(?:\.\w+)+)")
PYBK = re.compile(r"(?:^\s*(?:\$ )?|`)pybk ([a-z][a-z0-9-]*)")
MAKE = re.compile(r"`make ([a-z][a-z0-9-]*)")
PYTHON_M = re.compile(r"python -m ([\w.]+)")


def _lines():
    for doc in DOCS:
        for no, line in enumerate(doc.read_text().splitlines(), 1):
            yield f"{doc.relative_to(ROOT)}:{no}", line


def _test_names(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    return {n.name for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.ClassDef))}


def path_problem(ref: str, node: str | None) -> str | None:
    """None when ``ref`` (and ``node``, a test in it) exists, else why not."""
    target = ROOT / ref.rstrip("/")
    if not target.exists():
        return f"no such path {ref}"
    if node and node not in _test_names(target):
        return f"{ref} has no {node}"
    return None


def dotted_problem(name: str) -> str | None:
    """None when ``name`` resolves (a module, or attributes of the longest
    importable module prefix), else why not."""
    parts = name.split(".")
    for cut in range(len(parts), 0, -1):
        module_name = ".".join(parts[:cut])
        try:
            spec = importlib.util.find_spec(module_name)
        except ModuleNotFoundError:
            spec = None
        if spec is None:
            continue
        obj = importlib.import_module(module_name)
        for attr in parts[cut:]:
            if not hasattr(obj, attr):
                return f"{name}: {module_name} has no {'.'.join(parts[cut:])}"
            obj = getattr(obj, attr)
        return None
    return f"{name}: no such module"


def _pybk_commands() -> set[str]:
    from pybk_spark.commands.cli import build_parser
    parser = build_parser()
    sub = next(a for a in parser._actions if a.dest == "command")
    return set(sub.choices)


def _make_targets() -> set[str]:
    text = (ROOT / "Makefile").read_text()
    return set(re.findall(r"^([a-z][a-z0-9-]*):", text, re.M))


def broken_references() -> list[str]:
    commands, targets = _pybk_commands(), _make_targets()
    out: list[str] = []
    for where, line in _lines():
        for m in PATH.finditer(line):
            ref, node = m.group(1), m.group(2)
            if "<" in ref or line[m.end():m.end() + 1] in ("*", "<", "{"):
                continue
            why = path_problem(ref, node)
            if why:
                out.append(f"{where}: {why}")
        for m in DOTTED.finditer(line):
            name = m.group(1).rstrip(".")
            if line[m.end():m.end() + 1] == "/" or name.endswith((".py", ".md", ".proto")):
                continue
            why = dotted_problem(name)
            if why:
                out.append(f"{where}: {why}")
        for m in PYBK.finditer(line):
            if m.group(1) not in commands:
                out.append(f"{where}: no pybk command {m.group(1)}")
        for m in MAKE.finditer(line):
            if m.group(1) not in targets:
                out.append(f"{where}: no make target {m.group(1)}")
        for m in PYTHON_M.finditer(line):
            name = m.group(1).rstrip(".")
            if name.split(".")[0] in ("pytest", "pip", "venv", "mypy", "ruff", "grpc_tools", "build"):
                continue
            if importlib.util.find_spec(name) is None:
                out.append(f"{where}: no module {name} (python -m)")
    return out


def test_every_path_function_and_command_the_docs_name_exists():
    broken = broken_references()
    assert not broken, "the docs name what does not exist:\n" + "\n".join(broken)


@pytest.mark.parametrize("ref, node, problem", [
    ("tests/test_readme.py", None, "no such path tests/test_readme.py"),
    ("tests/spark/test_readme.py", None, None),
    ("tests/spark/test_readme.py", "test_readme_runs", None),
    ("tests/spark/test_readme.py", "test_nothing", "tests/spark/test_readme.py has no test_nothing"),
])
def test_a_path_that_does_not_exist_is_caught(ref, node, problem):
    assert path_problem(ref, node) == problem


@pytest.mark.parametrize("name, ok", [
    ("pybk_spark.logs.log.truncate_log", False),
    ("pybk_spark.logs.truncation.truncate_log", True),
    ("pybk_spark.logs", True),
    ("pybk_spark.no_such_module", False),
])
def test_a_dotted_name_that_does_not_resolve_is_caught(name, ok):
    assert (dotted_problem(name) is None) == ok
