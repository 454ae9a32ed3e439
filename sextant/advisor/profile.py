"""The team profile: what the advisor needs to know about the team, the model and the budget.

A profile is a small TOML file (`sextant advise init` writes a commented template) or the
answers to the interactive questions. Every value is validated here, once: the rules engine
and the cost model can then trust it. Unknown keys are rejected (a typo must not silently
fall back to a default) and every error names the allowed values.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sextant.advisor.vocab import (
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
from sextant.core.tomlfile import parse_toml


def _check_choice(name: str, value: Any, choices: tuple[str, ...]) -> None:
    if value not in choices:
        raise UserError(f"{name}: unknown value {value!r}; allowed: {allowed(choices)}")


def _check_positive(name: str, value: Any, *, integer: bool = False) -> None:
    # bool is an int subclass: `devices = true` must not read as 1.
    kinds = (int,) if integer else (int, float)
    if isinstance(value, bool) or not isinstance(value, kinds):
        kind = "an integer" if integer else "a number"
        raise UserError(f"{name} must be {kind} > 0. Received: {value!r}")
    if value <= 0 or (isinstance(value, float) and not math.isfinite(value)):
        raise UserError(f"{name} must be > 0. Received: {value!r}")
    most = UPPER_LIMITS.get(name)
    if most is not None and value > most:
        raise UserError(f"{name} must be at most {most:g}. Received: {value!r}")


UPPER_LIMITS = {
    "model_params": 1e15, "gpu_price_per_hour": 1e6, "devices": 10_000_000,
    "training_hours": 1e7, "training_tokens": 1e18, "engineer_cost_per_day": 1e7,
    "team_size": 100_000, "deadline_weeks": 10_000,
}
"""Far above any real team, low enough that every cost (hours x devices x price, plus
engineering) stays a finite number: a price of 1e308 made the scores NaN."""


@dataclass(kw_only=True, slots=True, frozen=True)
class TeamProfile:
    """A validated team profile (see docs/advisor.md for each field's effect)."""

    name: str = ""
    """A title shown in the output, e.g. 'Startup, 7B on H100'."""
    hardware: str
    """Accelerator family: nvidia, amd, tpu, ascend, apple or cpu."""
    model_params: float
    """Target model size in parameters (7e9 for a 7B model)."""
    experience: Mapping[str, str] = field(default_factory=dict)
    """Team experience per framework (none / some / expert); frameworks left out are 'none'."""
    functional_programming: str = "none"
    """Team experience with functional programming (none / some / expert); matters for JAX."""
    existing_code: str = "none"
    """Framework the existing training code base is written in, or 'none'."""
    deployment: str
    """Where the trained model runs: server, mobile, browser or edge."""
    localisation: bool = False
    """Whether a domestic-hardware / localisation requirement applies."""
    parallelism: str = "none"
    """Preference: 'auto' (declarative sharding), 'manual' (hand control) or 'none'."""
    purpose: str
    """'research' (iterate on ideas), 'production' (ship and maintain a model) or 'finetune'
    (adapt a pretrained model, fully or with LoRA, rather than train one)."""
    gpu_price_per_hour: float
    """Price of one device for one hour, USD."""
    devices: int
    """Number of devices the training runs on."""
    training_hours: float | None = None
    """Expected training wall-clock hours on the fastest stack; None: derive from tokens."""
    training_tokens: float | None = None
    """Training tokens, used to derive training hours when training_hours is not given."""
    engineer_cost_per_day: float
    """Fully loaded cost of one engineer-day, USD."""
    team_size: int = 1
    """Engineers who must learn the chosen stack (ramp-up days are per engineer)."""
    deadline_weeks: float
    """Weeks until the model must be trained."""
    serving_requests_per_day: float | None = None
    """Requests the deployed model serves a day (with serving_seconds_per_request: the
    serving term of the cost of ownership)."""
    serving_seconds_per_request: float | None = None
    """Device-seconds one request takes on the target hardware with the fastest stack's
    artifact; each stack's is this times its measured latency relative to the fastest."""
    serving_days: float = 365.0
    """Days of serving the cost of ownership counts."""

    def __post_init__(self) -> None:
        if not isinstance(self.name, str):
            raise UserError(f"name must be a string. Received: {self.name!r}")
        _check_choice("hardware", self.hardware, HARDWARE)
        _check_positive("model_params", self.model_params)
        if not isinstance(self.experience, Mapping):
            raise UserError(
                f"experience must be a table of framework = level. Received: {self.experience!r}"
            )
        for framework, level in self.experience.items():
            _check_choice("experience framework", framework, FRAMEWORKS)
            _check_choice(f"experience.{framework}", level, LEVELS)
        # Fill the frameworks left out so that every consumer sees all six; a plain dict copy
        # keeps the caller's mapping from changing the frozen profile afterwards.
        full = {fw: self.experience.get(fw, "none") for fw in FRAMEWORKS}
        object.__setattr__(self, "experience", full)
        _check_choice("functional_programming", self.functional_programming, LEVELS)
        _check_choice("existing_code", self.existing_code, EXISTING_CODE)
        _check_choice("deployment", self.deployment, DEPLOYMENTS)
        if not isinstance(self.localisation, bool):
            raise UserError(f"localisation must be true or false. Received: {self.localisation!r}")
        _check_choice("parallelism", self.parallelism, PARALLELISM)
        _check_choice("purpose", self.purpose, PURPOSES)
        _check_positive("gpu_price_per_hour", self.gpu_price_per_hour)
        _check_positive("devices", self.devices, integer=True)
        if self.training_hours is not None:
            _check_positive("training_hours", self.training_hours)
        if self.training_tokens is not None:
            _check_positive("training_tokens", self.training_tokens)
        if self.training_hours is None and self.training_tokens is None:
            raise UserError(
                "the profile needs training_hours (expected hours on the fastest stack) or "
                "training_tokens (hours are then derived from 6 x params x tokens); "
                "received neither"
            )
        _check_positive("engineer_cost_per_day", self.engineer_cost_per_day)
        _check_positive("team_size", self.team_size, integer=True)
        _check_positive("deadline_weeks", self.deadline_weeks)
        serving = (self.serving_requests_per_day, self.serving_seconds_per_request)
        if (serving[0] is None) != (serving[1] is None):
            raise UserError("the serving term needs both serving_requests_per_day and "
                            "serving_seconds_per_request, or neither. Received: "
                            f"{serving[0]!r} and {serving[1]!r}")
        for key, value in zip(("serving_requests_per_day", "serving_seconds_per_request"),
                              serving):
            if value is not None:
                _check_positive(key, value)
        _check_positive("serving_days", self.serving_days)

    def serving_hours(self) -> float:
        """Device-hours of serving on the fastest stack (0 without the serving figures)."""
        if self.serving_requests_per_day is None or self.serving_seconds_per_request is None:
            return 0.0
        return (self.serving_requests_per_day * self.serving_days
                * self.serving_seconds_per_request / 3600.0)

    def team_best(self) -> tuple[str, ...]:
        """Frameworks the team knows best (all at the highest level), or ('none',)."""
        top = max(LEVELS.index(level) for level in self.experience.values())
        if top == 0:
            return ("none",)
        return tuple(fw for fw in FRAMEWORKS if LEVELS.index(self.experience[fw]) == top)

    def facts(self) -> dict[str, Any]:
        """The values rule conditions can test (see sextant.advisor.rules.Condition).

        Cost inputs (prices, hours) are deliberately absent: if a rule could fire on the GPU
        price, the ranking would no longer be a smooth function of price and the sensitivity
        break-even could not be computed exactly.
        """
        return {
            "hardware": self.hardware,
            "model_params": float(self.model_params),
            "experience": dict(self.experience),
            "functional_programming": self.functional_programming,
            "existing_code": self.existing_code,
            "deployment": self.deployment,
            "localisation": self.localisation,
            "parallelism": self.parallelism,
            "purpose": self.purpose,
            "devices": self.devices,
            "team_size": self.team_size,
            "deadline_weeks": float(self.deadline_weeks),
            "team_best": self.team_best(),
        }

    def to_dict(self) -> dict[str, Any]:
        raw = dataclasses.asdict(self)
        raw["experience"] = dict(self.experience)
        return raw


REQUIRED = (
    "hardware",
    "model_params",
    "deployment",
    "purpose",
    "gpu_price_per_hour",
    "devices",
    "engineer_cost_per_day",
    "deadline_weeks",
)
OPTIONAL = (
    "name",
    "experience",
    "functional_programming",
    "existing_code",
    "localisation",
    "parallelism",
    "training_hours",
    "training_tokens",
    "team_size",
    "serving_requests_per_day",
    "serving_seconds_per_request",
    "serving_days",
)
KEYS = REQUIRED + OPTIONAL


def parse_profile(raw: Mapping[str, Any], *, source: str = "profile") -> TeamProfile:
    """Build a TeamProfile from a parsed TOML table, rejecting unknown and missing keys."""
    unknown = sorted(set(raw) - set(KEYS))
    if unknown:
        raise UserError(
            f"{source}: unknown key {unknown[0]!r}; allowed: {allowed(tuple(sorted(KEYS)))}"
        )
    missing = [key for key in REQUIRED if key not in raw]
    if missing:
        raise UserError(f"{source}: missing required key(s): {', '.join(missing)}")
    values = dict(raw)
    experience = values.get("experience", {})
    if not isinstance(experience, Mapping):
        raise UserError(
            f"{source}: experience must be a table like [experience] pytorch = \"expert\". "
            f"Received: {experience!r}"
        )
    try:
        return TeamProfile(**values)
    except UserError as exc:
        raise UserError(f"{source}: {exc}") from None


BUNDLED_PROFILES = Path(__file__).parent / "profiles"
"""Profiles shipped with sextant, loaded by name (`--profile mac-mlx-finetune`)."""


def bundled_profiles() -> list[str]:
    return sorted(p.stem for p in BUNDLED_PROFILES.glob("*.toml"))


def load_profile(path: str | Path) -> TeamProfile:
    """Read and validate a profile TOML file, or a bundled profile by its name."""
    path = Path(path)
    if not path.exists() and path.suffix == "" and (BUNDLED_PROFILES / f"{path}.toml").is_file():
        path = BUNDLED_PROFILES / f"{path}.toml"
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise UserError(
            f"profile {str(path)!r} does not exist; write a template with "
            f"'sextant advise init PATH', or name a bundled one: "
            f"{', '.join(bundled_profiles())}"
        ) from None
    except (IsADirectoryError, PermissionError, UnicodeDecodeError) as exc:
        raise UserError(f"cannot read profile {str(path)!r}: {exc}") from None
    raw = parse_toml(text, f"profile {str(path)!r}")
    return parse_profile(raw, source=path.name)


TEMPLATE = """\
# sextant team profile: `sextant advise --profile THIS_FILE`
# Every key is explained in docs/advisor.md. Unknown keys are an error.
# TOML puts every key after a [table] header into that table, so [experience] comes last.

name = "My team"                 # shown in the output

# --- hardware and model ---------------------------------------------------------
hardware = "nvidia"              # nvidia | amd | tpu | ascend | apple | cpu
model_params = 7e9               # target model size in parameters (7e9 = 7B)
devices = 8                      # devices (GPUs, TPU chips, NPUs, Macs) used for training

# --- the product ----------------------------------------------------------------
deployment = "server"            # server | mobile | browser | edge
localisation = false             # domestic-hardware / localisation requirement
parallelism = "none"             # auto (declarative sharding) | manual (hand control) | none
purpose = "production"           # research | production | finetune

# --- money and time -------------------------------------------------------------
gpu_price_per_hour = 2.50        # USD per device-hour
training_hours = 300             # expected hours on the fastest stack; or drop this line
# training_tokens = 1.4e11       # ... and give tokens: hours = 6 x params x tokens / FLOP/s
engineer_cost_per_day = 800      # USD per engineer-day, fully loaded
deadline_weeks = 12              # weeks until the model must be trained

# --- the team -------------------------------------------------------------------
team_size = 3                    # engineers who must learn the chosen stack
functional_programming = "some"  # none | some | expert (matters for JAX)
existing_code = "pytorch"        # pytorch | jax | tensorflow | paddle | mindspore | mlx | none

[experience]                     # none | some | expert; frameworks left out count as none
pytorch = "expert"
jax = "none"
tensorflow = "some"
paddle = "none"
mindspore = "none"
mlx = "none"
"""


def write_template(path: str | Path) -> Path:
    """Write the commented template; refuse to overwrite an existing file."""
    path = Path(path)
    if path.exists():
        raise UserError(f"{str(path)!r} already exists; pass another path to 'sextant advise init' or remove it")
    if not path.parent.exists():
        raise UserError(f"directory {str(path.parent)!r} does not exist; create it first")
    path.write_text(TEMPLATE, encoding="utf-8")
    return path


@dataclass(kw_only=True, slots=True, frozen=True)
class Question:
    """One interactive question."""

    key: str
    """Profile key the answer fills (experience.<fw> for experience)."""
    prompt: str
    """What is asked."""
    kind: str
    """'choice', 'number', 'integer', 'bool' or 'text'."""
    choices: tuple[str, ...] = ()
    """Allowed answers for 'choice'."""
    default: Any = None
    """Answer used for an empty reply; None: an answer is required."""
    optional: bool = False
    """An empty reply leaves the key out of the profile."""


QUESTIONS = (
    Question(key="name", prompt="Profile name", kind="text", default="interactive"),
    Question(key="hardware", prompt="Hardware family", kind="choice", choices=HARDWARE),
    Question(key="model_params", prompt="Target model size in parameters (e.g. 7e9)",
             kind="number"),
    *(
        Question(key=f"experience.{fw}", prompt=f"Team experience with {fw}", kind="choice",
                 choices=LEVELS, default="none")
        for fw in FRAMEWORKS
    ),
    Question(key="functional_programming", prompt="Team experience with functional programming",
             kind="choice", choices=LEVELS, default="none"),
    Question(key="existing_code", prompt="Existing code base framework", kind="choice",
             choices=EXISTING_CODE, default="none"),
    Question(key="deployment", prompt="Deployment target", kind="choice", choices=DEPLOYMENTS,
             default="server"),
    Question(key="localisation", prompt="Domestic-hardware / localisation requirement",
             kind="bool", default=False),
    Question(key="parallelism", prompt="Parallelism preference", kind="choice",
             choices=PARALLELISM, default="none"),
    Question(key="purpose", prompt="Research or production (or finetune)", kind="choice",
             choices=PURPOSES),
    Question(key="gpu_price_per_hour", prompt="Price per device-hour, USD", kind="number"),
    Question(key="devices", prompt="Number of devices", kind="integer"),
    Question(key="training_hours", prompt="Expected training hours (empty: derive from tokens)",
             kind="number", optional=True),
    Question(key="training_tokens", prompt="Training tokens (empty if hours given)",
             kind="number", optional=True),
    Question(key="engineer_cost_per_day", prompt="Engineer cost per day, USD", kind="number"),
    Question(key="team_size", prompt="Engineers who must learn the stack", kind="integer",
             default=1),
    Question(key="deadline_weeks", prompt="Deadline in weeks", kind="number"),
)


def _convert(question: Question, reply: str) -> Any:
    """Turn one reply into a value, or raise UserError saying what is allowed."""
    if question.kind == "choice":
        value = reply.strip().lower()
        _check_choice(question.key, value, question.choices)
        return value
    if question.kind == "bool":
        value = reply.strip().lower()
        if value in ("y", "yes", "true"):
            return True
        if value in ("n", "no", "false"):
            return False
        raise UserError(f"{question.key}: received {reply!r}; allowed: yes, no")
    if question.kind in ("number", "integer"):
        try:
            number: int | float = int(reply) if question.kind == "integer" else float(reply)
        except ValueError:
            kind = "an integer" if question.kind == "integer" else "a number"
            raise UserError(f"{question.key}: received {reply!r}; expected {kind}") from None
        _check_positive(question.key, number, integer=question.kind == "integer")
        return number
    return reply.strip()


def ask_profile(
    ask: Callable[[str], str] | None = None, say: Callable[[str], None] | None = None
) -> TeamProfile:
    """Ask the profile questions one by one; a bad answer is explained and asked again.

    ask/say default to input()/print(), looked up at call time (not bound as defaults) so
    that a replaced builtins.input is honoured.
    """
    ask = ask or input
    say = say or print
    raw: dict[str, Any] = {"experience": {}}
    for question in QUESTIONS:
        hint = f" [{'/'.join(question.choices)}]" if question.choices else ""
        if question.default is not None:
            shown = "yes" if question.default is True else "no" if question.default is False \
                else question.default
            hint += f" (default {shown})"
        while True:
            reply = ask(f"{question.prompt}{hint}: ").strip()
            if not reply:
                if question.default is not None:
                    value = question.default
                    break
                if question.optional:
                    value = None
                    break
                say("  an answer is required")
                continue
            try:
                value = _convert(question, reply)
                break
            except UserError as exc:
                say(f"  {exc}")
        if value is None:
            continue
        if question.key.startswith("experience."):
            raw["experience"][question.key.split(".", 1)[1]] = value
        else:
            raw[question.key] = value
    return parse_profile(raw, source="answers")
