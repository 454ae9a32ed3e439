"""Advisor rules as data: load `rules.toml` and evaluate its declarative conditions.

A condition is a TOML table of clauses that must all hold, e.g.
`when = { hardware = ["ascend"], model_params_ge = 1e10 }`. There is no eval/exec: each
clause is one of a fixed set of shapes (membership, boolean, numeric comparison, experience
level), validated at load time, so a rules file cannot run code and a typo is an error.
"""

from __future__ import annotations

import functools
import importlib.resources
import math
import operator
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sextant.advisor.vocab import (
    BASE_FRAMEWORK,
    CANDIDATES,
    DEPLOYMENTS,
    EXISTING_CODE,
    FRAMEWORKS,
    HARDWARE,
    LEVELS,
    PARALLELISM,
    PURPOSES,
    allowed,
)
from sextant.core.errors import UserError

ENUM_FACTS: dict[str, tuple[str, ...]] = {
    "hardware": HARDWARE,
    "deployment": DEPLOYMENTS,
    "parallelism": PARALLELISM,
    "purpose": PURPOSES,
    "existing_code": EXISTING_CODE,
    "functional_programming": LEVELS,
    # team_best is a list (several frameworks can share the top level): a clause on it holds
    # when any listed value is among them.
    "team_best": FRAMEWORKS + ("none",),
}
BOOL_FACTS = ("localisation",)
# Cost inputs (price, hours, day rate) are not conditionable on purpose: see
# TeamProfile.facts().
NUMERIC_FACTS = ("model_params", "devices", "team_size", "deadline_weeks")
COMPARISONS = {"gt": operator.gt, "ge": operator.ge, "lt": operator.lt, "le": operator.le}
SYMBOLS = {"gt": ">", "ge": ">=", "lt": "<", "le": "<=", "in": "in"}

CONDITION_KEYS = (
    tuple(ENUM_FACTS)
    + BOOL_FACTS
    + tuple(f"{fact}_{op}" for fact in NUMERIC_FACTS for op in COMPARISONS)
    + ("experience",)
)

EVIDENCE_METRICS = (
    "throughput_ratio",
    "memory_ratio",
    "peak_rss_bytes",
    "scaling_efficiency",
    "exposed_comm_share",
    "compile_time_s",
    "deploy_formats",
)
"""Metrics that evidence_from_runs (and, for deploy_formats, evidence_from_deployments)
produce and evidence rules may test."""


def _fmt(value: float) -> str:
    return f"{value:g}"


@dataclass(kw_only=True, slots=True, frozen=True)
class Clause:
    """One test on one fact."""

    fact: str
    """Fact name (see TeamProfile.facts), or 'experience.<framework>'."""
    op: str
    """'in' (membership), 'is' (boolean) or a comparison: gt, ge, lt, le."""
    value: Any
    """Tuple of allowed values for 'in', bool for 'is', number for comparisons."""

    def matches(self, facts: Mapping[str, Any]) -> bool:
        if self.fact.startswith("experience."):
            actual: Any = facts["experience"][self.fact.split(".", 1)[1]]
        else:
            actual = facts[self.fact]
        if self.op == "in":
            if isinstance(actual, tuple):
                return any(item in self.value for item in actual)
            return actual in self.value
        if self.op == "is":
            return actual is self.value
        return COMPARISONS[self.op](actual, self.value)

    def describe(self) -> str:
        if self.op == "in":
            return f"{self.fact} in [{', '.join(self.value)}]"
        if self.op == "is":
            return f"{self.fact} = {str(self.value).lower()}"
        return f"{self.fact} {SYMBOLS[self.op]} {_fmt(self.value)}"


@dataclass(kw_only=True, slots=True, frozen=True)
class Condition:
    """All clauses must hold; no clauses: always holds."""

    clauses: tuple[Clause, ...] = ()
    """The tests, in the order written."""

    def matches(self, facts: Mapping[str, Any]) -> bool:
        return all(clause.matches(facts) for clause in self.clauses)

    def describe(self) -> str:
        return " and ".join(c.describe() for c in self.clauses) or "always"


def _values(raw: Any, choices: tuple[str, ...], where: str) -> tuple[str, ...]:
    if not isinstance(raw, list) or not raw:
        raise UserError(f"{where}: expected a non-empty list of {allowed(choices)}; got {raw!r}")
    for value in raw:
        if value not in choices:
            raise UserError(f"{where}: unknown value {value!r}; allowed: {allowed(choices)}")
    return tuple(raw)


def parse_condition(raw: Any, where: str) -> Condition:
    """Validate a `when` table into a Condition."""
    if raw is None:
        return Condition()
    if not isinstance(raw, Mapping):
        raise UserError(f"{where}: 'when' must be a table; got {raw!r}")
    clauses = []
    for key, value in raw.items():
        here = f"{where}.when.{key}"
        if key in ENUM_FACTS:
            clauses.append(Clause(fact=key, op="in", value=_values(value, ENUM_FACTS[key], here)))
        elif key in BOOL_FACTS:
            if not isinstance(value, bool):
                raise UserError(f"{here}: expected true or false; got {value!r}")
            clauses.append(Clause(fact=key, op="is", value=value))
        elif key == "experience":
            if not isinstance(value, Mapping):
                raise UserError(f"{here}: expected a table framework = [levels]; got {value!r}")
            for framework, levels in value.items():
                if framework not in FRAMEWORKS:
                    raise UserError(
                        f"{here}: unknown framework {framework!r}; allowed: {allowed(FRAMEWORKS)}"
                    )
                clauses.append(
                    Clause(
                        fact=f"experience.{framework}",
                        op="in",
                        value=_values(levels, LEVELS, f"{here}.{framework}"),
                    )
                )
        elif key in CONDITION_KEYS:
            fact, op = key.rsplit("_", 1)
            if isinstance(value, bool) or not isinstance(value, int | float):
                raise UserError(f"{here}: expected a number; got {value!r}")
            clauses.append(Clause(fact=fact, op=op, value=float(value)))
        else:
            raise UserError(
                f"{where}: unknown condition {key!r}; allowed: {allowed(CONDITION_KEYS)}"
            )
    return Condition(clauses=tuple(clauses))


@dataclass(kw_only=True, slots=True, frozen=True)
class Rule:
    """A scoring rule: when the condition holds, add the deltas to the candidates' scores."""

    id: str
    """Stable identifier, shown in every recommendation it affects."""
    when: Condition
    """When the rule fires."""
    effect: tuple[tuple[str, float], ...]
    """(candidate, score delta) pairs, in CANDIDATES order."""
    rationale: str
    """Why, in one sentence."""
    replaced_by: str | None = None
    """A measured metric (EVIDENCE_METRICS) that answers what this rule of thumb assumes:
    with that evidence present, the rule stays silent and the evidence rules decide."""


@dataclass(kw_only=True, slots=True, frozen=True)
class Constraint:
    """A hard constraint: when the condition holds, the candidates cannot be used at all."""

    id: str
    """Stable identifier."""
    when: Condition
    """When the constraint applies."""
    exclude: tuple[str, ...]
    """Candidates it removes from the ranking."""
    reason: str
    """Why they cannot be used, in one sentence."""


@dataclass(kw_only=True, slots=True, frozen=True)
class EvidenceRule:
    """A rule on measured evidence: applies per candidate whose measurement passes the test."""

    id: str
    """Stable identifier."""
    metric: str
    """One of EVIDENCE_METRICS."""
    op: str
    """'gt' or 'lt'."""
    threshold: float
    """The measured value is compared with this."""
    delta: float
    """Score delta for each candidate the test holds for."""
    when: Condition
    """Profile condition under which the rule applies at all."""
    rationale: str
    """Why, in one sentence."""


@dataclass(kw_only=True, slots=True, frozen=True)
class RuleSet:
    """Everything in a rules file: rules, constraints and the cost assumptions."""

    version: int
    """Rules file version; shown in every result so that advice can be traced to its rules."""
    source: str
    """Where the rules were read from."""
    points_per_tco_doubling: float
    """Score lost by a candidate for each doubling of its TCO over the cheapest candidate."""
    rules: tuple[Rule, ...]
    """Scoring rules."""
    constraints: tuple[Constraint, ...]
    """Hard constraints."""
    evidence_rules: tuple[EvidenceRule, ...]
    """Rules on measured evidence."""
    deadline_id: str
    """Id under which a missed deadline is reported."""
    deadline_penalty: float
    """Score lost by a candidate whose ramp-up and migration do not fit the deadline."""
    deadline_rationale: str
    """Why."""
    working_days_per_week: float
    """Converts deadline weeks to working days."""
    ramp_up_days: Mapping[str, float]
    """Ramp-up days per engineer, by experience level with the candidate's framework."""
    ramp_up_extra_days: Mapping[str, float]
    """Additional ramp-up days per engineer for a candidate (e.g. learning DeepSpeed)."""
    functional_stacks: tuple[str, ...]
    """Candidates whose ramp-up also depends on functional-programming experience."""
    functional_days: Mapping[str, float]
    """Extra ramp-up days per engineer for those candidates, by functional experience."""
    ramp_up_rationale: str
    """Where the ramp-up figures come from."""
    migration_default_days: float
    """Person-days to port an existing code base to another framework."""
    migration_days: Mapping[str, Mapping[str, float]]
    """Overrides: existing framework -> candidate -> person-days."""
    migration_rationale: str
    """Where the migration figures come from."""
    throughput: Mapping[str, Mapping[str, float]]
    """Rule-of-thumb relative throughput: hardware -> candidate -> factor (1 = fastest)."""
    throughput_rationale: Mapping[str, str]
    """Hardware -> why those factors."""
    accelerators: Mapping[str, str]
    """Hardware -> the planner catalogue entry whose peak derives hours from tokens."""
    mfu: Mapping[str, float]
    """Hardware -> model FLOP utilisation assumed when deriving hours from tokens."""
    flops_rationale: Mapping[str, str]
    """Hardware -> which device those figures describe."""

    def peak_tflops(self, hardware: str) -> float:
        """Dense 16-bit TFLOP/s of one device of this hardware family, from the planner's
        catalogue (bf16, else fp16, else fp32)."""
        from sextant.planner.catalogue import load_catalogue

        key = self.accelerators[hardware]
        cat = load_catalogue()
        if key not in cat.accelerators:
            raise UserError(
                f"{self.source} [hardware.{hardware}].accelerator: {key!r} is not in the planner "
                f"catalogue; allowed: {', '.join(cat.accelerators)}"
            )
        acc = cat.accelerators[key]
        for precision in ("bf16", "fp16", "fp32"):
            if precision in acc.peak_flops:
                return acc.peak_flops[precision] / 1e12
        raise UserError(
            f"accelerator {key!r} has no peak FLOP/s yet (it is measured on this machine): run "
            "'sextant calibrate', or give training_hours instead of training_tokens"
        )

    def migration(self, existing: str, candidate: str) -> float:
        """Person-days to move the existing code base to `candidate` (0 without code)."""
        if existing == "none":
            return 0.0
        table = self.migration_days.get(existing, {})
        if candidate in table:
            return table[candidate]
        return 0.0 if BASE_FRAMEWORK[candidate] == existing else self.migration_default_days

    def factor(self, hardware: str, candidate: str) -> float:
        """Rule-of-thumb relative throughput (1.0 when the table is silent)."""
        return self.throughput.get(hardware, {}).get(candidate, 1.0)


def _check_keys(raw: Mapping[str, Any], where: str, required: tuple[str, ...],
                optional: tuple[str, ...] = ()) -> None:
    if not isinstance(raw, Mapping):
        raise UserError(f"{where}: expected a table; got {raw!r}")
    keys = required + optional
    for key in raw:
        if key not in keys:
            raise UserError(f"{where}: unknown key {key!r}; allowed: {allowed(keys)}")
    missing = [key for key in required if key not in raw]
    if missing:
        raise UserError(f"{where}: missing key(s): {', '.join(missing)}")


def _number(value: Any, where: str, *, minimum: float = 0.0, strict: bool = False) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise UserError(f"{where}: expected a number; got {value!r}")
    if value < minimum or (strict and value == minimum):
        bound = f"{'>' if strict else '>='} {_fmt(minimum)}"
        raise UserError(f"{where}: must be {bound}; got {value!r}")
    return float(value)


def _signed(value: Any, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise UserError(f"{where}: expected a number; got {value!r}")
    return float(value)


def _text(value: Any, where: str) -> str:
    if not isinstance(value, str) or not value.strip():
        raise UserError(f"{where}: expected a non-empty string; got {value!r}")
    return value.strip()


def _candidate_table(raw: Any, where: str, *, signed: bool = False,
                     choices: tuple[str, ...] = CANDIDATES) -> dict[str, float]:
    if not isinstance(raw, Mapping):
        raise UserError(f"{where}: expected a table of {allowed(choices)}; got {raw!r}")
    out = {}
    for key, value in raw.items():
        if key not in choices:
            raise UserError(f"{where}: unknown key {key!r}; allowed: {allowed(choices)}")
        out[key] = _signed(value, f"{where}.{key}") if signed else _number(value, f"{where}.{key}")
    return out


def _ordered(table: Mapping[str, float]) -> tuple[tuple[str, float], ...]:
    return tuple((c, table[c]) for c in CANDIDATES if c in table)


def _unique(ids: list[str], where: str) -> None:
    seen = set()
    for rule_id in ids:
        if rule_id in seen:
            raise UserError(f"{where}: rule id {rule_id!r} is used twice; ids must be unique")
        seen.add(rule_id)


def _migration_overrides(migration: Any, where: str) -> dict[str, dict[str, float]]:
    """[migration]: its keys, and the person-days per candidate from each framework that
    overrides the default."""
    _check_keys(migration, where, ("default_days", "rationale"), ("from",))
    overrides: dict[str, dict[str, float]] = {}
    from_table = migration.get("from", {})
    if not isinstance(from_table, Mapping):
        raise UserError(f"{where}.from: expected tables per framework; got {from_table!r}")
    for framework, table in from_table.items():
        if framework not in FRAMEWORKS:
            raise UserError(
                f"{where}.from: unknown framework {framework!r}; allowed: {allowed(FRAMEWORKS)}"
            )
        overrides[framework] = _candidate_table(table, f"{where}.from.{framework}")
    return overrides


def _throughput_tables(raw: Any, source: str
                       ) -> tuple[dict[str, dict[str, float]], dict[str, str]]:
    """[throughput.HW]: (relative throughput factors in (0, 1] per hardware, rationale)."""
    throughput: dict[str, dict[str, float]] = {}
    throughput_rationale: dict[str, str] = {}
    _check_keys(raw, f"{source} [throughput]", (), HARDWARE)
    for hw, table in raw.items():
        where = f"{source} [throughput.{hw}]"
        _check_keys(table, where, ("factors", "rationale"))
        factors = _candidate_table(table["factors"], f"{where}.factors")
        for cand, value in factors.items():
            if not 0 < value <= 1:
                raise UserError(f"{where}.factors.{cand}: must be in (0, 1]; got {value!r}")
        throughput[hw] = factors
        throughput_rationale[hw] = _text(table["rationale"], f"{where}.rationale")
    return throughput, throughput_rationale


def _hardware_tables(raw: Any, source: str
                     ) -> tuple[dict[str, str], dict[str, float], dict[str, str]]:
    """[hardware.HW], every hardware: (accelerator, MFU in (0, 1], rationale) per hardware."""
    accelerators: dict[str, str] = {}
    mfu: dict[str, float] = {}
    flops_rationale: dict[str, str] = {}
    _check_keys(raw, f"{source} [hardware]", HARDWARE)
    for hw, table in raw.items():
        where = f"{source} [hardware.{hw}]"
        _check_keys(table, where, ("accelerator", "mfu", "rationale"))
        accelerators[hw] = _text(table["accelerator"], f"{where}.accelerator")
        mfu[hw] = _number(table["mfu"], f"{where}.mfu", strict=True)
        if mfu[hw] > 1:
            raise UserError(f"{where}.mfu: must be <= 1; got {mfu[hw]!r}")
        flops_rationale[hw] = _text(table["rationale"], f"{where}.rationale")
    return accelerators, mfu, flops_rationale


def _constraints(raw: Any, source: str) -> list[Constraint]:
    """[[constraint]]: the candidates each excludes, and why."""
    constraints = []
    for i, item in enumerate(_list(raw, f"{source} [[constraint]]")):
        where = f"{source} [[constraint]] #{i + 1}"
        _check_keys(item, where, ("id", "when", "exclude", "reason"))
        constraints.append(Constraint(
            id=_text(item["id"], f"{where}.id"),
            when=parse_condition(item["when"], where),
            exclude=_values(item["exclude"], CANDIDATES, f"{where}.exclude"),
            reason=_text(item["reason"], f"{where}.reason"),
        ))
    return constraints


def _rules(raw: Any, source: str) -> list[Rule]:
    """[[rule]]: the points each gives or takes, at least one candidate each."""
    rules = []
    for i, item in enumerate(_list(raw, f"{source} [[rule]]")):
        where = f"{source} [[rule]] #{i + 1}"
        _check_keys(item, where, ("id", "when", "effect", "rationale"), ("replaced_by",))
        effect = _candidate_table(item["effect"], f"{where}.effect", signed=True)
        if not effect:
            raise UserError(f"{where}.effect: give at least one candidate = delta")
        replaced_by = item.get("replaced_by")
        if replaced_by is not None and replaced_by not in EVIDENCE_METRICS:
            raise UserError(f"{where}.replaced_by: unknown metric {replaced_by!r}; "
                            f"allowed: {allowed(EVIDENCE_METRICS)}")
        rules.append(Rule(
            id=_text(item["id"], f"{where}.id"),
            when=parse_condition(item["when"], where),
            effect=_ordered(effect),
            rationale=_text(item["rationale"], f"{where}.rationale"),
            replaced_by=replaced_by,
        ))
    return rules


def _evidence_rules(raw: Any, source: str) -> list[EvidenceRule]:
    """[[evidence_rule]]: a measured metric, one threshold (gt or lt) and the points."""
    evidence_rules = []
    for i, item in enumerate(_list(raw, f"{source} [[evidence_rule]]")):
        where = f"{source} [[evidence_rule]] #{i + 1}"
        _check_keys(item, where, ("id", "metric", "delta", "rationale"), ("gt", "lt", "when"))
        if item["metric"] not in EVIDENCE_METRICS:
            raise UserError(f"{where}.metric: unknown metric {item['metric']!r}; "
                            f"allowed: {allowed(EVIDENCE_METRICS)}")
        ops = [op for op in ("gt", "lt") if op in item]
        if len(ops) != 1:
            raise UserError(f"{where}: give exactly one of gt, lt")
        evidence_rules.append(EvidenceRule(
            id=_text(item["id"], f"{where}.id"),
            metric=item["metric"],
            op=ops[0],
            threshold=_signed(item[ops[0]], f"{where}.{ops[0]}"),
            delta=_signed(item["delta"], f"{where}.delta"),
            when=parse_condition(item.get("when"), where),
            rationale=_text(item["rationale"], f"{where}.rationale"),
        ))
    return evidence_rules


def parse_rules(raw: Mapping[str, Any], *, source: str) -> RuleSet:
    """Validate a parsed rules file."""
    _check_keys(raw, source,
                ("version", "scoring", "deadline", "ramp_up", "migration", "throughput",
                 "hardware", "constraint", "rule"),
                ("evidence_rule",))
    version = raw["version"]
    if isinstance(version, bool) or not isinstance(version, int) or version < 1:
        raise UserError(f"{source}: version must be an integer >= 1; got {version!r}")

    _check_keys(raw["scoring"], f"{source} [scoring]", ("points_per_tco_doubling",))
    points = _number(raw["scoring"]["points_per_tco_doubling"],
                     f"{source} [scoring].points_per_tco_doubling", strict=True)

    deadline = raw["deadline"]
    _check_keys(deadline, f"{source} [deadline]",
                ("id", "penalty", "working_days_per_week", "rationale"))

    ramp = raw["ramp_up"]
    where = f"{source} [ramp_up]"
    _check_keys(ramp, where, ("days", "extra_days", "functional_stacks", "functional_days",
                              "rationale"))
    ramp_days = _candidate_table(ramp["days"], f"{where}.days", choices=LEVELS)
    functional_days = _candidate_table(ramp["functional_days"], f"{where}.functional_days",
                                       choices=LEVELS)
    for table, name in ((ramp_days, "days"), (functional_days, "functional_days")):
        if set(table) != set(LEVELS):
            raise UserError(f"{where}.{name}: give days for each of {allowed(LEVELS)}")
    functional_stacks = _values(ramp["functional_stacks"], CANDIDATES,
                                f"{where}.functional_stacks")

    migration = raw["migration"]
    overrides = _migration_overrides(migration, f"{source} [migration]")
    throughput, throughput_rationale = _throughput_tables(raw["throughput"], source)
    accelerators, mfu, flops_rationale = _hardware_tables(raw["hardware"], source)
    constraints = _constraints(raw["constraint"], source)
    rules = _rules(raw["rule"], source)
    evidence_rules = _evidence_rules(raw.get("evidence_rule", []), source)

    deadline_id = _text(deadline["id"], f"{source} [deadline].id")
    _unique([r.id for r in rules] + [c.id for c in constraints] + [e.id for e in evidence_rules]
            + [deadline_id], source)
    return RuleSet(
        version=version,
        source=source,
        points_per_tco_doubling=points,
        rules=tuple(rules),
        constraints=tuple(constraints),
        evidence_rules=tuple(evidence_rules),
        deadline_id=deadline_id,
        deadline_penalty=_number(deadline["penalty"], f"{source} [deadline].penalty"),
        deadline_rationale=_text(deadline["rationale"], f"{source} [deadline].rationale"),
        working_days_per_week=_number(deadline["working_days_per_week"],
                                      f"{source} [deadline].working_days_per_week", strict=True),
        ramp_up_days=ramp_days,
        ramp_up_extra_days=_candidate_table(ramp["extra_days"], f"{source} [ramp_up].extra_days"),
        functional_stacks=functional_stacks,
        functional_days=functional_days,
        ramp_up_rationale=_text(ramp["rationale"], f"{source} [ramp_up].rationale"),
        migration_default_days=_number(migration["default_days"],
                                       f"{source} [migration].default_days"),
        migration_days=overrides,
        migration_rationale=_text(migration["rationale"], f"{source} [migration].rationale"),
        throughput=throughput,
        throughput_rationale=throughput_rationale,
        accelerators=accelerators,
        mfu=mfu,
        flops_rationale=flops_rationale,
    )


def _list(raw: Any, where: str) -> list[Any]:
    if not isinstance(raw, list):
        raise UserError(f"{where}: expected an array of tables; got {raw!r}")
    return raw


def load_rules(path: str | Path | None = None) -> RuleSet:
    """Read a rules file; None: the rules shipped with sextant."""
    if path is None:
        return _default_rules()
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise UserError(f"rules file {str(path)!r} does not exist") from None
    except (IsADirectoryError, PermissionError, UnicodeDecodeError) as exc:
        raise UserError(f"cannot read rules file {str(path)!r}: {exc}") from None
    try:
        raw = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise UserError(f"rules file {str(path)!r} is not valid TOML: {exc}") from None
    return parse_rules(raw, source=path.name)


@functools.cache
def _default_rules() -> RuleSet:
    # Cached: the packaged file never changes during a process, and tests advise many times.
    text = importlib.resources.files("sextant.advisor").joinpath("rules.toml").read_text(
        encoding="utf-8"
    )
    return parse_rules(tomllib.loads(text), source="rules.toml")
