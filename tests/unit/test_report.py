"""Human output helpers (admin/report.py): rich-rendered plain tables and
payload previews."""
from pybk_spark.admin.report import preview, table


def test_table_is_plain_aligned_text_without_markup():
    out = table([{"a": 1, "b": "[bold]x[/bold]"}, {"a": 22, "b": [1, 2], "c": None}],
                ["a", "b", "c"])
    lines = out.splitlines()
    assert lines[0].split() == ["a", "b", "c"] and set(lines[1]) == {"-"}
    assert "[bold]x[/bold]" in lines[2] and lines[3].split() == ["22", "1,2", "-"]
    assert "\x1b" not in out and all(line == line.rstrip() for line in lines)
    assert lines[2].index("[bold]") == lines[0].index("b")          # aligned
    assert table([], ["a"], empty="(nothing)") == "(nothing)"


def test_preview():
    assert preview(b"hello") == ("hello", False)
    assert preview("é".encode()) == ("é", False)
    assert preview(b"\x00\xffz") == ("\\x00\\xffz", True)
    assert preview(b"a\nb") == ("a\\nb", True)
    assert preview(b"\x00\xff", as_hex=True) == ("00ff", False)
    assert preview(b"x" * 100, width=10) == ("x" * 10 + "...", False)
