"""Console and number formatting shared by the command layer and the report writers.

A neutral module: `sextant.commands` and `sextant.report` both import from here, so the
report never imports the CLI layer. Only rich is imported.
"""

from __future__ import annotations

import re
from typing import Any

from rich.console import Console
from rich.text import Text

_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def printable(text: str) -> str:
    """`text` with every control character but tab and newline written as a visible escape
    (`\x1b`), so a name cannot move the cursor, retitle the terminal or clear the screen."""
    return _CONTROL.sub(lambda m: f"\\x{ord(m.group()):02x}", text)


class SafeConsole(Console):
    """A rich Console that shows control characters in what it is given (names of runs and
    workloads from files and the store), never sends them to the terminal. rich's own styles
    are added after this, so colours still work."""

    def render_str(self, text: str, *args: Any, **kwargs: Any) -> Text:
        return super().render_str(printable(text), *args, **kwargs)

# Off a terminal (CI logs, pipes) rich assumes 80 columns; the comparison tables need more.
DEFAULT_MIN_WIDTH = 160


def console(min_width: int | None = DEFAULT_MIN_WIDTH, *, highlight: bool = False,
            stderr: bool = False) -> Console:
    """The console every command prints through (stdout, or stderr with `stderr=True`). Off
    a terminal it is at least `min_width` columns wide (None: rich's own default, 80), so
    tables stay readable in logs and pipes."""
    out = SafeConsole(highlight=highlight, stderr=stderr)
    if min_width is not None and not out.is_terminal and out.width < min_width:
        out = SafeConsole(highlight=highlight, stderr=stderr, width=min_width)
    return out


def fmt_ms(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds * 1e3:.1f}"


def fmt_bytes_mb(n: float | None) -> str:
    return "-" if n is None else f"{n / 2**20:,.0f}"


def fmt_rate(x: float | None) -> str:
    if x is None:
        return "-"
    for unit, scale in (("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if x >= scale:
            return f"{x / scale:.1f}{unit}"
    return f"{x:.0f}"


def fmt_loss(x: float | None) -> str:
    return "-" if x is None else f"{x:.4f}"


def fmt_signed_pct(x: float | None) -> str:
    return "-" if x is None else f"{x * 100:+.0f}%"


def fmt_share(x: float | None) -> str:
    if x is None:
        return "-"
    return f"{x * 100:.0f}%" if x >= 0 else f"{x * 100:.0f}% (noise)"


def human_count(n: float) -> str:
    """1.1B, 86.2M, 137K: a count with three significant digits and its unit."""
    import math

    for unit, scale in (("T", 1e12), ("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if abs(n) >= scale:
            return f"{n / scale:.{max(0, 3 - int(math.log10(abs(n) / scale)) - 1)}f}{unit}"
    return f"{n:.0f}"
