"""The planner against published figures (`sextant plan references`; docs/validation.md).

Every published figure is a record of references.toml: its source, where in the source it
stands (and a verbatim quote where one was transcribed), the query the planner answers, the
published value and the source's split. One checker evaluates every record through a named
evaluator (sextant/planner/evaluators.py) and reports the relative error.

Kinds: 'formula' (follows from a formula: held to 0.5 %, after rounding to the precision the
source prints), 'end-to-end' (throughput, MFU, time to train, memory as allocated: held to
10 %), 'collective' (a published collective benchmark's bus bandwidth: held to 10 %) and 'not
comparable' (shown, counted in no share, the reason in its setting).

Splits: each source is either 'tuning' (its figures may guide changes to the model) or
'held-out' (they may not: a change is judged on them after the fact). A change that improves
the tuning share and worsens the held-out share is not adopted (docs/validation.md).
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

from sextant.core.errors import UserError
from sextant.planner.catalogue import Table
from sextant.planner.evaluators import EVALUATORS, evaluate

DATA = Path(__file__).with_name("references.toml")
KINDS = ("formula", "end-to-end", "collective", "not comparable")
SPLITS = ("tuning", "held-out")
GROUPS = ("pre-training", "fine-tuning")
COUNTED = ("end-to-end", "collective")
"""The kinds whose share within 10 % is reported per split."""
FORMULA_TOLERANCE = 0.005
MEASURED_TOLERANCE = 0.10


@dataclass(kw_only=True, slots=True, frozen=True)
class Source:
    key: str
    title: str
    split: str
    url: str = ""
    group: str = "pre-training"
    """What the source's runs train: 'pre-training', or 'fine-tuning' (LoRA and full
    fine-tuning), whose rows are counted in a share of their own."""


@dataclass(kw_only=True, slots=True, frozen=True)
class Reference:
    id: str
    source: str
    where: str
    quantity: str
    unit: str
    expected: float
    kind: str
    evaluator: str
    query: Table
    setting: str = ""
    quote: str = ""
    command: str = ""
    printed: float | None = None
    """The precision the source prints (0.1 for "1.9 GB"): formula points are compared after
    rounding the planner's figure to it."""
    bound: Table = field(default_factory=dict)
    """Where the source bounds an input instead of stating it (a GPU's peak "between SXM and
    NVL"), the query's changes at the bound's other end: the row's prediction is then the
    interval between the two, and its error the distance from the published figure to the
    interval's nearer end (interval_error)."""


_SOURCE_KEYS = {"title", "split", "url", "group"}
_REFERENCE_KEYS = set(Reference.__slots__)
_REQUIRED = {"id", "source", "where", "quantity", "unit", "expected", "kind", "evaluator", "query"}


def _check_keys(where: str, got: Table, allowed: set[str], required: set[str]) -> None:
    unknown = sorted(set(got) - allowed)
    missing = sorted(required - set(got))
    if unknown or missing:
        raise UserError(
            f"{where}: unknown keys {unknown}, missing keys {missing}; allowed: "
            f"{', '.join(sorted(allowed))}"
        )


def parse(raw: dict[str, Any], where: str = str(DATA)) -> tuple[dict[str, Source], list[Reference]]:
    """Sources and references from a parsed references file, validated."""
    _check_keys(where, raw, {"schema", "sources", "reference"}, {"schema", "sources", "reference"})
    if raw["schema"] != 1:
        raise UserError(f"{where}: schema must be 1. Received: {raw['schema']!r}")
    sources = {}
    for key, entry in raw["sources"].items():
        _check_keys(f"{where} [sources.{key}]", entry, _SOURCE_KEYS, {"title", "split"})
        if entry["split"] not in SPLITS:
            raise UserError(
                f"{where} [sources.{key}]: split must be one of {SPLITS}. "
                f"Received: {entry['split']!r}"
            )
        if entry.get("group", GROUPS[0]) not in GROUPS:
            raise UserError(
                f"{where} [sources.{key}]: group must be one of {GROUPS}. "
                f"Received: {entry['group']!r}"
            )
        sources[key] = Source(key=key, **entry)
    refs, seen = [], set()
    for entry in raw["reference"]:
        rid = entry.get("id", "?")
        _check_keys(f"{where} reference {rid}", entry, _REFERENCE_KEYS, _REQUIRED)
        ref = Reference(**{**entry, "expected": float(entry["expected"])})
        if ref.id in seen:
            raise UserError(f"{where}: reference id {ref.id!r} appears twice")
        seen.add(ref.id)
        problems = [
            f"source {ref.source!r} is not under [sources]" if ref.source not in sources else "",
            f"kind must be one of {KINDS}" if ref.kind not in KINDS else "",
            f"evaluator {ref.evaluator!r} is unknown" if ref.evaluator not in EVALUATORS else "",
            "expected must be > 0" if not ref.expected > 0 else "",
        ]
        problems = [p for p in problems if p]
        if problems:
            raise UserError(f"{where} reference {ref.id}: {'; '.join(problems)}")
        refs.append(ref)
    return sources, refs


@cache
def load(path: Path = DATA) -> tuple[dict[str, Source], list[Reference]]:
    try:
        with path.open("rb") as fh:
            raw = tomllib.load(fh)
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise UserError(f"cannot read the references file {path}: {exc}") from None
    return parse(raw, str(path))


def interval_error(low: float, high: float, published: float) -> float:
    """Relative error of a published figure against a predicted interval: 0 inside it, else
    (nearer end - published) / published."""
    lo, hi = min(low, high), max(low, high)
    if lo <= published <= hi:
        return 0.0
    return ((lo if published < lo else hi) - published) / published


def _merged(query: Table, changes: Table) -> dict[str, object]:
    out = dict(query)
    for key, value in changes.items():
        inner = out.get(key)
        out[key] = (_merged(inner if isinstance(inner, dict) else {}, value)
                    if isinstance(value, dict) else value)
    return out


@dataclass(kw_only=True, slots=True, frozen=True)
class Row:
    """One record evaluated: the published figure, the planner's, and the relative error."""

    id: str
    source: str
    """The source's title and where in it the figure stands."""
    source_key: str
    split: str
    quantity: str
    unit: str
    published: float
    planner: float
    planner_other: float | None
    """The planner at the other end of a bounded input (Reference.bound); None: no bound."""
    error: float
    kind: str
    quote: str
    setting: str
    command: str
    group: str = GROUPS[0]
    """The source's group (Source.group)."""
    convention: str = ""
    """For an MFU row: the figure the planner answers with, named after the way the source
    counts model FLOPs (evaluators.MFU_CONVENTIONS)."""


def check(ref: Reference, source: Source) -> Row:
    """One record evaluated: the planner's figure and its relative error."""
    value = evaluate(ref.evaluator, ref.query)
    compared = value if ref.printed is None else round(value / ref.printed) * ref.printed
    other = evaluate(ref.evaluator, _merged(ref.query, ref.bound)) if ref.bound else None
    error = (
        (compared - ref.expected) / ref.expected
        if other is None
        else interval_error(other, compared, ref.expected)
    )
    return Row(
        id=ref.id,
        source=f"{source.title}, {ref.where}" if ref.where else source.title,
        source_key=source.key,
        split=source.split,
        quantity=ref.quantity,
        unit=ref.unit,
        published=ref.expected,
        planner=value,
        planner_other=other,
        error=error,
        kind=ref.kind,
        quote=ref.quote,
        setting=ref.setting,
        command=ref.command or f"sextant plan references --only {ref.id}",
        group=source.group,
        convention=str(ref.query.get("figure", "")) if ref.unit == "MFU" else "",
    )


def run_references(only: str | None = None, split: str | None = None) -> list[Row]:
    sources, refs = load()
    if split is not None:
        if split not in SPLITS:
            raise UserError(f"split must be one of {', '.join(SPLITS)}. Received: {split!r}")
        refs = [r for r in refs if sources[r.source].split == split]
    if only is not None:
        refs = [r for r in refs if r.id == only]
        if not refs:
            allowed = ", ".join(r.id for r in load()[1])
            raise UserError(f"unknown reference {only!r}; allowed: {allowed}")
    return [check(r, sources[r.source]) for r in refs]


def _share(hits: int, total: int) -> str:
    """hits / total as a percentage, rounded down to 0.1 % so that a share under a threshold
    never prints as reaching it (47/59 is 79.6 %, not "80 %")."""
    tenths = (1000 * hits) // max(total, 1)
    return f"{tenths // 10}.{tenths % 10}%"


def shares(rows: list[Row]) -> dict[str, tuple[int, int]]:
    """(hits, rows) per figure: formula rows within 0.5 %, per split the pre-training
    group's counted rows (end-to-end and collective) within 10 %, and the fine-tuning
    group's counted rows within 10 % apart ('fine-tuning')."""
    formula = [r for r in rows if r.kind == "formula"]
    out = {"formula": (sum(abs(r.error) <= FORMULA_TOLERANCE for r in formula), len(formula))}
    for split in SPLITS:
        counted = [r for r in rows
                   if r.kind in COUNTED and r.split == split and r.group == GROUPS[0]]
        out[split] = (sum(abs(r.error) <= MEASURED_TOLERANCE for r in counted), len(counted))
    tuned = [r for r in rows if r.kind in COUNTED and r.group == GROUPS[1]]
    out[GROUPS[1]] = (sum(abs(r.error) <= MEASURED_TOLERANCE for r in tuned), len(tuned))
    return out


def _split_label(row: Row) -> str:
    """The row's split, with its group when it is not pre-training ('held-out (fine-tuning)')."""
    return row.split if row.group == GROUPS[0] else f"{row.split} ({row.group})"


def by_source(rows: list[Row]) -> list[tuple[str, str, int, int]]:
    """(source key, split, counted rows within 10 %, counted rows) per source with counted
    rows, in the order the rows come; a fine-tuning source's split names its group."""
    out: dict[str, list[Any]] = {}
    for r in rows:
        if r.kind in COUNTED:
            entry = out.setdefault(r.source_key, [_split_label(r), 0, 0])
            entry[1] += abs(r.error) <= MEASURED_TOLERANCE
            entry[2] += 1
    return [(key, split, hits, n) for key, (split, hits, n) in out.items()]


def summary(rows: list[Row]) -> str:
    """The validation summary line (docs/validation.md, `plan references`)."""
    s = shares(rows)
    apart = sum(r.kind == "not comparable" for r in rows)
    counted = [r for r in rows if r.kind != "not comparable"]
    errs = sorted(abs(r.error) for r in counted) or [0.0]
    parts = [f"{len(rows)} references: {s['formula'][0]}/{s['formula'][1]} formula-defined "
             "within 0.5%"]
    for split in SPLITS:
        hits, n = s[split]
        parts.append(f"{split} {hits}/{n} within 10% ({_share(hits, n)})")
    hits, n = s[GROUPS[1]]
    if n:
        parts.append(f"fine-tuning {hits}/{n} within 10% ({_share(hits, n)})")
    not_counted = f", {apart} not comparable (shown, not counted)" if apart else ""
    return (
        ", ".join(parts) + f"{not_counted}; median |error| {errs[len(errs) // 2]:.1%}, "
        f"max {errs[-1]:.1%} (counted rows)."
    )


def _fmt(value: float, unit: str) -> str:
    if unit == "MFU":
        return f"{value:.1%}"
    if unit == "GPU-h":
        return f"{value:,.0f}"
    if unit == "x":
        return f"{value:.2f}"
    return f"{value:,.3g}" if value < 1000 else f"{value:,.0f}"


def _predicted(row: Row) -> str:
    """The planner's figure, or its interval (low-high) where the source bounds an input."""
    if row.planner_other is None:
        return _fmt(row.planner, row.unit)
    lo, hi = sorted((row.planner_other, row.planner))
    return f"{_fmt(lo, row.unit)}-{_fmt(hi, row.unit)}"


def render_references(rows: list[Row], console) -> None:
    from rich.table import Table

    t = Table(title="Planner vs published figures (default assumptions)", title_justify="left")
    for col in ("id", "split", "quantity", "unit", "published", "planner", "error"):
        t.add_column(col, justify="left" if col in ("id", "split", "quantity") else "right")
    for r in rows:
        t.add_row(
            r.id,
            r.split,
            r.quantity,
            r.unit,
            _fmt(r.published, r.unit),
            _predicted(r),
            f"{r.error:+.1%}",
        )
    console.print(t)
    if rows:
        console.print(summary(rows) + " Sources and settings: --json or docs/validation.md")


def references_markdown(rows: list[Row]) -> str:
    """The table of docs/validation.md (`sextant plan references --markdown`)."""
    lines = [
        "| id | split | kind | published (source) | planner | error |",
        "|---|---|---|---|---|---|",
    ]
    for r in rows:
        unit = "" if r.unit in ("MFU", "x") else f" {r.unit}"
        lines.append(
            f"| `{r.id}` | {_split_label(r)} | {r.kind} | {r.quantity}"
            + (f" (counted as `{r.convention}`)" if r.convention else "") + ": "
            f"**{_fmt(r.published, r.unit)}{unit}** "
            f"({r.source}) | {_predicted(r)}{unit} | {r.error:+.1%} |"
        )
    lines += ["", "| source | split | counted rows within 10 % |", "|---|---|---|"]
    for key, split, hits, n in by_source(rows):
        lines.append(f"| `{key}` | {split} | {hits}/{n} ({_share(hits, n)}) |")
    lines.append("")
    lines.append(summary(rows))
    return "\n".join(lines)
