"""Human output for the admin tools: aligned tables and a progress indicator.

Progress goes to stderr (never stdout, so ``--json`` output stays one JSON
document); it is a single rewritten line on a terminal and one line per
update otherwise, throttled by an injected clock.
"""
from __future__ import annotations

import sys
import time
from typing import Callable, Iterable, Mapping, Sequence


def table(rows: Sequence[Mapping], columns: Sequence[str], empty: str = "(none)") -> str:
    if not rows:
        return empty
    cells = [[_cell(r.get(c)) for c in columns] for r in rows]
    widths = [max(len(c), *(len(row[i]) for row in cells)) for i, c in enumerate(columns)]
    line = lambda vals: "  ".join(v.ljust(w) for v, w in zip(vals, widths)).rstrip()
    return "\n".join([line(columns), line(["-" * w for w in widths])] + [line(r) for r in cells])


def _cell(v) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:.2f}"
    if isinstance(v, (list, tuple)):
        return ",".join(str(x) for x in v)
    return str(v)


class Progress:
    """``with Progress("recover", total) as p: p.step(label)``."""

    def __init__(self, what: str, total: int, *, enabled: bool = True, stream=None,
                 clock: Callable[[], float] = time.monotonic, min_interval_s: float = 0.5):
        self.what, self.total, self.done = what, total, 0
        self.enabled = enabled
        self.stream = stream or sys.stderr
        self.clock = clock
        self.min_interval_s = min_interval_s
        self._tty = bool(getattr(self.stream, "isatty", lambda: False)())
        self._last = -1e18

    def step(self, label: str = "", n: int = 1) -> None:
        self.done += n
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
        text = f"{self.what} [{bar}] {self.done}/{self.total} {label}"
        if self._tty:
            self.stream.write("\r" + text[:120].ljust(120))
        else:
            self.stream.write(text + "\n")
        self.stream.flush()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        if self.enabled and self._tty:
            self.stream.write("\n")
            self.stream.flush()


def mb_per_s(nbytes: int, seconds: float) -> float:
    return (nbytes / 1e6) / seconds if seconds > 0 else 0.0


def count_by(rows: Iterable[Mapping], key: str) -> dict:
    out: dict = {}
    for r in rows:
        out[r.get(key)] = out.get(r.get(key), 0) + 1
    return out
