"""Render stored runs as one self-contained HTML page (inline CSS and SVG, nothing fetched).

The page renders the dict of `sextant.report.model.build_report`; every string in it that
came from a user (workload names and descriptions, profile names, paths, labels) is escaped.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from sextant.claims import HOLDS, INCONCLUSIVE, NOT_HOLD, NOT_MEASURED
from sextant.core.display import fmt_bytes_mb, fmt_ms, fmt_rate, fmt_share, fmt_signed_pct
from sextant.core.errors import UserError
from sextant.core.fsutil import atomic_write_text
from sextant.report.charts import (
    DASHES,
    Line,
    StackedBar,
    colour_for,
    e,
    hbar_chart,
    line_chart,
    stacked_hbar_chart,
)
from sextant.measure.agreement import FP32_ATOL as PARITY_ATOL
from sextant.report.model import (
    ACCELERATOR_COLUMNS,
    DEPLOY_COLUMNS,
    accelerator_rows,
    build_report,
    deploy_cells,
)
from sextant.report.types import Report, Summary
from sextant.results.deploy import DeployRecord
from sextant.results.record import RunRecord
from sextant.results.store import ResultsStore, finite_json

__all__ = ["FORMATS", "PARITY_ATOL", "load_advice", "render", "render_html", "write_report"]

FORMATS = ("html", "md", "json")

CSS = """
*{box-sizing:border-box}
body{font-family:system-ui,-apple-system,"Segoe UI",Roboto,"DejaVu Sans",sans-serif;
margin:0;color:#1d2330;background:#f5f6f8;line-height:1.45}
main{max-width:1120px;margin:0 auto;padding:1.6rem 1.4rem 3rem}
h1{font-size:1.75rem;margin:.1rem 0 .2rem}
h2{font-size:1.25rem;margin:0 0 .6rem}
h3{font-size:1rem;margin:1rem 0 .4rem}
.eyebrow{text-transform:uppercase;letter-spacing:.08em;font-size:.75rem;color:#5c6577;
font-weight:600}
.sub{color:#5a6275;margin:0 0 1rem}
section{background:#fff;border:1px solid #e3e6ec;border-radius:10px;padding:1.1rem 1.3rem;
margin:1rem 0}
.hero{display:grid;grid-template-columns:1.35fr 1fr;gap:1.2rem;border-left:6px solid #1864ab}
.hero.advice{border-left-color:#2b8a3e}
.big{font-size:1.9rem;font-weight:700;margin:.1rem 0 .3rem;color:#10243e}
.hero p{margin:.35rem 0}
.why{margin:.4rem 0;padding-left:1.1rem}.why li{margin:.25rem 0}
.hint{background:#fff9db;border:1px solid #ffe066;border-radius:6px;padding:.5rem .7rem;
font-size:.92rem}
.cards{display:grid;grid-template-columns:repeat(4,1fr);gap:.8rem;margin:1rem 0}
.card{background:#fff;border:1px solid #e3e6ec;border-radius:10px;padding:.8rem 1rem}
.card .k{font-size:.78rem;color:#5c6577;text-transform:uppercase;letter-spacing:.05em;
font-weight:600}
.card .v{font-size:1.45rem;font-weight:700;margin:.15rem 0;color:#10243e}
.card .d{font-size:.85rem;color:#4a5263}
.card.good{border-top:4px solid #2b8a3e}.card.warn{border-top:4px solid #e03131}
.card.info{border-top:4px solid #1864ab}.card.neutral{border-top:4px solid #868e96}
table{border-collapse:collapse;width:100%;font-size:.88rem;margin:.5rem 0}
th,td{padding:.4rem .55rem;border-bottom:1px solid #edf0f4;text-align:right;vertical-align:top}
th:first-child,td:first-child{text-align:left}
th{background:#f4f6fa;font-weight:600;color:#343a46}
td.l,th.l{text-align:left}
table.claims td:nth-child(1){width:34%}table.claims td:nth-child(2){width:12%}
table.claims td:nth-child(4){width:27%}table.claims code{font-size:.76rem}
td:not(.l){white-space:nowrap}table:not(.claims) td:first-child{white-space:nowrap}
.pill{display:inline-block;padding:.12rem .55rem;border-radius:999px;font-size:.8rem;
font-weight:600;white-space:nowrap}
.pill.holds{background:#d3f9d8;color:#1b5e20}.pill.nohold{background:#ffe3e3;color:#a51111}
.pill.inc{background:#fff3bf;color:#7a5b00}.pill.nm{background:#e9ecef;color:#495057}
.tag{white-space:nowrap;font-size:.72rem;padding:.05rem .4rem;border-radius:4px;background:#e7f5ff;
color:#1864ab;margin-left:.3rem}.tag.rot{background:#f1f3f5;color:#495057}
.ok{color:#2a7a2a;font-weight:600}.bad{color:#c92a2a;font-weight:600}
.muted,.small{color:#5c6577;font-size:.85rem}
code,pre{font-family:ui-monospace,Menlo,Consolas,"DejaVu Sans Mono",monospace;font-size:.82rem}
code{background:#f1f3f5;padding:.05rem .3rem;border-radius:4px}
pre{background:#f6f7f9;padding:.8rem;overflow-x:auto;border-radius:6px}
svg{display:block;margin:.3rem 0}
svg text{font-family:system-ui,"DejaVu Sans",sans-serif;font-size:12px;fill:#343a46}
svg text.tick{font-size:11px;fill:#6c7587}svg text.axis{font-size:12px;fill:#5c6577}
svg text.val{font-size:11.5px;fill:#212529;font-weight:600}
.legend{font-size:.85rem;margin:.2rem 0 .4rem}
.legend span{display:inline-block;margin-right:1.1rem}
.legend i{display:inline-block;width:18px;height:3px;margin-right:5px;vertical-align:middle}
nav.toc{font-size:.85rem;margin:.2rem 0 0}nav.toc a{margin-right:.9rem;color:#1864ab}
details summary{cursor:pointer;color:#1864ab;margin:.4rem 0}
footer{margin-top:2rem;color:#7a8190;font-size:.8rem}
@media (max-width:800px){.hero{grid-template-columns:1fr}.cards{grid-template-columns:1fr 1fr}}
@media print{body{background:#fff}section{break-inside:avoid}}
"""

VERDICT_CLASS = {HOLDS: "holds", NOT_HOLD: "nohold", INCONCLUSIVE: "inc", NOT_MEASURED: "nm"}
SECTIONS = (("claims", "Claims check"), ("speed", "Throughput"), ("scaling", "Scaling"),
            ("interconnect", "Interconnect"), ("comm", "Communication"), ("memory", "Memory"),
            ("layouts", "Parallel layouts"), ("parity", "Loss parity"),
            ("compile", "Compile time"), ("deployment", "Deployment"),
            ("env", "Environment"))


def _fmt_s(x: float | None) -> str:
    if x is None:
        return "-"
    return f"{x:.2f}" if x < 100 else f"{x:.0f}"


def _x(v: float | None) -> str:
    return "-" if v is None else f"{v:.2f}x"


def _ratio(v: float | None) -> str:
    if v is None:
        return "-"
    return f"{v:,.0f}x" if v >= 10 else f"{v:.1f}x"


def _money(v: float | None) -> str:
    return "-" if v is None else f"${v:,.0f}"


def _pct(v: float | None) -> str:
    return "-" if v is None else f"{v * 100:.0f}%"


def _cells(values: Sequence[Any], left: int = 1) -> str:
    return "".join(f'<td{" class=l" if i < left else ""}>{e(v)}</td>'
                   for i, v in enumerate(values))


def _table(head: Sequence[str], rows: Sequence[Sequence[Any]], left: int = 1) -> str:
    th = "".join(f'<th{" class=l" if i < left else ""}>{e(h)}</th>' for i, h in enumerate(head))
    body = "".join(f"<tr>{_cells(r, left)}</tr>" for r in rows)
    return f"<table><thead><tr>{th}</tr></thead><tbody>{body}</tbody></table>"


def _run_colour(report: Report, label: str) -> str:
    for row in report["runs"]:
        if row["label"] == label:
            return colour_for(row["framework"], row["shade"])
    return "#868e96"


# -- top of the page ----------------------------------------------------------------------

def _hero(report: Report) -> str:
    rec = report["recommendation"]
    s = report["summary"]
    fastest = s["fastest"]
    if rec["source"] == "advisor":
        reasons = "".join(
            f'<li><b>{r["delta"]:+g}</b> {e(r["rationale"] or r["id"])}'
            f'<span class="tag{"" if r["source"] == "measured" else " rot"}">'
            f'{e(r["source"])}</span></li>'
            for r in rec["reasons"][:4]
        ) or "<li>no rule distinguishes the candidates for this profile</li>"
        runner = rec["ranking"][1] if len(rec["ranking"]) > 1 else None
        left = (
            '<div class="eyebrow">Recommended stack</div>'
            f'<div class="big">{e(rec["top"])}</div>'
            + (f'<p class="small">for {e(rec["profile_name"])}</p>'
               if rec.get("profile_name") else "")
            + f'<p>{e(rec["headline"])}</p>'
            f'<ul class="why">{reasons}</ul>'
            f'<p class="small">Cost of ownership {_money(rec["tco_usd"])} (compute '
            f'{_money(rec["compute_usd"])}, people {_money(rec["people_usd"])})'
            + (f'; runner-up {e(runner["candidate"])} at {_money(runner["tco_usd"])}'
               if runner else "") + "</p>"
            + (f'<p class="small">Training {rec["training_hours"]:,.0f} hours: '
               f'{e(rec["hours_source"])}</p>' if rec.get("hours_source") else "")
        )
        ranking = _table(("#", "stack", "score", "cost of ownership"),
                         [(r["rank"], r["candidate"], f'{r["score"]:.2f}', _money(r["tco_usd"]))
                          for r in rec["ranking"][:5]], left=2)
        notes = "".join(f'<p class="small">{e(n)}</p>' for n in rec["notes"])
        profile_path = rec.get("profile")
        profile = Path(profile_path).name if profile_path else "-"
        right = (f'<div class="eyebrow">Ranking</div>{ranking}'
                 f'<p class="small">Team profile <code>{e(profile)}</code>; rules and costs: '
                 f'Full advice below.</p>{notes}')
        return (f'<section class="hero advice"><div>{left}</div><div>{right}</div>'
                '</section>')

    if fastest:
        from sextant.report.model import headline_text

        title, sentence = headline_text(s)
        headline = (f'<div class="big">{e(title)}</div>'
                    f'<p>{e(fmt_rate(fastest["tokens_per_s"]))} tokens/s, '
                    f'{e(fmt_ms(fastest["step_time_s"]))} ms per step (median); '
                    f'{e(sentence)}</p>' + _disturbed_note(s))
    else:
        headline = '<div class="big">No timed run</div>'
    parity = ('<p><span class="ok">Same training in every run</span>: identical weights and '
              'batches, losses agree step by step, so the speeds are comparable.</p>'
              if s["parity_ok"] else
              '<p><span class="bad">The runs did not train the same thing</span>: their losses '
              'disagree, so their speeds are not comparable (see Loss parity).</p>')
    left = f'<div class="eyebrow">Measured on this machine</div>{headline}{parity}'
    right = (f'<div class="eyebrow">Which stack should your team choose?</div>'
             f'<p>This page shows measurements only. For a recommendation that weighs them '
             f'with your team, hardware and deadline, give a team profile:</p>'
             f'<p class="hint"><code>{e(rec["hint"])}</code></p>'
             f'<p class="small">Write your own profile with <code>sextant advise init</code>.'
             f'</p>')
    return f'<section class="hero"><div>{left}</div><div>{right}</div></section>'


def _disturbed_note(s: Summary) -> str:
    if not s.get("disturbed"):
        return ""
    runs = "; ".join(f'{d["run"]} (run {", ".join(str(i) for i in d["ids"])})'
                     for d in s["disturbed"])
    return (f'<p class="small"><span class="bad">Disturbed</span>: another program used the '
            f'CPU while these trials trained, so they are left out of every verdict: '
            f'{e(runs)}. Re-run them on a quiet machine.</p>')


def _cards(report: Report) -> str:
    s = report["summary"]
    cards = []
    f = s["fastest"]
    if f:
        cards.append(("info", "Fastest", fmt_rate(f["tokens_per_s"]) + " tok/s",
                      f'{f["run"]}' + (f', {_x(f["speedup_vs_reference"])} {s["reference"]}'
                                       if f["run"] != s["reference"] else "")))
    if s["parity_ok"]:
        cards.append(("good", "Same training", "Yes",
                      f'losses within {s["parity_max_diff"]:.0e} at every step'))
    else:
        cards.append(("warn", "Same training", "No",
                      f'losses differ by up to {s["parity_max_diff"]:.1e}'))
    lean = s["leanest"]
    if lean:
        detail = lean["run"]
        if lean["heaviest_run"] and lean["heaviest_run"] != lean["run"]:
            detail += (f' (most: {lean["heaviest_run"]}, '
                       f'{fmt_bytes_mb(lean["heaviest_peak_rss_bytes"])} MB)')
        cards.append(("neutral", "Least memory / worker",
                      f'{fmt_bytes_mb(lean["peak_rss_bytes"])} MB', detail))
    c = s["claims"]
    cards.append(("good" if c[HOLDS] else "neutral", "Claims checked",
                  f'{c[HOLDS]} of {sum(c.values())} hold',
                  f'{c[NOT_HOLD]} do not hold here, {c[INCONCLUSIVE]} inconclusive, '
                  f'{c[NOT_MEASURED]} not measured'))
    if len(cards) < 4 and s["scaling"]:
        p = s["scaling"][0]
        cards.append(("neutral", "Scaling", _x(p["speedup_vs_one"]),
                      f'{p["series"]} at {p["workers"]} workers vs one'))
    return '<div class="cards">' + "".join(
        f'<div class="card {cls}"><div class="k">{e(k)}</div><div class="v">{e(v)}</div>'
        f'<div class="d">{e(d)}</div></div>' for cls, k, v, d in cards[:4]
    ) + "</div>"


# -- sections -------------------------------------------------------------------------------

def _claims(report: Report) -> str:
    rows = []
    for c in report["claims"]:
        measured = (e(c["figure"]) if c["verdict"] != NOT_MEASURED
                    else f'<span class="muted">{e(c["reason"])}</span>')
        if c["details"] and c["verdict"] != NOT_MEASURED and len(c["details"]) > 1:
            measured += (f'<details class="small"><summary>all {len(c["details"])} '
                         'comparisons</summary>'
                         + "<br>".join(e(d) for d in c["details"]) + "</details>")
        command = f'<code>{e(c["command"])}</code>' if c["command"] else "-"
        rows.append(
            f'<tr><td class="l"><b>{e(c["claim"])}</b><br><span class="small">'
            f'{e(c["compared"])}; {e(c["rule"])}.</span></td>'
            f'<td class="l"><span class="pill {VERDICT_CLASS[c["verdict"]]}">'
            f'{e(c["verdict"])}</span></td><td class="l">{measured}</td>'
            f'<td class="l">{command}</td></tr>'
        )
    return (
        '<section id="claims"><h2>Claims check: what articles say, what this workload shows'
        '</h2><p class="small">Ratios of step times (mean of each configuration\'s trial '
        'medians) with a 95% confidence interval from a bootstrap over trials and blocks of '
        'steps. A verdict holds or does not hold only when the whole interval is on one side '
        'of the threshold; otherwise, or when only disturbed runs measured it, it is '
        'inconclusive. Rules and thresholds: docs/report.md.</p><table class="claims"><thead><tr>'
        '<th class="l">Claim</th><th class="l">Verdict</th><th class="l">Measured here</th>'
        '<th class="l">Reproduce</th></tr></thead><tbody>' + "".join(rows)
        + "</tbody></table></section>"
    )


def _speed(report: Report) -> str:
    from sextant.report.model import speedup_cell

    runs = report["runs"]
    rows = []
    for r in runs:
        st, t = r["step_time_s"], r["tokens_per_s"]
        rows.append((
            r["label"], f'{r["workers"]} x {r["threads_per_worker"] or "?"}',
            fmt_rate(t["median"]) + (f' ({fmt_rate(t["low"])}-{fmt_rate(t["high"])})'
                                     if t["low"] is not None else ""),
            f'{fmt_ms(st["median"])} ({fmt_ms(st["p10"])}-{fmt_ms(st["p90"])})',
            st["n"] if st["n"] is not None else "-",
            speedup_cell(r),
            fmt_rate(r["achieved_flops_per_s"]) + "FLOP/s"
            if r["achieved_flops_per_s"] is not None else "-",
            fmt_share(r["data_wait_share"]),
            fmt_bytes_mb(r["peak_rss_bytes"]),
            f'{r["final_loss"]:.4f}' if r["final_loss"] is not None else "-",
        ))
    table = _table(("run", "workers x thr", "tokens/s (range)", "step ms median (p10-p90)",
                    "n", "speed-up [95% CI]", "achieved", "data wait", "peak RSS MB/worker",
                    "final loss"), rows)
    on_device = accelerator_rows(report)
    if on_device:
        table += ('<p class="small">On the accelerator: MFU against the planner catalogue\'s '
                  'dense peak for the device at the run\'s effective precision; the planner\'s '
                  'predicted step for one device.</p>' + _table(ACCELERATOR_COLUMNS, on_device))
    chart = hbar_chart(
        [{"name": r["label"], "value": r["tokens_per_s"]["median"],
          "low": r["tokens_per_s"]["low"], "high": r["tokens_per_s"]["high"],
          "colour": colour_for(r["framework"], r["shade"])} for r in runs],
        label="tokens per second per run", unit="tokens/s (median; whisker: p10-p90 steps)",
        fmt=fmt_rate,
    )
    ref = e(report["summary"]["reference"])
    return ('<section id="speed"><h2>Throughput and step time per framework and strategy</h2>'
            f'<p class="small">Higher is better. Speed-up is against {ref}; the whisker is the '
            f'throughput of the p90 and p10 steps.</p>{chart}{table}</section>')


def _scaling(report: Report) -> str:
    sc = report["scaling"]
    if not sc["series"]:
        return ('<section id="scaling"><h2>Scaling with workers</h2><p class="muted">No '
                'multi-worker run in this report: run <code>sextant compare --workers 2</code>.'
                '</p></section>')
    series: list[Line] = []
    for i, s in enumerate(sc["series"]):
        colour = colour_for(s["framework"], s["shade"])
        pts = [(p["workers"], p["tokens_per_s"]) for p in s["points"]]
        series.append({"name": s["name"], "colour": colour, "dash": "", "points": pts,
                       "width": 2.4,
                       "ranges": [(p["workers"], p["low"], p["high"]) for p in s["points"]]})
        base = s["points"][0] if s["points"][0]["workers"] == 1 else None
        if base:
            top = s["points"][-1]["workers"]
            series.append({"name": "linear", "colour": colour, "dash": "4 4", "ghost": True,
                           "width": 1.2, "points": [(1, base["tokens_per_s"]),
                                                    (top, base["tokens_per_s"] * top)]})
        planned = s.get("prediction")
        if planned:
            series.append({"name": f"{s['name']}, planner", "colour": colour, "dash": "1.5 4",
                           "width": 2.0, "points": [(q["workers"], q["tokens_per_s"])
                                                    for q in planned["points"]]})
    chart = line_chart(series, label="throughput by workers", xlabel="workers (replicas)",
                       ylabel="tokens/s", integer_x=True, markers=True, height=300)
    rows = [(s["name"], p["workers"], fmt_rate(p["tokens_per_s"]),
             fmt_rate(p.get("predicted_tokens_per_s")), fmt_signed_pct(p.get("prediction_error")),
             _x(p["speedup_vs_one"]), _pct(p["efficiency"]), p["run"])
            for s in sc["series"] for p in s["points"]]
    table = _table(("series", "workers", "tokens/s", "planner", "planner error",
                    "vs one worker", "efficiency", "run"), rows)
    predicted = ""
    beyond = [(q["series"], q["workers"], fmt_rate(q["tokens_per_s"]), _pct(q["exposed_share"]))
              for q in sc["predicted_only"]]
    if beyond:
        predicted = ('<p class="small">Predicted, not measured, on this machine:</p>'
                     + _table(("series", "workers", "tokens/s (planner)",
                               "exposed communication"), beyond))
    return (f'<section id="scaling"><h2>Scaling with workers</h2><p class="small">Measured '
            f'throughput against worker count (same global batch, split across workers); '
            f'faint dashed lines are perfect linear scaling from one worker. '
            f'{e(sc["prediction_note"])}</p>{chart}{table}{predicted}</section>')


def _interconnect(report: Report) -> str:
    ic = report["interconnect"]
    head = '<section id="interconnect"><h2>Scaling vs interconnect</h2>'
    if not ic["series"]:
        return f'{head}<p class="muted">{e(ic["note"])}</p></section>'
    series: list[Line] = []
    rows: list[tuple[Any, ...]] = []
    for i, s in enumerate(ic["series"]):
        colour = colour_for(s["framework"], i)
        series.append({"name": s["name"], "colour": colour, "dash": "", "width": 2.4,
                       "points": [(math.log10(p["link_gbit"]), p["efficiency"])
                                  for p in s["points"]]})
        if s["prediction"]:
            series.append({"name": f"{s['name']}, planner", "colour": colour, "dash": "1.5 4",
                           "width": 2.0, "points": [(math.log10(q["link_gbit"]), q["efficiency"])
                                                    for q in s["prediction"]]})
        rows += [(s["name"], f"{p['link_gbit']:g} Gbit/s", p["hosts"], fmt_rate(p["tokens_per_s"]),
                  _pct(p["efficiency"]), _pct(p.get("predicted_efficiency")),
                  fmt_signed_pct(p.get("prediction_error")), _pct(p["exposed_share"]), p["id"])
                 for p in s["points"]]
    ticks = {math.log10(g): f"{g:g}" for g in (0.1, 1, 10, 100, 400)}
    chart = line_chart(series, label="scaling efficiency by link rate",
                       xlabel="link rate, Gbit/s (log scale)", ylabel="efficiency",
                       markers=True, height=300, x_labels=ticks,
                       x_format=lambda v: f"{10 ** v:.3g} Gbit/s")
    table = _table(("series", "link", "hosts", "tokens/s", "efficiency", "planner",
                    "planner error (tokens/s)", "exposed comm", "run"), rows)
    return (f'{head}<p class="small">Efficiency of runs across emulated hosts: tokens/s over '
            f'(ranks x tokens/s of one process on one host; emulated hosts share this '
            f'machine\'s cores, which the one process has all of). {e(ic["note"])}</p>'
            f'{chart}{table}</section>')


def _comm(report: Report) -> str:
    comm = report["communication"]
    if not comm:
        return ('<section id="comm"><h2>Communication vs compute</h2><p class="muted">No '
                'data-parallel run with exposed communication in this report.</p></section>')
    chart = stacked_hbar_chart(
        [{"name": c["run"], "values": [c["compute_s"] * 1e3, max(0.0, c["exposed_comm_s"]) * 1e3]}
         for c in comm],
        [("compute (step - exposed comm)", "#4dabf7"), ("exposed communication", "#f76707")],
        label="compute and exposed communication per step", unit="ms per synced step",
        fmt=lambda v: f"{v:.1f} ms",
    )
    rows = [(c["run"], fmt_ms(c["step_s"]), fmt_ms(c["nosync_step_s"]), fmt_ms(c["compute_s"]),
             fmt_ms(c["exposed_comm_s"]), fmt_share(c["exposed_comm_share"])) for c in comm]
    table = _table(("run", "step with sync ms", "without sync ms", "compute ms",
                    "exposed comm ms", "share"), rows)
    return ('<section id="comm"><h2>Communication vs compute</h2><p class="small">Exposed '
            'communication = median difference of alternating steps with and without gradient '
            'synchronisation (same workers, same step); it is the part of the all-reduce the '
            'step waits for. A negative value is noise and is drawn as zero.</p>'
            f'{chart}{table}</section>')


def _memory(report: Report) -> str:
    mem = report["memory"]
    ranks = mem["ranks"]
    if not ranks:
        return ('<section id="memory"><h2>Memory per rank</h2><p class="muted">No memory '
                'measured.</p></section>')
    rows_chart: list[StackedBar] = []
    for r in ranks:
        name = r["run"] + (f' · rank {r["rank"]}' if r["rank"] is not None else "")
        if r["rss_start_bytes"] is not None and r["growth_bytes"] is not None:
            values = [r["rss_start_bytes"] / 2**20, max(0.0, r["growth_bytes"]) / 2**20]
        else:
            values = [r["peak_rss_bytes"] / 2**20 if r["peak_rss_bytes"] else 0.0, 0.0]
        rows_chart.append({"name": name, "values": values})
    chart = stacked_hbar_chart(
        rows_chart, [("resident when training starts (runtime, libraries, model)", "#748ffc"),
                     ("growth during training (activations, optimizer, caches)", "#f783ac")],
        label="peak resident memory per rank", unit="MB (peak RSS)",
        fmt=lambda v: f"{v:,.0f} MB",
    )
    state = mem["model_state_bytes"]
    note = (f' Model state (fp32 weights, gradients and Adam moments, 16 bytes x '
            f'{mem["params"]:,.0f} parameters) is {state / 2**20:,.1f} MB per replica: the '
            f'rest is the framework itself.' if state else "")
    rows = [(r["run"], "-" if r["rank"] is None else r["rank"],
             fmt_bytes_mb(r["rss_start_bytes"]), fmt_bytes_mb(r["growth_bytes"]),
             fmt_bytes_mb(r["peak_rss_bytes"]), fmt_ms(r["step_time_median_s"]),
             fmt_ms(r["data_wait_median_s"]), r["threads"] if r["threads"] is not None else "-")
            for r in ranks]
    table = _table(("run", "rank", "at start MB", "growth MB", "peak MB", "step ms median",
                    "data wait ms", "threads"), rows)
    return (f'<section id="memory"><h2>Memory per rank</h2><p class="small">Peak resident '
            f'set of each worker process during training (VmHWM, reset before the first '
            f'step).{e(note)}</p>{chart}{table}</section>')


def _layouts(report: Report) -> str:
    rows = report.get("layouts")
    head = '<section id="layouts"><h2>Parallel layouts: control vs automation</h2>'
    if not rows:
        return (f'{head}<p class="muted">No tensor- or pipeline-parallel run in this report '
                "(<code>sextant compare layouts</code> runs the spectrum).</p></section>")

    def mb(v: float | None) -> str:
        return "-" if v is None else f"{v / 2**20:.3f}"

    table = _table(
        ("run", "step ms", "comm MB/step", "params MB/rank", "optimizer MB/rank",
         "stage idle", "sextant code lines"),
        [(r["label"], "-" if r["step_time_s"] is None else f'{r["step_time_s"] * 1e3:.1f}',
          mb(r["comm_bytes_per_step"]), mb(r["param_bytes"]), mb(r["optimizer_bytes"]),
          _pct(r["stage_idle_share"]),
          "-" if r["code_lines"] is None else r["code_lines"]) for r in rows])
    return (f'{head}<p class="small">The same model split different ways. Communication: '
            "payload bytes of the collectives one step issued on rank 0, counted from the "
            "framework's own collectives (torch), read from the compiled program (JAX), or "
            "planned from the gradient size (data parallel). Stage idle: the largest share of "
            "a pipeline step a stage spends without its own compute (the bubble and the "
            "hand-offs). Code lines: lines of sextant code specific to the layout (what is "
            "shared by all is not counted): declared layouts need a few, hand-written ones "
            f"write their collectives out (docs/parallelism.md).</p>{table}</section>")


def _parity(report: Report) -> str:
    p = report["parity"]
    series: list[Line] = []
    for i, c in enumerate(p["curves"]):
        colour = _run_colour(report, c["run"])
        series.append({"name": c["run"], "colour": colour, "dash": DASHES[i % len(DASHES)],
                       "width": max(1.3, 4.5 - i * 0.6),
                       "points": [(k + 1, v) for k, v in enumerate(c["losses"])
                                  if isinstance(v, int | float) and math.isfinite(v)]})
    chart = line_chart(series, label="loss by step", xlabel="step", ylabel="loss", height=300)
    if p["ok"]:
        verdict = (f'<span class="ok">identical data flow</span>: every run\'s loss stays within '
                   f'{p["max_diff"]:.1e} of {e(p["reference"])} at every step '
                   f'(threshold {p["atol"]:g})')
    else:
        verdict = (f'<span class="bad">losses disagree</span> by up to {p["max_diff"]:.2e}: '
                   'the runs did not train the same thing, so their speeds are not comparable')
    rows = [(r["run"], r["precision"],
             "ref" if r["max_diff"] is None and r["run"] == p["reference"]
             else ("-" if r["max_diff"] is None else f'{r["max_diff"]:.1e}'),
             (("agrees" if r["agrees"] else "DISAGREES") + f' ({r["rule"]})')
             if r["held_to_parity"] else f'not held: {r["why_not"]}')
            for r in p["per_run"]]
    table = _table(("run", "precision", "max |Δloss| vs fp32", "agreement"), rows)
    note = f'<p class="small">{e(p["note"])}.</p>' if p["note"] else ""
    return ('<section id="parity"><h2>Loss curves: the parity proof</h2>'
            f'<p><b>Verdict:</b> {verdict}.</p><p class="small">Same initial weights and the '
            'same global batches in every run: in fp32 the curves lie on top of each other. A '
            f'curve that leaves the others means a bug in that run\'s data flow.</p>{chart}'
            f'{note}{table}</section>')


def _compile(report: Report) -> str:
    comp = report["compile"]
    if not comp:
        return ('<section id="compile"><h2>Compile time</h2><p class="muted">No first-step '
                'time measured.</p></section>')
    chart = stacked_hbar_chart(
        [{"name": c["run"], "values": [min(c["steady_step_s"], c["first_step_s"]),
                                       max(0.0, c["first_step_s"] - c["steady_step_s"])]}
         for c in comp],
        [("a steady step", "#4dabf7"), ("first-step extra (tracing, compilation)", "#fab005")],
        label="first step vs steady step", unit="seconds (first step)",
        fmt=lambda v: f"{v:.2f} s",
    )
    rows = [(c["run"], c["mode"], _fmt_s(c.get("time_to_first_step_s")),
             _fmt_s(c.get("import_s")), _fmt_s(c.get("setup_s")), _fmt_s(c["first_step_s"]),
             fmt_ms(c["steady_step_s"]), _fmt_s(c["compile_s"]),
             _ratio(c["first_over_steady"])) for c in comp]
    table = _table(("run", "mode", "edit-run loop s", "import s", "set-up s", "first step s",
                    "steady step ms", "first-step extra s", "first / steady"), rows)
    return ('<section id="compile"><h2>Compile time: first step vs steady state</h2>'
            '<p class="small">The first step includes tracing and compilation (jit, '
            'torch.compile, XLA); compile = first step - steady median. torch.compile keeps an '
            'on-disk cache, so a second run on the same machine compiles faster '
            '(docs/methodology.md). The edit-run loop is what a developer waits after each '
            'change: from the process start to the first finished step, made of the '
            'framework\'s import, the set-up (building and placing the model, joining the '
            f'other ranks) and the first step.</p>{chart}{table}</section>')


def _deployment(report: Report) -> str:
    dep = report.get("deployment")
    head = '<section id="deployment"><h2>Deployment: the trained model where it serves</h2>'
    if not dep:
        return (head + '<p class="muted">No deployment measured: <code>sextant compare '
                'deploy</code> exports this workload\'s trained weights through each '
                'framework\'s own exporters and measures every artifact.</p></section>')
    chart = hbar_chart(
        [{"name": r["label"], "value": r["b1_ms"], "low": r["b1_low_ms"], "high": r["b1_high_ms"],
          "colour": colour_for(r["framework"], 0)} for r in dep["rows"]
         if r["status"] == "ok" and r["b1_ms"] is not None],
        label="latency at batch 1", unit="ms per call (median, 95% CI)",
        fmt=lambda v: f"{v:.2f} ms")
    table = _table(DEPLOY_COLUMNS, [deploy_cells(r) for r in dep["rows"]], left=5)
    source = (f'run {dep["source_run"]}' if dep["source_run"] is not None else "one run")
    return (head + f'<p class="small">Every artifact holds the final weights of {e(source)} '
            f'(sha256 {e(dep["params_sha256"][:12])}), exported by its framework\'s own '
            f'exporter and served in a fresh process on {dep["threads"]} pinned thread(s). '
            f'Parity: the largest logit difference over the largest reference logit, against '
            f'the training framework\'s eager forward on held-out batches (match within '
            f'1e-4; a quantized artifact shows its held-out loss change instead). Other '
            f'shape: run at another batch and sequence length than exported (works, refused, '
            f'or silently wrong). Generation: 32 greedy tokens against the trainer\'s. Cold '
            f'start: process start to first output.</p><p>{e(dep["summary"])}.</p>'
            f'{chart}{table}</section>')


def _env(report: Report) -> str:
    env = report["environment"]
    rows = [(k, "-" if v is None else v) for k, v in sorted(env["fingerprint"].items())]
    rows += [(f"{fw} version", v) for fw, v in sorted(env["framework_versions"].items())]
    workload = json.dumps(report["workload"], indent=2, sort_keys=True)
    return ('<section id="env"><h2>Environment</h2>'
            + _table(("", "value"), rows, left=2)
            + f'<details><summary>Workload definition (hash {e(report["workload_hash"] or "-")})'
              f'</summary><pre>{e(workload)}</pre></details></section>')


def _advice_details(report: Report) -> str:
    rec = report["recommendation"]
    if rec["source"] != "advisor":
        return ""
    a = rec["advice"]
    fired = _table(("rule", "source", "effect", "rationale"), [
        (f["id"], f["source"],
         ("excludes " + ", ".join(f["excludes"])) if f["excludes"]
         else ", ".join(f"{c} {d:+g}" for c, d in f["effect"].items()) or "none",
         f["rationale"] + (f' ({f["detail"]})' if f["detail"] else ""))
        for f in a["fired"]], left=4)
    evidence = _table(("candidate", "metric", "value", "source", "how"), [
        (x["candidate"], x["metric"], f'{x["value"]:.3g}', x["source"], x["detail"])
        for x in a["evidence"]], left=2)
    assumptions = "".join(f"<li>{e(x)}</li>" for x in a["assumptions"])
    breaks = "".join(f'<li>{e(b["label"])}: {e(b["new_top"])} ranks first at '
                     f'{b["value"]:,.4g} (now {b["current"]:,.4g})</li>'
                     for b in a["sensitivity"]["break_evens"])
    return ('<section id="advice"><h2>Full advice</h2><details><summary>Rules that fired, '
            'evidence, cost assumptions and sensitivity</summary>'
            f'<h3>Rules that fired</h3>{fired}<h3>Evidence</h3>{evidence}'
            f'<h3>Cost assumptions</h3><ul>{assumptions}</ul>'
            f'<h3>Sensitivity</h3><p>{e(a["sensitivity"]["headline"])}</p><ul>{breaks}</ul>'
            '</details></section>')


def html_from_report(report: Report) -> str:
    w = report["workload"]
    fp = report["environment"]["fingerprint"]
    frameworks = sorted({r["framework"] for r in report["runs"]})
    machine = ", ".join(str(x) for x in (
        fp.get("cpu"), f'{fp["cpu_count"]} cores' if fp.get("cpu_count") else None,
        fp.get("gpu")) if x)
    sub = " · ".join(x for x in (
        str(w.get("description") or ""), f'{len(report["runs"])} runs',
        str(report.get("created_at") or "")[:16].replace("T", " "), machine) if x)
    toc = "".join(f'<a href="#{k}">{e(v)}</a>' for k, v in SECTIONS)
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>sextant report: {e(w.get('name', '?'))}</title><style>{CSS}</style></head>
<body><main>
<div class="eyebrow">sextant report</div>
<h1>{e(w.get('name', '?'))} on {e(', '.join(frameworks))}</h1>
<p class="sub">{e(sub)}</p>
{_hero(report)}
{_cards(report)}
<nav class="toc">{toc}</nav>
{_claims(report)}
{_speed(report)}
{_scaling(report)}
{_interconnect(report)}
{_comm(report)}
{_memory(report)}
{_layouts(report)}
{_parity(report)}
{_compile(report)}
{_deployment(report)}
{_advice_details(report)}
{_env(report)}
<footer>sextant {e(report['sextant'])} · group {e(report.get('group_id') or '-')} · written
{e(report['generated_at'][:16].replace('T', ' '))} · how each figure is measured:
docs/methodology.md · how to read this page: docs/report.md</footer>
</main></body></html>
"""


def render_html(runs: Sequence[RunRecord], *, advice: Any = None,
                profile_path: str | None = None, group_id: str | None = None,
                machine: Any = None) -> str:
    """The HTML page of `runs` (one compare group; the first run is the reference)."""
    return render(runs, "html", advice=advice, profile_path=profile_path, group_id=group_id,
                  machine=machine)


def render(runs: Sequence[RunRecord], fmt: str = "html", *, advice: Any = None,
           profile_path: str | None = None, group_id: str | None = None,
           machine: Any = None, related: Sequence[RunRecord] | None = None,
           deployments: Sequence[DeployRecord] = ()) -> str:
    """The report of `runs` in one of FORMATS (`machine`: see build_report)."""
    if fmt not in FORMATS:
        raise UserError(f"unknown report format {fmt!r}; allowed: {', '.join(FORMATS)}")
    report = build_report(runs, advice=advice, profile_path=profile_path, group_id=group_id,
                          machine=machine, related=related, deployments=deployments)
    if fmt == "json":
        return json.dumps(finite_json(report), indent=1, sort_keys=True, default=str) + "\n"
    if fmt == "md":
        from sextant.report.markdown import markdown_from_report

        return markdown_from_report(report)
    return html_from_report(report)


def load_advice(profile: str | Path, runs: Sequence[RunRecord],
                plan: str | Path | None = None, deployments: Sequence[DeployRecord] = ()
                ) -> Any:
    """The advisor's Advice for a team profile, with these runs and deployment rows as
    measured evidence (and a planner result for the training hours, when given)."""
    from sextant.advisor import advise, evidence_from_runs, load_profile
    from sextant.advisor.evidence import evidence_from_deployments
    from sextant.advisor.planned import load_plan

    team = load_profile(profile)
    planned = load_plan(plan, team) if plan is not None else None
    from sextant.advisor.evidence import applicable

    runs, elsewhere = applicable(runs, team.hardware)
    evidence = evidence_from_runs(runs) + evidence_from_deployments(deployments,
                                                                    team.deployment)
    notes = [elsewhere] if elsewhere else []
    if not any(x.metric == "throughput_ratio" for x in evidence):
        notes.append("No two frameworks measured on the same configuration in this report: "
                     "compute costs use rules of thumb.")
    return advise(team, evidence, None, notes, planned)


def report_text(store: ResultsStore, *, group_id: str | None = None, fmt: str = "html",
                profile: str | Path | None = None, calibration: str | Path | None = None,
                plan: str | Path | None = None, deploy_group: str | None = None) -> str:
    """The report of one compare group (default: the latest). The scaling prediction uses
    `calibration`, else calibration.json next to the results database, else
    ./sextant-results/calibration.json; without one, measured points only."""
    from sextant.planner.local import load_machine

    if fmt not in FORMATS:
        raise UserError(f"unknown report format {fmt!r}; allowed: {', '.join(FORMATS)}")
    group = group_id or store.latest_group()
    if group is None:
        raise UserError(f"no compare results in {store.path}; run 'sextant compare' first")
    runs = store.runs(group_id=group)
    if not runs:
        raise UserError(f"no runs of group {group!r} in {store.path}; "
                        "'sextant runs list' shows the stored runs")
    deployments = deployments_of(store, runs[0].workload_hash, deploy_group)
    advice = load_advice(profile, runs, plan, deployments) if profile is not None else None
    return render(runs, fmt, advice=advice,
                  profile_path=str(profile) if profile is not None else None, group_id=group,
                  machine=load_machine(calibration, Path(store.path).parent),
                  related=store.runs(workload_hash=runs[0].workload_hash),
                  deployments=deployments)


def deployments_of(store: ResultsStore, workload_hash: str, group: str | None = None
                   ) -> list[DeployRecord]:
    """The deployment rows the report shows: those of `group`, else the workload's latest
    deployment group (none: the report has no deployment section)."""
    if group is not None:
        return store.deployments(group_id=group)
    rows = store.deployments(workload_hash=workload_hash)
    return [r for r in rows if r.group_id == rows[-1].group_id] if rows else []


def write_report(store: ResultsStore, path: str | Path, **options: Any) -> Path:
    """Write `report_text(store, **options)` to `path` atomically."""
    path = Path(path)
    atomic_write_text(path, report_text(store, **options))
    return path
