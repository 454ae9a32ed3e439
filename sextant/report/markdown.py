"""The report as Markdown: the same sections as the HTML page, charts given as tables."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sextant.claims import HOLDS, INCONCLUSIVE, NOT_HOLD, NOT_MEASURED
from sextant.core.display import fmt_bytes_mb, fmt_ms, fmt_rate, fmt_share, fmt_signed_pct
from sextant.report.model import (
    ACCELERATOR_COLUMNS,
    DEPLOY_COLUMNS,
    accelerator_rows,
    deploy_cells,
    speedup_cell,
)
from sextant.report.types import Report


def md(text: Any) -> str:
    """Escape what would break a table cell or start Markdown/HTML markup."""
    out = str(text).replace("\\", "\\\\").replace("|", "\\|").replace("\n", " ")
    for ch in "*_`[]<>#":
        out = out.replace(ch, "\\" + ch)
    return out


def code(text: Any) -> str:
    s = str(text).replace("\n", " ").replace("|", "\\|")
    fence = "``" if "`" in s else "`"
    return f"{fence}{s}{fence}"


def _x(v: float | None) -> str:
    return "-" if v is None else f"{v:.2f}x"


def _table(head: Sequence[str], rows: Sequence[Sequence[Any]], left: int = 1) -> list[str]:
    align = ["---" if i < left else "---:" for i in range(len(head))]
    lines = ["| " + " | ".join(md(h) for h in head) + " |", "|" + "|".join(align) + "|"]
    lines += ["| " + " | ".join(md(c) for c in row) + " |" for row in rows]
    return lines


def markdown_from_report(report: Report) -> str:
    w = report["workload"]
    s = report["summary"]
    rec = report["recommendation"]
    fp = report["environment"]["fingerprint"]
    lines = [f"# sextant report: {md(w.get('name', '?'))}", ""]
    lines += [f"{md(w.get('description') or '')} · {len(report['runs'])} runs · "
              f"{md(str(report.get('created_at') or '')[:16])} · {md(fp.get('cpu') or '-')}, "
              f"{md(fp.get('cpu_count') or '?')} cores", ""]

    lines += ["## Recommendation", ""]
    if rec["source"] == "advisor":
        lines += [f"**Recommended stack: {md(rec['top'])}** (profile {md(rec['profile'])}). "
                  f"{md(rec['headline'])}", ""]
        lines += [f"- {r['delta']:+g} {md(r['rationale'] or r['id'])} ({md(r['source'])})"
                  for r in rec["reasons"][:4]]
        lines += ["", f"Cost of ownership ${rec['tco_usd']:,.0f} (compute "
                      f"${rec['compute_usd']:,.0f}, people ${rec['people_usd']:,.0f}).", ""]
        if rec.get("hours_source"):
            lines += [f"Training {rec['training_hours']:,.0f} hours: "
                      f"{md(rec['hours_source'])}.", ""]
        lines += _table(("#", "stack", "score", "TCO", "key reasons"),
                        [(r["rank"], r["candidate"], f"{r['score']:.2f}",
                          f"${r['tco_usd']:,.0f}", ", ".join(r["reasons"]))
                         for r in rec["ranking"]], left=2)
        lines += [""] + [f"- {md(n)}" for n in rec["notes"]]
    else:
        f = s["fastest"]
        if f:
            from sextant.report.model import headline_text

            title, sentence = headline_text(s)
            lines.append(f"**Measured on this machine: {md(title)}**, "
                         f"{fmt_rate(f['tokens_per_s'])} tokens/s, "
                         f"{fmt_ms(f['step_time_s'])} ms per step (median); {md(sentence)}")
        for d in s.get("disturbed") or []:
            lines.append(f"- Disturbed (left out of verdicts; re-run on a quiet machine): "
                         f"{md(d['run'])}, runs {', '.join(str(i) for i in d['ids'])}")
        lines += ["", "For a recommendation for your team, give a team profile: "
                      f"{code(rec['hint'])}"]
    lines.append("")
    c = s["claims"]
    lines += [f"- Same training in every run: {'yes' if s['parity_ok'] else 'NO'} "
              f"(max |Δloss| {s['parity_max_diff']:.1e})"]
    if s["leanest"]:
        lines.append(f"- Least memory per worker: {md(s['leanest']['run'])}, "
                     f"{fmt_bytes_mb(s['leanest']['peak_rss_bytes'])} MB")
    lines += [f"- Claims: {c[HOLDS]} hold, {c[NOT_HOLD]} do not hold here, "
              f"{c[INCONCLUSIVE]} inconclusive, "
              f"{c[NOT_MEASURED]} not measured", ""]

    lines += ["## Claims check", ""]
    lines += _table(("claim", "measured here", "verdict", "reproduce"), [
        (cl["claim"], cl["figure"] if cl["verdict"] != NOT_MEASURED else cl["reason"],
         cl["verdict"], cl["command"] or "-") for cl in report["claims"]], left=4)
    lines += ["", "Rules:", ""]
    lines += [f"- {md(cl['claim'])}: {md(cl['compared'])}; {md(cl['rule'])}."
              for cl in report["claims"]]
    lines.append("")

    lines += ["## Throughput and step time", ""]
    lines += _table(("run", "workers x threads", "tokens/s", "tokens/s range",
                     "step ms median", "p10-p90", "n", "speed-up [95% CI]", "peak RSS MB/worker",
                     "final loss"), [
        (r["label"], f"{r['workers']} x {r['threads_per_worker'] or '?'}",
         fmt_rate(r["tokens_per_s"]["median"]),
         f"{fmt_rate(r['tokens_per_s']['low'])}-{fmt_rate(r['tokens_per_s']['high'])}",
         fmt_ms(r["step_time_s"]["median"]),
         f"{fmt_ms(r['step_time_s']['p10'])}-{fmt_ms(r['step_time_s']['p90'])}",
         r["step_time_s"]["n"] if r["step_time_s"]["n"] is not None else "-",
         speedup_cell(r),
         fmt_bytes_mb(r["peak_rss_bytes"]),
         f"{r['final_loss']:.4f}" if r["final_loss"] is not None else "-")
        for r in report["runs"]])
    lines.append("")
    on_device = accelerator_rows(report)
    if on_device:
        lines += ["On the accelerator:", ""]
        lines += _table(ACCELERATOR_COLUMNS, on_device)
        lines.append("")

    lines += ["## Scaling with workers", ""]
    sc = report["scaling"]
    if sc["series"]:
        lines += _table(("series", "workers", "tokens/s", "planner", "planner error",
                         "vs one worker", "efficiency"), [
            (x["name"], p["workers"], fmt_rate(p["tokens_per_s"]),
             fmt_rate(p.get("predicted_tokens_per_s")), fmt_signed_pct(p.get("prediction_error")),
             _x(p["speedup_vs_one"]),
             "-" if p["efficiency"] is None else f"{p['efficiency'] * 100:.0f}%")
            for x in sc["series"] for p in x["points"]])
        if sc["predicted_only"]:
            lines += ["", "Predicted, not measured, on this machine:", ""]
            lines += _table(("series", "workers", "tokens/s (planner)", "exposed communication"),
                            [(q["series"], q["workers"], fmt_rate(q["tokens_per_s"]),
                              fmt_share(q["exposed_share"])) for q in sc["predicted_only"]])
        lines += ["", md(sc["prediction_note"])]
    else:
        lines.append("No multi-worker run in this report.")
    lines.append("")

    lines += ["## Scaling vs interconnect", ""]
    ic = report["interconnect"]
    if ic["series"]:
        lines += _table(("series", "link", "hosts", "tokens/s", "efficiency", "planner",
                         "planner error (tokens/s)", "exposed comm"), [
            (x["name"], f"{p['link_gbit']:g} Gbit/s", p["hosts"], fmt_rate(p["tokens_per_s"]),
             fmt_share(p["efficiency"]), fmt_share(p.get("predicted_efficiency")),
             fmt_signed_pct(p.get("prediction_error")), fmt_share(p["exposed_share"]))
            for x in ic["series"] for p in x["points"]])
        lines.append("")
    lines += [md(ic["note"]), ""]

    lines += ["## Communication vs compute", ""]
    if report["communication"]:
        lines += _table(("run", "step with sync ms", "compute ms", "exposed comm ms", "share"), [
            (x["run"], fmt_ms(x["step_s"]), fmt_ms(x["compute_s"]), fmt_ms(x["exposed_comm_s"]),
             fmt_share(x["exposed_comm_share"])) for x in report["communication"]])
    else:
        lines.append("No data-parallel run with exposed communication in this report.")
    lines.append("")

    lines += ["## Memory per rank", ""]
    mem = report["memory"]
    lines += _table(("run", "rank", "at start MB", "growth MB", "peak MB"), [
        (x["run"], "-" if x["rank"] is None else x["rank"], fmt_bytes_mb(x["rss_start_bytes"]),
         fmt_bytes_mb(x["growth_bytes"]), fmt_bytes_mb(x["peak_rss_bytes"]))
        for x in mem["ranks"]])
    if mem["model_state_bytes"]:
        lines += ["", f"Model state (fp32 weights, gradients, Adam moments): "
                      f"{mem['model_state_bytes'] / 2**20:,.1f} MB per replica."]
    lines.append("")

    p = report["parity"]
    lines += ["## Loss parity", ""]
    lines.append(
        f"**Verdict: {'identical data flow' if p['ok'] else 'losses disagree'}**: max |Δloss| "
        f"{p['max_diff']:.1e} against {md(p['reference'])} (threshold {p['atol']:g}).")
    lines.append("")
    steps = max((len(cv["losses"]) for cv in p["curves"]), default=0)
    marks = sorted({0, steps // 2, steps - 1}) if steps else []
    lines += _table(["run", "max |Δloss|"] + [f"loss @ step {k + 1}" for k in marks], [
        [cv["run"], "ref" if i == 0 else ("-" if pr["max_diff"] is None
                                          else f"{pr['max_diff']:.1e}")]
        + [f"{cv['losses'][k]:.4f}" if k < len(cv["losses"]) else "-" for k in marks]
        for i, (cv, pr) in enumerate(zip(p["curves"], p["per_run"]))])
    lines.append("")

    lines += ["## Compile time", ""]
    lines += _table(("run", "mode", "first step s", "steady step ms", "compile s"), [
        (x["run"], x["mode"], f"{x['first_step_s']:.2f}", fmt_ms(x["steady_step_s"]),
         f"{x['compile_s']:.2f}") for x in report["compile"]])
    lines.append("")

    env = report["environment"]
    dep = report.get("deployment")
    if dep:
        lines += ["## Deployment", "", md(dep["summary"]) + ".", ""]
        lines += _table(DEPLOY_COLUMNS, [deploy_cells(r) for r in dep["rows"]], left=5)
        lines += [""]
    lines += ["## Environment", ""]
    lines += _table(("key", "value"), [(k, v) for k, v in sorted(env["fingerprint"].items())]
                    + [(f"{k} version", v) for k, v in sorted(env["framework_versions"].items())],
                    left=2)
    lines += ["", f"sextant {md(report['sextant'])} · group {md(report.get('group_id') or '-')}"
                  f" · how each figure is measured: docs/methodology.md", ""]
    return "\n".join(lines)
