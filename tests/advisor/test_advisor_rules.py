"""The rules file and its declarative condition language."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest

from sextant.advisor import advise
from sextant.advisor.rules import load_rules, parse_condition, parse_rules
from sextant.advisor.vocab import CANDIDATES
from sextant.core.errors import UserError
from tests.advisor.util import REPO, profile

RULES_TEXT = (REPO / "sextant" / "advisor" / "rules.toml").read_text()


def test_shipped_rules_load_and_explain_themselves() -> None:
    rules = load_rules()
    assert rules.version >= 1
    assert len(rules.rules) >= 20 and rules.constraints and rules.evidence_rules
    for rule in rules.rules:
        assert rule.rationale.endswith(".") and rule.effect
        assert all(c in CANDIDATES for c, _ in rule.effect)
    ids = [r.id for r in rules.rules] + [c.id for c in rules.constraints]
    assert len(ids) == len(set(ids))


def test_docs_list_every_rule() -> None:
    docs = (REPO / "docs" / "advisor.md").read_text()
    rules = load_rules()
    for rule_id in ([r.id for r in rules.rules] + [c.id for c in rules.constraints]
                    + [e.id for e in rules.evidence_rules] + [rules.deadline_id]):
        assert f"`{rule_id}`" in docs, rule_id


def test_condition_clauses() -> None:
    cond = parse_condition({"hardware": ["nvidia", "amd"], "model_params_ge": 1e10,
                            "experience": {"jax": ["expert"]}, "localisation": False,
                            "team_best": ["jax"]}, "t")
    facts = profile(model_params=7e10, experience={"jax": "expert"}).facts()
    assert cond.matches(facts)
    assert not cond.matches(profile(model_params=7e9, experience={"jax": "expert"}).facts())
    assert not cond.matches(profile(model_params=7e10).facts())
    assert cond.describe().startswith("hardware in [nvidia, amd] and model_params >= 1e+10")
    assert parse_condition({}, "t").matches(facts)


@pytest.mark.parametrize(("when", "message"), [
    ({"hardwear": ["nvidia"]}, r"unknown condition 'hardwear'; allowed: hardware"),
    ({"hardware": ["gpu"]}, r"unknown value 'gpu'; allowed: nvidia"),
    ({"hardware": "nvidia"}, r"expected a non-empty list"),
    ({"model_params_gt": "1e10"}, r"expected a number"),
    ({"gpu_price_per_hour_gt": 3}, r"unknown condition"),  # cost inputs are not conditionable
    ({"hardware": ["__import__('os').system('x')"]}, r"unknown value"),
    ({"experience": {"caffe": ["expert"]}}, r"unknown framework 'caffe'"),
    ({"localisation": "yes"}, r"expected true or false"),
])
def test_bad_conditions_are_rejected(when: dict, message: str) -> None:
    with pytest.raises(UserError, match=message):
        parse_condition(when, "rules.toml [[rule]] #1")


def _rules(mutate) -> dict:
    raw = tomllib.loads(RULES_TEXT)
    mutate(raw)
    return raw


def test_bad_rules_files_are_rejected(tmp_path: Path) -> None:
    with pytest.raises(UserError, match="unknown key 'extra'; allowed: id, when, effect"):
        parse_rules(_rules(lambda r: r["rule"][0].update(extra=1)), source="x")
    with pytest.raises(UserError, match="unknown key 'caffe'; allowed: pytorch"):
        parse_rules(_rules(lambda r: r["rule"][0].update(effect={"caffe": 1})), source="x")
    with pytest.raises(UserError, match="used twice"):
        parse_rules(_rules(lambda r: r["rule"].append(dict(r["rule"][0]))), source="x")
    with pytest.raises(UserError, match="version must be an integer"):
        parse_rules(_rules(lambda r: r.update(version="one")), source="x")
    with pytest.raises(UserError, match="does not exist"):
        load_rules(tmp_path / "none.toml")


def test_custom_rules_file_changes_the_advice(tmp_path: Path) -> None:
    # A rule boosting JAX massively for NVIDIA teams flips the startup-style profile.
    text = RULES_TEXT + ('\n[[rule]]\nid = "custom.jax"\nwhen = { hardware = ["nvidia"] }\n'
                         'effect = { jax = 50 }\nrationale = "House rule."\n')
    path = tmp_path / "rules.toml"
    path.write_text(text)
    rules = load_rules(path)
    advice = advise(profile(), rules=rules)
    assert advice.top == "jax" and "custom.jax" in [f.id for f in advice.fired]


def test_constraints_excluding_everything_is_a_user_error() -> None:
    raw = _rules(lambda r: r["constraint"].append(
        {"id": "all", "when": {}, "exclude": list(CANDIDATES), "reason": "No."}))
    with pytest.raises(UserError, match="exclude every candidate"):
        advise(profile(), rules=parse_rules(raw, source="x"))
