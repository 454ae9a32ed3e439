"""Render an Advice: JSON-able dict, Markdown (for the report), and rich for the terminal.

All three show the same content in the same order: ranking, fired rules with rationale,
evidence labelled 'measured' or 'rule of thumb', cost assumptions, the sensitivity line.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from sextant.advisor.engine import Advice, BreakEven, Cost, Ranked, input_text
from sextant.advisor.evidence import Evidence
from sextant.advisor.rules import RuleSet
from sextant.advisor.vocab import MEASURED, PLANNED

if TYPE_CHECKING:
    from rich.console import JustifyMethod


def _serving(advice: Advice) -> bool:
    """Whether the cost of ownership has a serving term (the profile gave its figures)."""
    return any(r.cost.serving_usd for r in advice.ranking)


def _cost_dict(cost: Cost) -> dict[str, Any]:
    return {name: getattr(cost, name) for name in Cost.__slots__}


def to_dict(advice: Advice) -> dict[str, Any]:
    """The whole advice as plain JSON-able data (str, float, int, bool, list, dict)."""
    return {
        "rules_version": advice.rules_version,
        "rules_source": advice.rules_source,
        "profile": advice.profile.to_dict(),
        "top": advice.top,
        "ranking": [
            {
                "rank": r.rank,
                "candidate": r.candidate,
                "score": r.score,
                "fit": r.fit,
                "deadline_penalty": r.deadline_penalty,
                "cost_penalty": r.cost_penalty,
                "tco_usd": r.cost.total_usd,
                "cost": _cost_dict(r.cost),
                "reasons": [{"id": i, "delta": d, "source": s} for i, d, s in r.reasons],
            }
            for r in advice.ranking
        ],
        "excluded": [
            {"candidate": e.candidate, "reasons": [{"id": i, "reason": t} for i, t in e.reasons]}
            for e in advice.excluded
        ],
        "fired": [
            {
                "id": f.id,
                "kind": f.kind,
                "source": f.source,
                "condition": f.condition,
                "rationale": f.rationale,
                "effect": dict(f.effect),
                "excludes": list(f.excludes),
                "detail": f.detail,
            }
            for f in advice.fired
        ],
        "evidence": [e.to_dict() for e in advice.evidence],
        "assumptions": list(advice.assumptions),
        "sensitivity": {
            "top": advice.sensitivity.top,
            "headline": advice.sensitivity.headline,
            "break_evens": [
                {
                    "input": b.input,
                    "label": b.label,
                    "current": b.current,
                    "value": b.value,
                    "change": b.change,
                    "new_top": b.new_top,
                }
                for b in advice.sensitivity.break_evens
            ],
        },
        "notes": list(advice.notes),
    }


def money(value: float) -> str:
    return f"${value:,.0f}"


def effect_text(effect: tuple[tuple[str, float], ...]) -> str:
    return ", ".join(f"{c} {d:+g}" for c, d in effect) or "none"


def reasons_text(ranked: Ranked, limit: int = 3) -> str:
    shown = [f"{d:+g} {i}" + (" (measured)" if s == MEASURED else "")
             for i, d, s in ranked.reasons[:limit]]
    if len(ranked.reasons) > limit:
        shown.append(f"+{len(ranked.reasons) - limit} more")
    return ", ".join(shown) or "no rule applies"


def evidence_value(e: Evidence) -> str:
    if e.metric in ("throughput_ratio", "memory_ratio"):
        return f"{e.value:.2f}x"
    if e.metric in ("scaling_efficiency", "exposed_comm_share"):
        return f"{e.value:.0%}"
    if e.metric == "peak_rss_bytes":
        return f"{e.value / 2**20:,.0f} MiB"
    if e.metric == "compile_time_s":
        return f"{e.value:.1f} s"
    return f"{e.value:,.1f} h"


def break_even_text(b: BreakEven) -> str:
    direction = "above" if b.value > b.current else "below"
    return (f"{b.label[0].upper()}{b.label[1:]} {direction} {input_text(b.input, b.value)} "
            f"({b.change:+.0%} from {input_text(b.input, b.current)}): {b.new_top} ranks first")


def _md(text: str) -> str:
    """Escape what would break a Markdown table cell or start markup."""
    out = str(text).replace("\\", "\\\\").replace("|", "\\|").replace("\n", " ")
    for ch in "*_`[]<>#":
        out = out.replace(ch, "\\" + ch)
    return out


def render_markdown(advice: Advice) -> str:
    """The advice as a Markdown section (headings start at level 2)."""
    p = advice.profile
    title = f"Stack advice: {_md(p.name)}" if p.name else "Stack advice"
    lines = [
        f"## {title}",
        "",
        f"**Recommendation: {_md(advice.top)}.** {_md(advice.sensitivity.headline)}",
        "",
        f"Profile: {_md(p.hardware)} x{p.devices}, {p.model_params:.3g} parameters, "
        f"{_md(p.purpose)}, deploy to {_md(p.deployment)}; rules version "
        f"{advice.rules_version} ({_md(advice.rules_source)}).",
        "",
        "| # | Candidate | Score | TCO | Compute |" + (" Serving |" if _serving(advice) else "")
        + " People | Key reasons |",
        "|---|---|---:|---:|---:|" + ("---:|" if _serving(advice) else "") + "---:|---|",
    ]
    for r in advice.ranking:
        serving = f" {money(r.cost.serving_usd)} |" if _serving(advice) else ""
        lines.append(
            f"| {r.rank} | {_md(r.candidate)} | {r.score:.2f} | {money(r.cost.total_usd)} | "
            f"{money(r.cost.compute_usd)} |{serving} {money(r.cost.people_usd)} | "
            f"{_md(reasons_text(r))} |"
        )
    if advice.excluded:
        lines += ["", "Excluded:"]
        lines += [f"- **{_md(e.candidate)}**: " + "; ".join(f"{_md(t)} (`{i}`)"
                                                          for i, t in e.reasons)
                  for e in advice.excluded]
    lines += ["", "### Rules that fired", "", "| Rule | Source | Effect | Rationale |",
              "|---|---|---|---|"]
    for f in advice.fired:
        effect = (f"excludes {', '.join(f.excludes)}" if f.excludes else effect_text(f.effect))
        rationale = f.rationale + (f" ({f.detail})" if f.detail else "")
        lines.append(f"| `{f.id}` | {f.source} | {_md(effect)} | {_md(rationale)} |")
    if advice.evidence:
        lines += ["", "### Evidence", "", "| Candidate | Metric | Value | Source | How |",
                  "|---|---|---:|---|---|"]
        for e in advice.evidence:
            lines.append(f"| {_md(e.candidate)} | {e.metric} | {evidence_value(e)} | "
                         f"{e.source} | {_md(e.detail)} |")
    lines += ["", "### Cost assumptions", ""]
    lines += [f"- {_md(a)}" for a in advice.assumptions]
    lines += ["", "### Sensitivity", "", _md(advice.sensitivity.headline)]
    if advice.sensitivity.break_evens:
        lines.append("")
        lines += [f"- {_md(break_even_text(b))}" for b in advice.sensitivity.break_evens]
    if advice.notes:
        lines += ["", "### Notes", ""]
        lines += [f"- {_md(n)}" for n in advice.notes]
    return "\n".join(lines) + "\n"


def _source_markup(source: str) -> str:
    # Colour keeps measured and assumed figures apart at a glance; the words carry it too.
    if source == MEASURED:
        return "[green]measured[/green]"
    return f"[cyan]{source}[/cyan]" if source == PLANNED else f"[yellow]{source}[/yellow]"


def print_advice(advice: Advice, console: Any) -> None:
    """Print the advice with rich tables."""
    from rich.markup import escape
    from rich.table import Table

    p = advice.profile
    console.print(f"[bold]Stack advice{': ' + escape(p.name) if p.name else ''}[/bold]  "
                  f"(rules version {advice.rules_version}, {escape(advice.rules_source)})")
    for note in advice.notes:
        console.print(f"[yellow]note:[/yellow] {escape(note)}")
    table = Table(title="Ranking", title_justify="left")
    columns: tuple[tuple[str, JustifyMethod], ...] = (
        ("#", "right"), ("candidate", "left"), ("score", "right"), ("TCO", "right"),
        ("compute", "right"), *((("serving", "right"),) if _serving(advice) else ()),
        ("people", "right"), ("key reasons", "left"))
    for name, justify in columns:
        table.add_column(name, justify=justify)
    for r in advice.ranking:
        style = "bold green" if r.rank == 1 else None
        serving = (money(r.cost.serving_usd),) if _serving(advice) else ()
        table.add_row(str(r.rank), r.candidate, f"{r.score:.2f}", money(r.cost.total_usd),
                      money(r.cost.compute_usd), *serving, money(r.cost.people_usd),
                      escape(reasons_text(r)), style=style)
    console.print(table)
    for e in advice.excluded:
        console.print(f"[dim]excluded {e.candidate}:[/dim] "
                      + "; ".join(f"{escape(t)} ({i})" for i, t in e.reasons))

    fired = Table(title="Rules that fired", title_justify="left")
    for name in ("rule", "source", "effect", "rationale"):
        fired.add_column(name, overflow="fold")
    for f in advice.fired:
        effect = f"excludes {', '.join(f.excludes)}" if f.excludes else effect_text(f.effect)
        source = _source_markup(f.source)
        fired.add_row(f.id, source, escape(effect),
                      escape(f.rationale + (f" ({f.detail})" if f.detail else "")))
    console.print(fired)

    if advice.evidence:
        ev = Table(title="Evidence", title_justify="left")
        for name in ("candidate", "metric", "value", "source", "how"):
            ev.add_column(name, overflow="fold")
        for item in advice.evidence:
            source = _source_markup(item.source)
            ev.add_row(item.candidate, item.metric, evidence_value(item), source,
                       escape(item.detail))
        console.print(ev)

    console.print("[bold]Cost assumptions[/bold]")
    for line in advice.assumptions:
        console.print(f"  - {escape(line)}")
    console.print(f"[bold]Sensitivity:[/bold] {escape(advice.sensitivity.headline)}")
    for b in advice.sensitivity.break_evens:
        console.print(f"  - {escape(break_even_text(b))}")


def rule_rows(rules: RuleSet) -> list[tuple[str, str, str, str, str]]:
    """(kind, id, condition, effect, rationale) for every rule, constraint and evidence rule."""
    rows = [("constraint", c.id, c.when.describe(), f"excludes {', '.join(c.exclude)}", c.reason)
            for c in rules.constraints]
    rows += [("rule", r.id, r.when.describe(), effect_text(r.effect), r.rationale)
             for r in rules.rules]
    rows += [("evidence", e.id,
              f"measured {e.metric} {'>' if e.op == 'gt' else '<'} {e.threshold:g}"
              + (f" and {e.when.describe()}" if e.when.clauses else ""),
              f"each such candidate {e.delta:+g}", e.rationale)
             for e in rules.evidence_rules]
    rows.append(("deadline", rules.deadline_id,
                 "ramp-up + migration days > deadline weeks x "
                 f"{rules.working_days_per_week:g}",
                 f"each such candidate {-rules.deadline_penalty:+g}", rules.deadline_rationale))
    return rows


def rules_markdown(rules: RuleSet) -> str:
    """Every rule as a Markdown table (used for docs/advisor.md)."""
    lines = ["| Kind | Id | When | Effect | Rationale |", "|---|---|---|---|---|"]
    lines += [f"| {k} | `{i}` | {_md(w)} | {_md(e)} | {_md(r)} |"
              for k, i, w, e, r in rule_rows(rules)]
    return "\n".join(lines) + "\n"


def print_rules(rules: RuleSet, console: Any) -> None:
    from rich.markup import escape
    from rich.table import Table

    table = Table(title=f"Advisor rules, version {rules.version} ({rules.source})",
                  title_justify="left")
    for name in ("kind", "id", "when", "effect", "rationale"):
        table.add_column(name, overflow="fold")
    for row in rule_rows(rules):
        table.add_row(*(escape(x) for x in row))
    console.print(table)
