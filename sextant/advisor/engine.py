"""The advisor engine: rules, evidence and cost of ownership -> a ranked, explained advice.

score(c) = rule points(c) - deadline penalty(c) - k * log2(TCO(c) / cheapest TCO)

Rule points come from the rules file (and from evidence rules on measurements); k is
`points_per_tco_doubling`. Because each cost input (GPU price, training hours, engineer
day-rate) enters every TCO linearly and the rule points do not depend on it, the value of
one input at which a challenger ties with the top candidate solves a linear equation: the
sensitivity line is exact, not sampled.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from sextant.advisor.evidence import Evidence
from sextant.advisor.planned import PlannedTraining
from sextant.advisor.profile import TeamProfile
from sextant.advisor.rules import COMPARISONS, RuleSet, load_rules
from sextant.advisor.vocab import BASE_FRAMEWORK, CANDIDATES, MEASURED, PLANNED, RULE_OF_THUMB
from sextant.core.errors import UserError

SENSITIVITY_INPUTS = (
    ("gpu_price_per_hour", "the GPU price per device-hour"),
    ("training_hours", "training hours"),
    ("engineer_cost_per_day", "the engineer day-rate"),
)
"""Inputs the sensitivity line moves, one at a time: (profile key, label)."""
_PLURAL = {"training_hours"}
MIN_TCO_USD = 1.0
"""Costs below a dollar count as a dollar in the cost penalty (they differ by noise only)."""


@dataclass(kw_only=True, slots=True, frozen=True)
class Cost:
    """Total cost of ownership of one candidate, with every factor that produced it."""

    reference_hours: float
    """Training hours on the fastest stack (from a planner result, the profile, or derived
    from tokens)."""
    hours_source: str = ""
    """Where reference_hours comes from, in one line."""
    throughput_factor: float
    """This candidate's throughput relative to the fastest stack (1 = fastest)."""
    throughput_source: str
    """'measured' or 'rule of thumb'."""
    training_hours: float
    """reference_hours / throughput_factor."""
    devices: int
    """Devices trained on."""
    gpu_price_per_hour: float
    """USD per device-hour."""
    compute_usd: float
    """training_hours x devices x gpu_price_per_hour."""
    ramp_up_days_per_engineer: float
    """Days each engineer needs to become productive with this stack."""
    team_size: int
    """Engineers ramping up."""
    migration_days: float
    """Person-days to port the existing code base."""
    person_days: float
    """ramp_up_days_per_engineer x team_size + migration_days."""
    engineer_cost_per_day: float
    """USD per engineer-day."""
    people_usd: float
    """person_days x engineer_cost_per_day."""
    total_usd: float
    """compute_usd + people_usd."""
    calendar_days: float
    """Working days before training can start: ramp-up, plus migration shared by the team."""
    serving_factor: float = 1.0
    """This candidate's serving latency relative to the fastest measured artifact (1 without
    a measured deployment matrix)."""
    serving_hours: float = 0.0
    """Device-hours of serving: the profile's serving hours x serving_factor (0 without the
    profile's serving figures)."""
    serving_usd: float = 0.0
    """serving_hours x gpu_price_per_hour."""

    def linear(self, name: str) -> tuple[float, float]:
        """(a, b) with total_usd = a + b * x, x being the input `name` (others held)."""
        if name == "gpu_price_per_hour":
            return self.people_usd, self.training_hours * self.devices + self.serving_hours
        if name == "training_hours":
            return (self.people_usd + self.serving_usd,
                    self.devices * self.gpu_price_per_hour / self.throughput_factor)
        if name == "engineer_cost_per_day":
            return self.compute_usd + self.serving_usd, self.person_days
        raise ValueError(f"no sensitivity for {name!r}")


@dataclass(kw_only=True, slots=True, frozen=True)
class Fired:
    """A rule, constraint or evidence rule that fired, with what it did."""

    id: str
    """Rule id from the rules file."""
    kind: str
    """'rule', 'constraint', 'evidence' or 'deadline'."""
    source: str
    """'measured' (rests on measurements) or 'rule of thumb'."""
    rationale: str
    """The rule's one-sentence rationale (a constraint's reason)."""
    condition: str
    """The condition, in words."""
    effect: tuple[tuple[str, float], ...] = ()
    """(candidate, score delta) pairs it applied."""
    excludes: tuple[str, ...] = ()
    """Candidates a constraint removed."""
    detail: str = ""
    """For evidence and deadline rules: the numbers that triggered it."""


@dataclass(kw_only=True, slots=True, frozen=True)
class Ranked:
    """One candidate in the ranking."""

    candidate: str
    """Candidate stack."""
    rank: int
    """1 = recommended."""
    fit: float
    """Sum of rule and evidence-rule points."""
    deadline_penalty: float
    """Points lost for not fitting ramp-up and migration before the deadline."""
    cost_penalty: float
    """k x log2(TCO / cheapest TCO)."""
    score: float
    """fit - deadline_penalty - cost_penalty; the ranking key."""
    cost: Cost
    """Its cost of ownership."""
    reasons: tuple[tuple[str, float, str], ...]
    """(rule id, delta, source), largest |delta| first."""


@dataclass(kw_only=True, slots=True, frozen=True)
class Excluded:
    """A candidate removed by a hard constraint."""

    candidate: str
    """Candidate stack."""
    reasons: tuple[tuple[str, str], ...]
    """(constraint id, reason)."""


@dataclass(kw_only=True, slots=True, frozen=True)
class BreakEven:
    """The value of one input at which the top candidate loses first place."""

    input: str
    """Profile key moved."""
    label: str
    """Human name of the input."""
    current: float
    """Its value now."""
    value: float
    """The break-even value: beyond it `new_top` ranks first."""
    change: float
    """(value - current) / current."""
    new_top: str
    """Candidate that takes first place past the break-even."""


@dataclass(kw_only=True, slots=True, frozen=True)
class Sensitivity:
    """Which single cost input, moved how far, changes the recommendation."""

    top: str
    """Recommended candidate now."""
    break_evens: tuple[BreakEven, ...]
    """Nearest break-even per input and direction (up to two per input)."""
    headline: str
    """The sensitivity line: the smallest relative move that changes the top candidate."""


@dataclass(kw_only=True, slots=True, frozen=True)
class Advice:
    """The advisor's result; render with render_markdown / to_dict / the CLI."""

    profile: TeamProfile
    """The profile advised on."""
    rules_version: int
    """Version of the rules file used."""
    rules_source: str
    """Which rules file."""
    ranking: tuple[Ranked, ...]
    """Usable candidates, best first."""
    excluded: tuple[Excluded, ...]
    """Candidates removed by hard constraints."""
    fired: tuple[Fired, ...]
    """Everything that fired, in rules-file order (constraints, rules, evidence, deadline)."""
    evidence: tuple[Evidence, ...]
    """Measured evidence given, plus the rule-of-thumb evidence the advisor assumed."""
    assumptions: tuple[str, ...]
    """Cost assumptions, one line each."""
    sensitivity: Sensitivity
    """The sensitivity line and break-even points."""
    notes: tuple[str, ...]
    """Anything else the reader should know (e.g. no measurements found)."""

    @property
    def top(self) -> str:
        return self.ranking[0].candidate


def reference_hours(profile: TeamProfile, rules: RuleSet,
                    planned: PlannedTraining | None = None) -> tuple[float, str]:
    """Training hours on the fastest stack, and where the figure comes from: a planner
    result when given, else the profile's hours, else 6 x params x tokens at a rule-of-thumb
    MFU."""
    if planned is not None:
        return planned.hours, f"{PLANNED}: {planned.describe}"
    if profile.training_hours is not None:
        return float(profile.training_hours), "given in the profile"
    hw = profile.hardware
    flops = 6.0 * profile.model_params * float(profile.training_tokens)  # type: ignore[arg-type]
    peak = rules.peak_tflops(hw)
    rate = profile.devices * peak * 1e12 * rules.mfu[hw]
    return flops / rate / 3600.0, (
        f"{RULE_OF_THUMB}: 6 x {profile.model_params:.3g} params x "
        f"{profile.training_tokens:.3g} tokens / ({profile.devices} x "
        f"{peak:g} TFLOP/s ({rules.accelerators[hw]}) x {rules.mfu[hw]:.0%} MFU)"
    )


def _cost(candidate: str, profile: TeamProfile, rules: RuleSet, hours: float,
          hours_source: str, factor: float, factor_source: str,
          serving_factor: float = 1.0) -> Cost:
    level = profile.experience[BASE_FRAMEWORK[candidate]]
    ramp = rules.ramp_up_days[level] + rules.ramp_up_extra_days.get(candidate, 0.0)
    if candidate in rules.functional_stacks:
        ramp += rules.functional_days[profile.functional_programming]
    migration = rules.migration(profile.existing_code, candidate)
    training_hours = hours / factor
    compute = training_hours * profile.devices * profile.gpu_price_per_hour
    person_days = ramp * profile.team_size + migration
    people = person_days * profile.engineer_cost_per_day
    serving_hours = profile.serving_hours() * serving_factor
    serving = serving_hours * profile.gpu_price_per_hour
    return Cost(
        reference_hours=hours,
        hours_source=hours_source,
        throughput_factor=factor,
        throughput_source=factor_source,
        training_hours=training_hours,
        devices=profile.devices,
        gpu_price_per_hour=float(profile.gpu_price_per_hour),
        compute_usd=compute,
        ramp_up_days_per_engineer=ramp,
        team_size=profile.team_size,
        migration_days=migration,
        person_days=person_days,
        engineer_cost_per_day=float(profile.engineer_cost_per_day),
        people_usd=people,
        total_usd=compute + serving + people,
        calendar_days=ramp + migration / profile.team_size,
        serving_factor=serving_factor,
        serving_hours=serving_hours,
        serving_usd=serving,
    )


def _money(value: float) -> str:
    return f"${value:,.2f}" if value < 100 else f"${value:,.0f}"


def input_text(name: str, value: float) -> str:
    if name == "gpu_price_per_hour":
        return f"{_money(value)}/h"
    if name == "engineer_cost_per_day":
        return f"{_money(value)}/day"
    return f"{value:,.0f} h" if value >= 10 else f"{value:,.2f} h"


def _sensitivity(ranking: Sequence[Ranked], base: dict[str, float], profile: TeamProfile,
                 rules: RuleSet) -> Sensitivity:
    top = ranking[0]
    if len(ranking) == 1:
        return Sensitivity(top=top.candidate, break_evens=(),
                           headline=f"{top.candidate} is the only usable candidate; no cost "
                           "input can change that.")
    k = rules.points_per_tco_doubling
    found: list[BreakEven] = []
    for name, label in SENSITIVITY_INPUTS:
        current = top.cost.reference_hours if name == "training_hours" else float(
            getattr(profile, name))
        nearest: dict[str, tuple[float, str]] = {}
        a_top, b_top = top.cost.linear(name)
        for challenger in ranking[1:]:
            # Tie when base_t - k log2(T_t) = base_c - k log2(T_c), i.e. T_t = r T_c with
            # r = 2 ** ((base_t - base_c) / k); T = a + b x is linear in x, so solve for x.
            r = 2.0 ** ((base[top.candidate] - base[challenger.candidate]) / k)
            a_c, b_c = challenger.cost.linear(name)
            denominator = b_top - r * b_c
            if denominator == 0:
                continue
            x = (r * a_c - a_top) / denominator
            # T_t/T_c is monotone in x (a Moebius map), so the sign flips once, at x; values
            # <= 0 are outside every input's domain.
            if not math.isfinite(x) or x <= 0 or x == current:
                continue
            direction = "up" if x > current else "down"
            held = nearest.get(direction)
            if held is None or abs(x - current) < abs(held[0] - current):
                nearest[direction] = (x, challenger.candidate)
        for direction in ("down", "up"):
            if direction in nearest:
                x, new_top = nearest[direction]
                found.append(BreakEven(input=name, label=label, current=current, value=x,
                                       change=(x - current) / current, new_top=new_top))
    if not found:
        return Sensitivity(
            top=top.candidate, break_evens=(),
            headline=(f"No single change to GPU price, training hours or engineer day-rate "
                      f"makes another candidate overtake {top.candidate}: its lead comes from "
                      "the rules, not from cost."),
        )
    order = {name: i for i, (name, _) in enumerate(SENSITIVITY_INPUTS)}
    best = min(found, key=lambda b: (abs(b.change), order[b.input]))
    plural = best.input in _PLURAL
    if best.value > best.current:
        verb = "rise above" if plural else "rises above"
    else:
        verb = "fall below" if plural else "falls below"
    headline = (
        f"{top.candidate} stays first unless {best.label} {verb} "
        f"{input_text(best.input, best.value)} ({best.change:+.0%} from "
        f"{input_text(best.input, best.current)}); then {best.new_top} ranks first."
    )
    return Sensitivity(top=top.candidate, break_evens=tuple(found), headline=headline)


def _assumptions(profile: TeamProfile, rules: RuleSet, hours: float, hours_source: str,
                 factors: dict[str, tuple[float, str]]) -> tuple[str, ...]:
    days = rules.ramp_up_days
    lines = [
        "TCO = training hours x devices x price per device-hour + serving device-hours x "
        "price per device-hour (when the profile gives serving figures) + (ramp-up days x "
        "team size + migration person-days) x cost per engineer-day.",
        f"Training hours on the fastest stack: {hours:,.1f} ({hours_source}); each candidate "
        "takes that divided by its relative throughput.",
        f"Ramp-up days per engineer by experience: none {days['none']:g}, some "
        f"{days['some']:g}, expert {days['expert']:g}"
        + "".join(f"; +{v:g} for {c}" for c, v in rules.ramp_up_extra_days.items())
        + f"; +{rules.functional_days['none']:g}/{rules.functional_days['some']:g}/"
        f"{rules.functional_days['expert']:g} (functional programming none/some/expert) for "
        f"{', '.join(rules.functional_stacks)}. {rules.ramp_up_rationale}",
    ]
    if profile.existing_code == "none":
        lines.append("No existing code base: no migration cost.")
    else:
        ported = ", ".join(
            f"{c} {rules.migration(profile.existing_code, c):g}" for c in CANDIDATES
        )
        lines.append(f"Migration person-days from the existing {profile.existing_code} code: "
                     f"{ported}. {rules.migration_rationale}")
    measured = [c for c in CANDIDATES if factors[c][1] == MEASURED]
    thumb = {c: f for c, (f, s) in factors.items() if s == RULE_OF_THUMB and f != 1.0}
    text = "Relative throughput (1 = fastest): "
    text += (f"measured for {', '.join(measured)}; " if measured else "nothing measured; ")
    if thumb:
        text += (f"rule of thumb on {profile.hardware}: "
                 + ", ".join(f"{c} {f:g}" for c, f in thumb.items())
                 + f" ({rules.throughput_rationale[profile.hardware]}); others 1.")
    else:
        text += "others assumed 1 (no rule of thumb for this hardware)."
    lines.append(text)
    if profile.serving_hours():
        lines.append(
            f"Serving: {profile.serving_requests_per_day:,.0f} requests a day x "
            f"{profile.serving_days:g} days x {profile.serving_seconds_per_request:g} "
            f"device-seconds on the fastest stack = {profile.serving_hours():,.1f} "
            "device-hours at the same price per device-hour; each candidate's is that times "
            "its measured batch-1 latency relative to the fastest (`sextant compare deploy`), "
            "1 where none was measured.")
    lines.append(
        f"Score = rule points - deadline penalty ({rules.deadline_penalty:g} if ramp-up and "
        f"migration exceed {profile.deadline_weeks:g} weeks x {rules.working_days_per_week:g} "
        f"days) - {rules.points_per_tco_doubling:g} points per doubling of TCO over the "
        "cheapest candidate."
    )
    return tuple(lines)


Facts = dict[str, Any]
"""A profile's facts, as rule conditions test them (TeamProfile.facts)."""


class _Points:
    """The ledger of rule points: each usable candidate's fit and the (rule id, delta,
    source) entries that make it up."""

    def __init__(self, usable: Sequence[str]) -> None:
        self.fit = dict.fromkeys(usable, 0.0)
        self.reasons: dict[str, list[tuple[str, float, str]]] = {c: [] for c in usable}

    def add(self, candidate: str, rule_id: str, delta: float, source: str) -> None:
        self.fit[candidate] += delta
        self.reasons[candidate].append((rule_id, delta, source))


def _apply_constraints(rules: RuleSet, facts: Facts,
                       fired: list[Fired]) -> dict[str, list[tuple[str, str]]]:
    """The candidates the profile's constraints exclude, each with (constraint id, reason)."""
    excluded: dict[str, list[tuple[str, str]]] = {}
    for constraint in rules.constraints:
        if constraint.when.matches(facts):
            fired.append(Fired(id=constraint.id, kind="constraint", source=RULE_OF_THUMB,
                               rationale=constraint.reason,
                               condition=constraint.when.describe(),
                               excludes=constraint.exclude))
            for candidate in constraint.exclude:
                excluded.setdefault(candidate, []).append((constraint.id, constraint.reason))
    return excluded


def _apply_rules(rules: RuleSet, facts: Facts, points: _Points, fired: list[Fired],
                 measured_metrics: set[str]) -> None:
    """The rules of thumb that match the profile, on the candidates not excluded, less those
    whose assumption a measured metric answers."""
    for rule in rules.rules:
        if not rule.when.matches(facts) or rule.replaced_by in measured_metrics:
            continue
        applied = tuple((c, d) for c, d in rule.effect if c in points.fit)
        idle = [c for c, _ in rule.effect if c not in points.fit]
        fired.append(Fired(id=rule.id, kind="rule", source=RULE_OF_THUMB,
                           rationale=rule.rationale, condition=rule.when.describe(),
                           effect=applied,
                           detail=f"not applied to excluded {', '.join(idle)}" if idle else ""))
        for candidate, delta in applied:
            points.add(candidate, rule.id, delta, RULE_OF_THUMB)


def _apply_evidence_rules(rules: RuleSet, facts: Facts,
                          measured: dict[tuple[str, str], Evidence], points: _Points,
                          fired: list[Fired]) -> None:
    """The evidence rules whose measured metric crosses its threshold for a candidate."""
    for ev_rule in rules.evidence_rules:
        if not ev_rule.when.matches(facts):
            continue
        hits = [
            (c, measured[(c, ev_rule.metric)]) for c in points.fit
            if (c, ev_rule.metric) in measured
            and COMPARISONS[ev_rule.op](measured[(c, ev_rule.metric)].value, ev_rule.threshold)
        ]
        if not hits:
            continue
        fired.append(Fired(
            id=ev_rule.id, kind="evidence", source=MEASURED, rationale=ev_rule.rationale,
            condition=f"measured {ev_rule.metric} {'>' if ev_rule.op == 'gt' else '<'} "
                      f"{ev_rule.threshold:g}",
            effect=tuple((c, ev_rule.delta) for c, _ in hits),
            detail="; ".join(f"{c}: {e.detail}" for c, e in hits),
        ))
        for candidate, _ in hits:
            points.add(candidate, ev_rule.id, ev_rule.delta, MEASURED)


def _throughput_factors(profile: TeamProfile, rules: RuleSet,
                        measured: dict[tuple[str, str], Evidence], usable: Sequence[str]
                        ) -> tuple[dict[str, tuple[float, str]], list[Evidence]]:
    """(factor and its source per candidate, the assumed evidence to show): each candidate's
    relative throughput, measured where the store has it, else the rules' figure for the
    hardware."""
    factors: dict[str, tuple[float, str]] = {}
    assumed: list[Evidence] = []
    for candidate in CANDIDATES:
        if (candidate, "throughput_ratio") in measured:
            factors[candidate] = (measured[(candidate, "throughput_ratio")].value, MEASURED)
            continue
        factor = rules.factor(profile.hardware, candidate)
        factors[candidate] = (factor, RULE_OF_THUMB)
        if candidate in usable and factor != 1.0:
            assumed.append(Evidence(
                candidate=candidate, metric="throughput_ratio", value=factor,
                source=RULE_OF_THUMB,
                detail=f"rules file, {profile.hardware}: "
                       f"{rules.throughput_rationale[profile.hardware]}",
            ))
    return factors, assumed


def _deadline_penalties(profile: TeamProfile, rules: RuleSet, costs: dict[str, Cost],
                        points: _Points, fired: list[Fired]) -> dict[str, float]:
    """The deadline penalty of each candidate whose ramp-up and migration outlast the
    deadline's working days."""
    working_days = profile.deadline_weeks * rules.working_days_per_week
    late = [c for c in costs if costs[c].calendar_days > working_days]
    if late:
        fired.append(Fired(
            id=rules.deadline_id, kind="deadline", source=RULE_OF_THUMB,
            rationale=rules.deadline_rationale,
            condition=f"ramp-up + migration > {working_days:g} working days",
            effect=tuple((c, -rules.deadline_penalty) for c in late),
            detail="; ".join(f"{c}: {costs[c].calendar_days:.0f} days" for c in late),
        ))
        for candidate in late:  # a reason shown, not fit: the penalty is kept apart
            points.reasons[candidate].append((rules.deadline_id, -rules.deadline_penalty,
                                              RULE_OF_THUMB))
    return {c: (rules.deadline_penalty if c in late else 0.0) for c in costs}


def _rank(points: _Points, penalty: dict[str, float], costs: dict[str, Cost],
          rules: RuleSet) -> tuple[tuple[Ranked, ...], dict[str, float]]:
    """(the ranking, each candidate's score before its cost penalty)."""
    usable = list(points.fit)
    # Floored at MIN_TCO_USD: a near-zero cost (a tiny model and an expert team) made the
    # ratio overflow and the scores NaN.
    cheapest = max(min(cost.total_usd for cost in costs.values()), MIN_TCO_USD)
    k = rules.points_per_tco_doubling
    base = {c: points.fit[c] - penalty[c] for c in usable}
    cost_penalty = {c: k * math.log2(max(costs[c].total_usd, MIN_TCO_USD) / cheapest)
                    for c in usable}
    score = {c: base[c] - cost_penalty[c] for c in usable}
    # Ties: cheaper first, then the fixed candidate order, so equal inputs rank identically.
    order = sorted(usable, key=lambda c: (-score[c], costs[c].total_usd, CANDIDATES.index(c)))
    ranking = tuple(
        Ranked(
            candidate=c, rank=i + 1, fit=points.fit[c], deadline_penalty=penalty[c],
            cost_penalty=cost_penalty[c], score=score[c], cost=costs[c],
            reasons=tuple(sorted(points.reasons[c], key=lambda r: (-abs(r[1]), r[0]))),
        )
        for i, c in enumerate(order)
    )
    return ranking, base


def _notes(notes: Iterable[str], profile: TeamProfile, hours: float,
           planned: PlannedTraining | None) -> tuple[str, ...]:
    """The caller's notes, the planner's, and a warning when training alone outlasts the
    deadline."""
    out = list(notes)
    if planned is not None:
        out.extend(planned.notes)
        if profile.training_hours is not None:
            out.append(f"The profile's training_hours ({profile.training_hours:g}) is "
                       f"replaced by the planner's {hours:,.1f} hours ({planned.path}).")
    weeks = hours / 24 / 7
    if weeks > profile.deadline_weeks:
        out.append(f"Training alone takes about {weeks:.1f} weeks on the fastest stack, "
                   f"beyond the {profile.deadline_weeks:g}-week deadline: add devices or "
                   "train on fewer tokens.")
    return tuple(out)


def advise(profile: TeamProfile, evidence: Iterable[Evidence] = (),
           rules: RuleSet | None = None, notes: Iterable[str] = (),
           planned: PlannedTraining | None = None) -> Advice:
    """Rank the candidate stacks for `profile`; deterministic for equal inputs. `planned`
    (a planner result, see advisor/planned.py) gives the training hours at the target scale."""
    rules = rules or load_rules()
    evidence = tuple(evidence)
    facts = profile.facts()
    fired: list[Fired] = []

    excluded = _apply_constraints(rules, facts, fired)
    usable = [c for c in CANDIDATES if c not in excluded]
    if not usable:
        # Only a custom rules file can get here; the shipped constraints leave candidates.
        raise UserError("the rules' constraints exclude every candidate stack for this profile")
    points = _Points(usable)
    measured = {(e.candidate, e.metric): e for e in evidence if e.source == MEASURED}
    _apply_rules(rules, facts, points, fired, {metric for _, metric in measured})
    _apply_evidence_rules(rules, facts, measured, points, fired)

    hours, hours_source = reference_hours(profile, rules, planned)
    factors, assumed = _throughput_factors(profile, rules, measured, usable)
    if planned is not None or profile.training_hours is None:
        for candidate in usable:
            assumed.append(Evidence(candidate=candidate, metric="training_hours",
                                    value=hours / factors[candidate][0],
                                    source=PLANNED if planned is not None else RULE_OF_THUMB,
                                    detail=hours_source))

    latency = {c: measured[(c, "serving_latency_ratio")].value for c in usable
               if (c, "serving_latency_ratio") in measured}
    costs = {c: _cost(c, profile, rules, hours, hours_source, *factors[c],
                      serving_factor=latency.get(c, 1.0)) for c in usable}
    penalty = _deadline_penalties(profile, rules, costs, points, fired)
    ranking, base = _rank(points, penalty, costs, rules)
    return Advice(
        profile=profile,
        rules_version=rules.version,
        rules_source=rules.source,
        ranking=ranking,
        excluded=tuple(Excluded(candidate=c, reasons=tuple(excluded[c]))
                       for c in CANDIDATES if c in excluded),
        fired=tuple(fired),
        evidence=evidence + tuple(assumed),
        assumptions=_assumptions(profile, rules, hours, hours_source, factors),
        sensitivity=_sensitivity(ranking, base, profile, rules),
        notes=_notes(notes, profile, hours, planned),
    )
