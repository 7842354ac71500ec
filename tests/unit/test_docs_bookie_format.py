"""The docs on replacing a bookie's disk name paths, functions and commands
that exist (docs/operations.md, "Replacing a bookie's disk"; docs/bookie.md,
"Identity and limits")."""
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _section(doc: str, heading: str) -> str:
    text = (ROOT / doc).read_text()
    start = text.index(heading)
    end = text.find("\n#", start + len(heading))
    return text[start:end if end >= 0 else len(text)]


def _paths(text: str) -> set:
    return set(re.findall(r"`((?:bookie_server|pybk_spark|tests)/[\w/]+\.py)`", text))


def test_named_paths_exist():
    texts = [_section("docs/operations.md", "### Replacing a bookie's disk"),
             _section("docs/bookie.md", "## Identity and limits")]
    paths = set().union(*map(_paths, texts))
    assert {"bookie_server/cookie.py", "pybk_spark/protocol/bookie_instances.py",
            "tests/admin/test_formatted_bookie.py"} <= paths
    assert [p for p in paths if not (ROOT / p).exists()] == []


def test_named_functions_keys_and_flags_exist():
    from bookie_server import cookie
    from bookie_server.__main__ import _parse
    from pybk_spark.metadata import keys
    from pybk_spark.protocol import bookie_instances as bi
    assert callable(cookie.mark_data_lost) and callable(cookie.record_instance)
    assert bi.instances_key("b") == "bookies/instances/b"
    assert keys.INSTANCES_PREFIX == "bookies/instances/"
    assert _parse(["format", "--yes"]).yes
    ops = _section("docs/operations.md", "### Replacing a bookie's disk")
    for word in ("bookies/damaged/<id>", "bookies/instances/<id>", "--yes",
                 "event=bookie_instance_replaced", "damaged (unattributed)"):
        assert word in ops, word
