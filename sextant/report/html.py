"""Render stored runs as one self-contained HTML page (inline CSS and SVG, nothing fetched).

Every string that came from a user (workload names, descriptions, paths) is escaped.
"""

from __future__ import annotations

import html
import json
import time
from pathlib import Path
from typing import Any

from sextant import __version__
from sextant.commands.common import fmt_bytes_mb, fmt_ms, fmt_rate, fmt_share, max_loss_diff
from sextant.errors import UserError
from sextant.fsutil import atomic_write_text
from sextant.results.store import ResultsStore

PALETTE = ("#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#17becf", "#8c564b",
           "#e377c2", "#7f7f7f", "#bcbd22")

CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:2rem auto;
max-width:1100px;color:#1d2330;padding:0 1rem}
h1{font-size:1.6rem;margin-bottom:.2rem}h2{font-size:1.2rem;margin-top:2rem;
border-bottom:1px solid #dde;padding-bottom:.3rem}
.sub{color:#5a6275;margin-top:0}
table{border-collapse:collapse;width:100%;font-size:.9rem;margin:.5rem 0}
th,td{padding:.35rem .6rem;border-bottom:1px solid #e6e8ef;text-align:right}
th:first-child,td:first-child{text-align:left}th{background:#f4f6fa}
.callout{background:#f4f8ff;border-left:4px solid #1f77b4;padding:.8rem 1rem;margin:1rem 0}
.ok{color:#2a7a2a;font-weight:600}.bad{color:#b22;font-weight:600}
code,pre{font-family:ui-monospace,Menlo,Consolas,monospace;font-size:.85rem}
pre{background:#f6f7f9;padding:.8rem;overflow-x:auto}
svg text{font-family:system-ui,sans-serif;font-size:11px;fill:#333}
.legend span{display:inline-block;margin-right:1rem;font-size:.85rem}
.legend i{display:inline-block;width:12px;height:3px;margin-right:4px;vertical-align:middle}
footer{margin-top:3rem;color:#7a8190;font-size:.8rem}
"""

# fp32 loss agreement considered "identical data flow" in the report's verdict; the tests
# hold backends to tighter, per-case tolerances (docs/methodology.md).
PARITY_ATOL = 1e-3


def e(value: Any) -> str:
    return html.escape(str(value), quote=True)


def _line_chart(series: list[tuple[str, list[float]]], *, width: int = 760, height: int = 300,
                xlabel: str = "step", ylabel: str = "loss") -> str:
    points = [v for _, ys in series for v in ys]
    if not points:
        return "<p>No data.</p>"
    lo, hi = min(points), max(points)
    span = (hi - lo) or 1.0
    n = max(len(ys) for _, ys in series)
    left, right, top, bottom = 56, 16, 12, 36
    w, h = width - left - right, height - top - bottom

    def x(i: int) -> float:
        return left + (w * i / max(1, n - 1))

    def y(v: float) -> float:
        return top + h * (1 - (v - lo) / span)

    parts = [f'<svg viewBox="0 0 {width} {height}" width="100%" role="img" '
             f'aria-label="{e(ylabel)} by {e(xlabel)}">']
    for k in range(5):
        v = lo + span * k / 4
        parts.append(f'<line x1="{left}" x2="{left + w}" y1="{y(v):.1f}" y2="{y(v):.1f}" '
                     f'stroke="#e6e8ef"/><text x="{left - 6}" y="{y(v) + 4:.1f}" '
                     f'text-anchor="end">{v:.3g}</text>')
    for k in range(0, n, max(1, n // 8)):
        parts.append(f'<text x="{x(k):.1f}" y="{top + h + 16}" text-anchor="middle">{k + 1}</text>')
    parts.append(f'<text x="{left + w / 2}" y="{height - 4}" text-anchor="middle">{e(xlabel)}</text>')
    for idx, (name, ys) in enumerate(series):
        color = PALETTE[idx % len(PALETTE)]
        dash = ' stroke-dasharray="6 4"' if idx % 2 else ""
        path = " ".join(f"{'M' if i == 0 else 'L'}{x(i):.1f},{y(v):.1f}" for i, v in enumerate(ys))
        parts.append(f'<path d="{path}" fill="none" stroke="{color}" stroke-width="1.6"{dash}>'
                     f'<title>{e(name)}</title></path>')
    parts.append("</svg>")
    legend = "".join(
        f'<span><i style="background:{PALETTE[i % len(PALETTE)]}"></i>{e(name)}</span>'
        for i, (name, _) in enumerate(series)
    )
    return "".join(parts) + f'<div class="legend">{legend}</div>'


def _range_chart(rows: list[tuple[str, float, float, float]], *, unit: str = "ms") -> str:
    """Horizontal bars of medians with p10-p90 whiskers."""
    if not rows:
        return ""
    hi = max(r[3] for r in rows) or 1.0
    left, width, bar = 190, 760, 22
    height = 20 + bar * len(rows) + 20
    scale = (width - left - 70) / hi
    parts = [f'<svg viewBox="0 0 {width} {height}" width="100%" role="img" '
             f'aria-label="step time per run">']
    for i, (name, median, p10, p90) in enumerate(rows):
        y0 = 10 + i * bar
        color = PALETTE[i % len(PALETTE)]
        parts.append(
            f'<text x="{left - 8}" y="{y0 + 14}" text-anchor="end">{e(name)}</text>'
            f'<rect x="{left}" y="{y0 + 3}" width="{median * scale:.1f}" height="{bar - 8}" '
            f'fill="{color}" opacity=".75"><title>median {median:.2f} {unit}</title></rect>'
            f'<line x1="{left + p10 * scale:.1f}" x2="{left + p90 * scale:.1f}" '
            f'y1="{y0 + bar / 2:.1f}" y2="{y0 + bar / 2:.1f}" stroke="#222" stroke-width="1.5"/>'
            f'<text x="{left + p90 * scale + 6:.1f}" y="{y0 + 14}">{median:.1f} {unit}</text>'
        )
    parts.append("</svg>")
    return "".join(parts)


def render_html(runs: list[dict[str, Any]]) -> str:
    if not runs:
        raise UserError("no runs to report; run 'sextant compare' first")
    ref = runs[0]
    workload = ref["workload"]
    fastest = min(runs, key=lambda r: r["metrics"]["step_time_median_s"])
    diffs = [max_loss_diff(r["losses"], ref["losses"]) or 0.0 for r in runs]
    worst = max(diffs)
    parity_ok = worst <= PARITY_ATOL
    speedup = ref["metrics"]["step_time_median_s"] / fastest["metrics"]["step_time_median_s"]

    rows = []
    for rec, diff in zip(runs, diffs):
        m = rec["metrics"]
        rows.append(
            "<tr>" + "".join(f"<td>{e(c)}</td>" for c in (
                rec.get("label") or rec["strategy"]["framework"],
                f"{rec['strategy']['workers']} x {m.get('threads_per_worker') or '?'}",
                f"{fmt_ms(m['step_time_median_s'])} ({fmt_ms(m['step_time_p10_s'])}-"
                f"{fmt_ms(m['step_time_p90_s'])}), n={m['steps_timed']}",
                fmt_rate(m["tokens_per_s"]),
                f"{ref['metrics']['step_time_median_s'] / m['step_time_median_s']:.2f}x",
                f"{m['first_step_s']:.2f}",
                fmt_rate(m["achieved_flops_per_s"]) + "FLOP/s",
                fmt_bytes_mb(m["peak_rss_bytes"]),
                fmt_share(m.get("exposed_comm_share")),
                f"{m['final_loss']:.4f}",
                "ref" if rec is ref else f"{diff:.1e}",
            )) + "</tr>"
        )
    rank_rows = []
    for rec in runs:
        for rank in rec["ranks"]:
            st = rank["step_time"]
            rank_rows.append(
                "<tr>" + "".join(f"<td>{e(c)}</td>" for c in (
                    rec.get("label"), rank["rank"], fmt_ms(st["median"]),
                    f"{fmt_ms(st['p10'])}-{fmt_ms(st['p90'])}",
                    fmt_ms(rank["data_wait_median_s"]), fmt_bytes_mb(rank["peak_rss_bytes"]),
                    rank["fingerprint"].get("threads"),
                )) + "</tr>"
            )
    loss_chart = _line_chart([(r.get("label", "?"), r["losses"]) for r in runs])
    time_chart = _range_chart([
        (r.get("label", "?"), r["metrics"]["step_time_median_s"] * 1e3,
         r["metrics"]["step_time_p10_s"] * 1e3, r["metrics"]["step_time_p90_s"] * 1e3)
        for r in runs
    ])
    comm_rows = "".join(
        "<tr>" + "".join(f"<td>{e(c)}</td>" for c in (
            r.get("label"), fmt_ms(r["metrics"].get("sync_step_median_s")),
            fmt_ms(r["metrics"].get("nosync_step_median_s")),
            fmt_ms(r["metrics"].get("exposed_comm_s")),
            fmt_share(r["metrics"].get("exposed_comm_share")),
        )) + "</tr>"
        for r in runs if r["metrics"].get("exposed_comm_s") is not None
    )
    fp = ref["fingerprint"]
    env_rows = "".join(f"<tr><td>{e(k)}</td><td>{e(v)}</td></tr>" for k, v in sorted(fp.items()))
    verdict = (
        f'<span class="ok">identical data flow</span>: every run\'s loss stays within '
        f"{worst:.1e} of {e(ref.get('label'))} at every step"
        if parity_ok else
        f'<span class="bad">losses disagree</span> by up to {worst:.2e}: the runs did not '
        "train the same thing, so their speeds are not comparable"
    )
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>sextant report: {e(workload['name'])}</title><style>{CSS}</style></head>
<body>
<h1>sextant report: {e(workload['name'])}</h1>
<p class="sub">{e(workload.get('description', ''))} &middot; {len(runs)} runs &middot;
{e(ref['created_at'][:19])} &middot; {e(fp.get('cpu'))}, {e(fp.get('cpu_count'))} cores</p>
<div class="callout">
<p><b>Fastest here:</b> {e(fastest.get('label'))}, {fmt_ms(fastest['metrics']['step_time_median_s'])}
ms per step (median), {speedup:.2f}x the speed of {e(ref.get('label'))}.</p>
<p><b>Same training, checked:</b> {verdict}.</p>
</div>
<h2>Runs side by side</h2>
<table><thead><tr><th>run</th><th>workers x threads</th><th>step ms median (p10-p90)</th>
<th>tokens/s</th><th>speed-up</th><th>first step s</th><th>achieved</th>
<th>peak RSS MB/worker</th><th>exposed comm</th><th>final loss</th><th>max |&Delta;loss|</th>
</tr></thead><tbody>{''.join(rows)}</tbody></table>
<h2>Step time (median bar, p10-p90 whisker)</h2>{time_chart}
<h2>Loss curves (the parity proof)</h2>
<p>Same initial weights and the same global batches in every run: in fp32 the curves lie on
top of each other. A curve that leaves the others means a bug in that run's data flow.</p>
{loss_chart}
<h2>Communication vs compute</h2>
{"<p>Exposed communication = median difference of alternating steps with and without "
 "gradient synchronisation (same workers, same step).</p><table><thead><tr><th>run</th>"
 "<th>step with sync ms</th><th>without sync ms</th><th>exposed ms</th><th>share</th></tr>"
 "</thead><tbody>" + comm_rows + "</tbody></table>" if comm_rows else
 "<p>No data-parallel run in this report.</p>"}
<h2>Per rank</h2>
<table><thead><tr><th>run</th><th>rank</th><th>step ms median</th><th>p10-p90</th>
<th>data wait ms</th><th>peak RSS MB</th><th>threads</th></tr></thead>
<tbody>{''.join(rank_rows)}</tbody></table>
<h2>Workload</h2><pre>{e(json.dumps(workload, indent=2))}</pre>
<h2>Environment</h2><table><tbody>{env_rows}</tbody></table>
<footer>sextant {e(__version__)} &middot; written {e(time.strftime('%Y-%m-%d %H:%M'))} &middot;
how each figure is measured: docs/methodology.md</footer>
</body></html>
"""


def write_report(store: ResultsStore, path: str | Path, *, group_id: str | None = None) -> Path:
    """Write the report of one compare group (default: the latest) atomically."""
    group = group_id or store.latest_group()
    if group is None:
        raise UserError(f"no compare results in {store.path}; run 'sextant compare' first")
    runs = store.runs(group_id=group)
    path = Path(path)
    atomic_write_text(path, render_html(runs))
    return path
