"""Inline SVG charts: no script, no font, nothing fetched. Every label is escaped."""

from __future__ import annotations

import html
import math
from collections.abc import Callable, Sequence
from typing import Any, NotRequired, TypedDict


class Bar(TypedDict):
    """One bar: its value, with a whisker from low to high where both are known."""

    name: str
    value: float | None
    colour: str
    low: NotRequired[float | None]
    high: NotRequired[float | None]


class StackedBar(TypedDict):
    """One stacked bar: a value (>= 0) per segment."""

    name: str
    values: list[float]


class Line(TypedDict):
    """One line: its (x, y) points (y None: no point), how it is drawn, and optional
    (x, low, high) whiskers. A ghost line is drawn faint and left out of the legend."""

    name: str
    colour: str
    points: Sequence[tuple[float, float | None]]
    dash: NotRequired[str]
    width: NotRequired[float]
    ghost: NotRequired[bool]
    ranges: NotRequired[Sequence[tuple[float, float | None, float | None]]]

FRAMEWORK_COLOURS = {
    # Several shades per framework: runs of one framework share a hue.
    "torch": ("#d9480f", "#f08c00", "#a61e4d", "#e8590c"),
    "jax": ("#1864ab", "#4dabf7", "#0b7285", "#5c7cfa"),
    "tensorflow": ("#2b8a3e", "#82c91e", "#087f5b", "#66a80f"),
}
OTHER_COLOURS = ("#6741d9", "#862e9c", "#495057", "#c2255c")
DASHES = ("", "7 4", "2 3", "10 3 2 3")


def e(value: Any) -> str:
    return html.escape(str(value), quote=True)


def colour_for(framework: str, index: int) -> str:
    shades = FRAMEWORK_COLOURS.get(framework, OTHER_COLOURS)
    return shades[index % len(shades)]


def nice_ticks(lo: float, hi: float, count: int = 5) -> list[float]:
    """Round tick values covering [lo, hi]."""
    if not math.isfinite(lo) or not math.isfinite(hi):
        return [0.0, 1.0]
    if hi <= lo:
        hi = lo + (abs(lo) or 1.0)
    raw = (hi - lo) / max(1, count - 1)
    mag = 10 ** math.floor(math.log10(raw))
    step = next(m * mag for m in (1, 2, 2.5, 5, 10) if m * mag >= raw)
    start = math.floor(lo / step) * step
    ticks = []
    v = start
    while v < hi + step * 0.999:
        ticks.append(round(v, 12))
        v += step
    return ticks


def fmt_tick(v: float) -> str:
    a = abs(v)
    if a >= 1e9:
        return f"{v / 1e9:g}G"
    if a >= 1e6:
        return f"{v / 1e6:g}M"
    if a >= 1e3:
        return f"{v / 1e3:g}k"
    return f"{v:g}"


def _label_width(rows: Sequence[Bar] | Sequence[StackedBar]) -> int:
    """Left margin that fits the longest row name (about 7 px a character at 12 px)."""
    longest = max((len(str(r["name"])) for r in rows), default=10)
    return max(120, min(380, 7 * longest + 18))


def _svg_open(width: int, height: int, label: str) -> str:
    return (f'<svg viewBox="0 0 {width} {height}" width="100%" role="img" '
            f'aria-label="{e(label)}">')


def legend(items: Sequence[tuple[str, str, str]]) -> str:
    """(name, colour, dash) -> an HTML legend."""
    spans = []
    for name, colour, dash in items:
        style = (f"border-top:3px dashed {colour}" if dash else f"background:{colour}")
        spans.append(f'<span><i style="{style}"></i>{e(name)}</span>')
    return f'<div class="legend">{"".join(spans)}</div>'


def _hbar_frame(rows: Sequence[Bar] | Sequence[StackedBar], hi: float, *, width: int, label: str,
                unit: str) -> tuple[list[str], Callable[[float], float]]:
    """The frame shared by the horizontal bar charts: SVG opening, vertical grid lines with
    tick labels from 0 to `hi`, the axis label; returns the parts and the x scale."""
    left, right, bar, top = _label_width(rows), 90, 26, 8
    ticks = nice_ticks(0, hi)
    top_v = ticks[-1] or 1.0
    w = width - left - right
    height = top + bar * len(rows) + 34

    def x(v: float) -> float:
        return left + w * max(0.0, v) / top_v

    parts = [_svg_open(width, height, label)]
    axis_y = top + bar * len(rows)
    for t in ticks:
        parts.append(f'<line x1="{x(t):.1f}" x2="{x(t):.1f}" y1="{top}" y2="{axis_y}" '
                     f'stroke="#e9ecef"/><text x="{x(t):.1f}" y="{axis_y + 14}" '
                     f'text-anchor="middle" class="tick">{e(fmt_tick(t))}</text>')
    parts.append(f'<text x="{left + w / 2:.0f}" y="{height - 3}" text-anchor="middle" '
                 f'class="axis">{e(unit)}</text>')
    return parts, x


def hbar_chart(rows: Sequence[Bar], *, label: str, unit: str,
               fmt: Callable[[float], str] = fmt_tick, width: int = 900) -> str:
    """Horizontal bars (value) with p10-p90 whiskers (low, high); rows: name, value, low,
    high, colour."""
    shown = [(r, v) for r in rows if (v := r.get("value")) is not None]
    if not shown:
        return "<p class=\"muted\">No data.</p>"
    rows = [r for r, _ in shown]
    left, bar, top = _label_width(rows), 26, 8
    parts, x = _hbar_frame(rows, max(max(v, r.get("high") or 0) for r, v in shown),
                           width=width, label=label, unit=unit)
    for i, (r, value) in enumerate(shown):
        y0 = top + i * bar
        mid = y0 + bar / 2
        parts.append(
            f'<text x="{left - 8}" y="{mid + 4:.1f}" text-anchor="end">{e(r["name"])}</text>'
            f'<rect x="{left}" y="{y0 + 4}" width="{x(value) - left:.1f}" '
            f'height="{bar - 8}" rx="2" fill="{r["colour"]}" opacity=".85">'
            f'<title>{e(r["name"])}: {e(fmt(value))} {e(unit)}</title></rect>'
        )
        end = x(value)
        low, high = r.get("low"), r.get("high")
        if low is not None and high is not None:
            lo, hi_x = x(low), x(high)
            parts.append(
                f'<line x1="{lo:.1f}" x2="{hi_x:.1f}" y1="{mid:.1f}" y2="{mid:.1f}" '
                f'stroke="#212529" stroke-width="1.4"/>'
                f'<line x1="{lo:.1f}" x2="{lo:.1f}" y1="{mid - 5:.1f}" y2="{mid + 5:.1f}" '
                f'stroke="#212529" stroke-width="1.4"/>'
                f'<line x1="{hi_x:.1f}" x2="{hi_x:.1f}" y1="{mid - 5:.1f}" y2="{mid + 5:.1f}" '
                f'stroke="#212529" stroke-width="1.4"/>'
            )
            end = max(end, hi_x)
        parts.append(f'<text x="{end + 6:.1f}" y="{mid + 4:.1f}" class="val">'
                     f'{e(fmt(value))}</text>')
    parts.append("</svg>")
    return "".join(parts)


def stacked_hbar_chart(rows: Sequence[StackedBar], segments: Sequence[tuple[str, str]], *,
                       label: str, unit: str, fmt: Callable[[float], str] = fmt_tick,
                       width: int = 900) -> str:
    """Horizontal stacked bars; rows: name, values (one per segment, >= 0). segments:
    (name, colour). The total is printed at the end of each bar."""
    rows = [r for r in rows if r.get("values")]
    if not rows:
        return "<p class=\"muted\">No data.</p>"
    left, bar, top = _label_width(rows), 26, 8
    parts, x = _hbar_frame(rows, max(sum(max(0.0, v) for v in r["values"]) for r in rows), width=width, label=label, unit=unit)
    for i, r in enumerate(rows):
        y0 = top + i * bar
        mid = y0 + bar / 2
        parts.append(f'<text x="{left - 8}" y="{mid + 4:.1f}" text-anchor="end">'
                     f'{e(r["name"])}</text>')
        acc = 0.0
        for (seg, colour), v in zip(segments, r["values"]):
            v = max(0.0, v)
            if v <= 0:
                continue
            parts.append(f'<rect x="{x(acc):.1f}" y="{y0 + 4}" width="{x(acc + v) - x(acc):.1f}" '
                         f'height="{bar - 8}" fill="{colour}"><title>{e(r["name"])}, '
                         f'{e(seg)}: {e(fmt(v))} {e(unit)}</title></rect>')
            acc += v
        parts.append(f'<text x="{x(acc) + 6:.1f}" y="{mid + 4:.1f}" class="val">'
                     f'{e(fmt(acc))}</text>')
    parts.append("</svg>")
    return "".join(parts) + legend([(s, c, "") for s, c in segments])


def line_chart(series: Sequence[Line], *, label: str, xlabel: str, ylabel: str,
               integer_x: bool = False, markers: bool = False, width: int = 900,
               height: int = 320, x_labels: dict[float, str] | None = None,
               x_format: Any = None) -> str:
    """Lines over a numeric x axis; series: name, colour, dash, points [(x, y)], optional
    width (stroke), ghost (True: drawn faint, left out of the legend), ranges
    [(x, low, high)] for whiskers. `x_labels`: tick positions and their text (e.g. a log
    axis), instead of integer ticks; `x_format(x)`: how a marker's tooltip names its x."""
    name_x = x_format or (lambda v: f"{v:g}")
    pts = [(x, y) for s in series for x, y in s["points"] if y is not None]
    if not pts:
        return "<p class=\"muted\">No data.</p>"
    xs = [float(p[0]) for p in pts]
    ys = [float(p[1]) for p in pts] + [float(v) for s in series
                                       for _, lo, hi in s.get("ranges", ())
                                       for v in (lo, hi) if v is not None]
    x_lo, x_hi = min(xs), max(xs)
    pad = 0.0
    if integer_x:
        x_lo, x_hi = min(x_lo, 1), max(x_hi, 2)
        pad = 0.06 * (x_hi - x_lo)
    y_ticks = nice_ticks(min(0.0, min(ys)) if integer_x else min(ys), max(ys))
    y_lo, y_hi = y_ticks[0], y_ticks[-1]
    left, right, top, bottom = 64, 20, 12, 44
    w, h = width - left - right, height - top - bottom

    def sx(v: float) -> float:
        return left + w * (v - x_lo + pad) / ((x_hi - x_lo + 2 * pad) or 1.0)

    def sy(v: float) -> float:
        return top + h * (1 - (v - y_lo) / ((y_hi - y_lo) or 1.0))

    parts = [_svg_open(width, height, label)]
    for t in y_ticks:
        parts.append(f'<line x1="{left}" x2="{left + w}" y1="{sy(t):.1f}" y2="{sy(t):.1f}" '
                     f'stroke="#e9ecef"/><text x="{left - 6}" y="{sy(t) + 4:.1f}" '
                     f'text-anchor="end" class="tick">{e(fmt_tick(t))}</text>')
    if x_labels:
        x_ticks: dict[float, str] = {t: text for t, text in x_labels.items() if x_lo <= t <= x_hi}
    elif integer_x:
        x_ticks = {t: str(t) for t in range(int(x_lo), int(x_hi) + 1)}
    else:
        step = max(1, round((x_hi - x_lo) / 8))
        x_ticks = {t: str(t) for t in range(int(x_lo), int(x_hi) + 1, step)}
    for t, text in x_ticks.items():
        parts.append(f'<text x="{sx(t):.1f}" y="{top + h + 16}" text-anchor="middle" '
                     f'class="tick">{e(text)}</text>')
    parts.append(f'<line x1="{left}" x2="{left + w}" y1="{top + h}" y2="{top + h}" '
                 f'stroke="#adb5bd"/>')
    parts.append(f'<text x="{left + w / 2:.0f}" y="{height - 6}" text-anchor="middle" '
                 f'class="axis">{e(xlabel)}</text>')
    parts.append(f'<text transform="translate(14 {top + h / 2:.0f}) rotate(-90)" '
                 f'text-anchor="middle" class="axis">{e(ylabel)}</text>')
    for s in series:
        points = [(x, y) for x, y in s["points"] if y is not None]
        if not points:
            continue
        dash = f' stroke-dasharray="{s["dash"]}"' if s.get("dash") else ""
        opacity = ' opacity=".45"' if s.get("ghost") else ""
        path = " ".join(f"{'M' if i == 0 else 'L'}{sx(x):.1f},{sy(y):.1f}"
                        for i, (x, y) in enumerate(points))
        parts.append(f'<path d="{path}" fill="none" stroke="{s["colour"]}" '
                     f'stroke-width="{s.get("width", 2)}" stroke-linejoin="round"{dash}'
                     f'{opacity}><title>{e(s["name"])}</title></path>')
        for x, lo, hi in s.get("ranges", ()):
            if lo is None or hi is None:
                continue
            parts.append(f'<line x1="{sx(x):.1f}" x2="{sx(x):.1f}" y1="{sy(lo):.1f}" '
                         f'y2="{sy(hi):.1f}" stroke="{s["colour"]}" stroke-width="1.4"/>')
        if markers and not s.get("ghost"):
            for x, y in points:
                parts.append(f'<circle cx="{sx(x):.1f}" cy="{sy(y):.1f}" r="4" '
                             f'fill="{s["colour"]}"><title>{e(s["name"])}: '
                             f'{e(fmt_tick(round(y, 1)))} at {e(name_x(x))}</title></circle>')
    parts.append("</svg>")
    return "".join(parts) + legend([(s["name"], s["colour"], s.get("dash", ""))
                                    for s in series if not s.get("ghost")])
