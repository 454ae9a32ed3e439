"""Profile validation, the template and the interactive questions."""

from __future__ import annotations

from pathlib import Path

import pytest

from sextant.advisor.profile import (
    QUESTIONS,
    TEMPLATE,
    ask_profile,
    load_profile,
    parse_profile,
    write_template,
)
from sextant.core.errors import UserError
from tests.advisor.util import raw_profile


def test_valid_profile_fills_missing_experience_with_none() -> None:
    p = parse_profile(raw_profile())
    assert p.experience == {"pytorch": "expert", "jax": "some", "tensorflow": "none",
                            "paddle": "none", "mindspore": "none", "mlx": "none"}
    assert p.team_best() == ("pytorch",)
    assert parse_profile(raw_profile(experience={})).team_best() == ("none",)


def test_unknown_key_is_rejected_with_the_allowed_keys() -> None:
    with pytest.raises(UserError, match=r"unknown key 'gpu_prize'.*allowed: .*gpu_price_per_hour"):
        parse_profile(raw_profile(gpu_prize=2.0))


@pytest.mark.parametrize(("key", "value", "allowed"), [
    ("hardware", "nvida", "nvidia, amd, tpu, ascend, apple, cpu"),
    ("deployment", "desktop", "server, mobile, browser, edge"),
    ("parallelism", "magic", "auto, manual, none"),
    ("purpose", "fun", "research, production"),
    ("functional_programming", "guru", "none, some, expert"),
    ("existing_code", "caffe", "pytorch, jax, tensorflow, paddle, mindspore, mlx, none"),
])
def test_bad_enum_value_names_the_allowed_values(key: str, value: str, allowed: str) -> None:
    with pytest.raises(UserError) as info:
        parse_profile(raw_profile(**{key: value}))
    message = str(info.value)
    assert repr(value) in message and f"allowed: {allowed}" in message
    assert "\n" not in message


def test_bad_experience_is_rejected() -> None:
    with pytest.raises(UserError, match="allowed: pytorch, jax"):
        parse_profile(raw_profile(experience={"caffe": "expert"}))
    with pytest.raises(UserError, match=r"experience.jax.*allowed: none, some, expert"):
        parse_profile(raw_profile(experience={"jax": "guru"}))
    with pytest.raises(UserError, match="experience must be a table"):
        parse_profile(raw_profile(experience="pytorch"))


@pytest.mark.parametrize(("key", "value"), [
    ("devices", True), ("devices", 2.5), ("devices", 0), ("gpu_price_per_hour", -1),
    ("gpu_price_per_hour", "cheap"), ("model_params", float("nan")), ("deadline_weeks", 0),
    ("team_size", 0), ("training_hours", -5),
])
def test_bad_numbers_are_rejected(key: str, value: object) -> None:
    with pytest.raises(UserError, match=key):
        parse_profile(raw_profile(**{key: value}))


def test_missing_keys_and_missing_duration() -> None:
    raw = raw_profile()
    del raw["hardware"], raw["purpose"]
    with pytest.raises(UserError, match="missing required key.*hardware, purpose"):
        parse_profile(raw)
    with pytest.raises(UserError, match="training_hours.*training_tokens"):
        parse_profile(raw_profile(training_hours=None))
    assert parse_profile(raw_profile(training_hours=None, training_tokens=1e11)).training_tokens


def test_localisation_must_be_bool() -> None:
    with pytest.raises(UserError, match="localisation must be true or false"):
        parse_profile(raw_profile(localisation="yes"))


def test_template_is_a_valid_profile_and_is_not_overwritten(tmp_path: Path) -> None:
    path = write_template(tmp_path / "p.toml")
    assert path.read_text() == TEMPLATE
    assert load_profile(path).hardware == "nvidia"
    with pytest.raises(UserError, match="already exists"):
        write_template(path)
    with pytest.raises(UserError, match="does not exist"):
        write_template(tmp_path / "missing-dir" / "p.toml")


def test_load_profile_errors(tmp_path: Path) -> None:
    with pytest.raises(UserError, match="does not exist.*advise init"):
        load_profile(tmp_path / "nope.toml")
    bad = tmp_path / "bad.toml"
    bad.write_text("hardware = nvidia\n")
    with pytest.raises(UserError, match="not valid TOML"):
        load_profile(bad)


def test_interactive_questions_reask_after_a_bad_answer() -> None:
    answers = {
        "Hardware family": ["gpu", "tpu"],  # first answer invalid, asked again
        "Target model size": ["7e10"],
        "Team experience with jax": ["expert"],
        "functional programming": ["expert"],
        "Existing code base": ["jax"],
        "Parallelism preference": ["auto"],
        "Research or production": ["research"],
        "Price per device-hour": ["4.2"],
        "Number of devices": ["two", "512"],
        "Expected training hours": ["1200"],
        "Engineer cost per day": ["1100"],
        "Deadline in weeks": ["26"],
    }
    asked, said = [], []

    def ask(prompt: str) -> str:
        asked.append(prompt)
        for key, replies in answers.items():
            if prompt.startswith(key) or key in prompt:
                return replies.pop(0) if len(replies) > 1 else replies[0]
        return ""  # take the default

    p = ask_profile(ask=ask, say=said.append)
    assert (p.hardware, p.devices, p.experience["jax"], p.training_hours) == ("tpu", 512,
                                                                             "expert", 1200.0)
    assert p.training_tokens is None and p.localisation is False and p.team_size == 1
    assert any("allowed: nvidia" in s for s in said)
    assert any("expected an integer" in s for s in said)
    assert len(asked) == len(QUESTIONS) + 2
