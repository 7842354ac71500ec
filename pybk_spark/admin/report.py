"""Human output for the admin tools: aligned tables, payload previews and a
progress indicator.

Tables are rendered by ``rich`` (plain text: no colour, no markup parsing, so
a payload containing ``[...]`` prints as is); on a terminal they fold to its
width, into a pipe or file they never wrap.

Progress goes to stderr (never stdout, so ``--json`` output stays one JSON
document): a ``rich`` bar on a terminal, one line per update otherwise,
throttled by an injected clock.
"""
from __future__ import annotations

import io
import shutil
import sys
import time
from typing import TYPE_CHECKING, Callable, Iterable, Mapping, Optional, Sequence, TextIO

if TYPE_CHECKING:
    from rich.progress import Progress as RichProgress
    from rich.progress import TaskID


def table(rows: Sequence[Mapping], columns: Sequence[str], empty: str = "(none)") -> str:
    if not rows:
        return empty
    # why: rich takes ~0.15 s to import; only a non-empty table needs it
    from rich import box
    from rich.console import Console
    from rich.table import Table
    from rich.text import Text

    plain = box.Box("    \n    \n -- \n    \n    \n    \n    \n    \n", ascii=True)
    t = Table(box=plain, show_edge=False, pad_edge=False, highlight=False)
    for c in columns:
        t.add_column(c, overflow="fold")
    for r in rows:
        t.add_row(*(Text(_cell(r.get(c))) for c in columns))
    width = shutil.get_terminal_size().columns if sys.stdout.isatty() else 100_000
    out = io.StringIO()
    console = Console(file=out, width=max(width, 40), color_system=None,
                      highlight=False, markup=False, emoji=False, soft_wrap=False)
    console.print(t)
    lines = [line.rstrip() for line in out.getvalue().splitlines()]
    return "\n".join(line for line in lines if line)


def preview(payload: bytes, as_hex: bool = False, width: int = 60) -> tuple[str, bool]:
    """``(text, escaped)``: printable UTF-8 as is; else (``escaped``) UTF-8
    with its control characters escaped, or bytes that are not UTF-8 escaped
    as in a Python bytes literal; ``as_hex``: hex.  Cut at ``width``."""
    binary = False
    if as_hex:
        text = payload.hex()
    else:
        try:
            text = payload.decode("utf-8")
            if not text.isprintable():
                binary = True
                text = "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)
        except UnicodeDecodeError:
            binary = True
            text = repr(payload)[2:-1]
    return (text if len(text) <= width else text[:width] + "..."), binary


HEX_HINT = "(binary payloads shown escaped, \\xNN; --hex prints them as hex)"


def _cell(v: object) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:.2f}"
    if isinstance(v, (list, tuple)):
        return ",".join(str(x) for x in v)
    return str(v)


class Progress:
    """``with Progress("recover", total) as p: p.step(label)``.

    On a terminal: a ``rich`` progress bar (count, elapsed, time left, the
    last label), redrawn in place.  Otherwise (a log file, a pipe): one
    plain line per update, at most every ``min_interval_s`` of ``clock``."""

    def __init__(self, what: str, total: int, *, enabled: bool = True,
                 stream: Optional[TextIO] = None,
                 clock: Callable[[], float] = time.monotonic, min_interval_s: float = 0.5) -> None:
        self.what, self.total, self.done = what, total, 0
        self.enabled = enabled
        self.stream = stream or sys.stderr
        self.clock = clock
        self.min_interval_s = min_interval_s
        self._tty = bool(getattr(self.stream, "isatty", lambda: False)())
        self._last = -1e18
        self._bar: Optional[RichProgress] = None
        self._task: Optional[TaskID] = None

    def step(self, label: str = "", n: int = 1) -> None:
        self.done += n
        if self._bar is not None and self._task is not None:
            self._bar.update(self._task, advance=n, label=label[:60])
            return
        now = self.clock()
        if self.done < self.total and now - self._last < self.min_interval_s:
            return
        self._last = now
        self._show(label)

    def _show(self, label: str) -> None:
        if not self.enabled:
            return
        width = 24
        filled = width * self.done // max(1, self.total)
        bar = "#" * filled + "." * (width - filled)
        self.stream.write(f"{self.what} [{bar}] {self.done}/{self.total} {label}\n")
        self.stream.flush()

    def __enter__(self) -> Progress:
        if self.enabled and self._tty:
            # why: rich takes ~0.15 s to import; only a bar on a terminal needs it
            from rich.console import Console
            from rich.progress import (BarColumn, MofNCompleteColumn, TextColumn,
                                       TimeElapsedColumn, TimeRemainingColumn)
            from rich.progress import Progress as RichProgress
            self._bar = RichProgress(TextColumn(self.what), BarColumn(), MofNCompleteColumn(),
                                     TimeElapsedColumn(), TimeRemainingColumn(),
                                     TextColumn("{task.fields[label]}"),
                                     console=Console(file=self.stream, highlight=False),
                                     refresh_per_second=4)
            self._task = self._bar.add_task(self.what, total=self.total, label="")
            self._bar.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._bar is not None:
            self._bar.stop()
            self._bar = None


def mb_per_s(nbytes: int, seconds: float) -> float:
    return (nbytes / 1e6) / seconds if seconds > 0 else 0.0


def count_by(rows: Iterable[Mapping], key: str) -> dict:
    out: dict = {}
    for r in rows:
        out[r.get(key)] = out.get(r.get(key), 0) + 1
    return out
