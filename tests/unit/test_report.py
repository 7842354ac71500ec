"""Human output helpers (admin/report.py): rich-rendered plain tables and
payload previews."""
import io

from pybk_spark.admin.report import Progress, preview, table


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


class _Stream(io.StringIO):
    def __init__(self, tty):
        super().__init__()
        self.tty = tty

    def isatty(self):
        return self.tty


def test_progress_lines_when_not_a_terminal_throttled_by_the_clock():
    now = [0.0]
    out = _Stream(False)
    with Progress("copy", 3, stream=out, clock=lambda: now[0], min_interval_s=10) as p:
        p.step("a")
        p.step("b")                 # same instant: throttled
        now[0] = 1.0
        p.step("c")                 # the last one is always shown
    assert out.getvalue().splitlines() == ["copy [########................] 1/3 a",
                                           "copy [########################] 3/3 c"]


def test_progress_bar_on_a_terminal():
    out = _Stream(True)
    with Progress("copy", 2, stream=out) as p:
        p.step("ledger 1")
        p.step("ledger 2")
    assert "copy" in out.getvalue() and "2/2" in out.getvalue()
    quiet = _Stream(True)
    with Progress("copy", 2, stream=quiet, enabled=False) as p:
        p.step()
    assert quiet.getvalue() == ""
