"""Each example profile: the recommended stack, the runner-up and exactly which rules fired."""

from __future__ import annotations

import pytest

from sextant.advisor import advise, load_profile
from tests.advisor.util import EXAMPLES

# profile file -> (top, second, fired ids in rules-file order)
EXPECTED = {
    "startup-nvidia-pytorch": ("pytorch", "pytorch+deepspeed", [
        "hw.mlx-apple-only", "hw.gpu", "scale.small.team-pytorch",
        "scale.small.no-extra-sharding", "purpose.production", "migrate.keep-pytorch",
    ]),
    "tpu-research-lab-jax": ("jax", "tensorflow", [
        "hw.mlx-apple-only", "hw.deepspeed-no-tpu", "hw.mindspore-backends",
        "hw.paddle-backends", "hw.tpu", "scale.large.tpu-jax", "control.auto",
        "purpose.research", "team.fp-expert-jax", "migrate.keep-jax",
    ]),
    "ascend-localisation": ("mindspore", "paddle", [
        "hw.mlx-apple-only", "hw.jax-no-ascend", "hw.ascend", "hw.ascend-tensorflow-legacy",
        "scale.large.ascend-mindspore", "control.auto", "local.domestic",
        "local.foreign-stack", "purpose.production", "team.fp-none-jax",
        "migrate.keep-pytorch",
    ]),
    "mobile-product": ("tensorflow", "pytorch", [
        "hw.mlx-apple-only", "hw.gpu", "scale.small.team-tensorflow",
        "scale.small.no-extra-sharding", "deploy.mobile-edge", "purpose.production",
        "team.fp-none-jax", "migrate.keep-tensorflow", "deadline.ramp-up",
    ]),
    "domestic-nvidia-paddle": ("paddle", "pytorch", [
        "hw.mlx-apple-only", "hw.gpu", "scale.small.team-pytorch", "scale.small.team-paddle",
        "scale.small.no-extra-sharding", "local.domestic", "local.foreign-stack",
        "purpose.production", "team.fp-none-jax",
    ]),
    "large-gpu-deepspeed": ("pytorch+deepspeed", "pytorch", [
        "hw.mlx-apple-only", "hw.gpu", "scale.large.gpu-sharding", "control.manual",
        "purpose.production", "migrate.keep-pytorch",
    ]),
}


# Bundled profiles, loaded by name: the fine-tuning ones.
BUNDLED = {
    # The articles' local fine-tuning on a Mac with MLX.
    "mac-mlx-finetune": ("mlx", "pytorch", [
        "hw.mindspore-backends", "hw.paddle-backends", "hw.apple", "hw.apple-no-sharding",
        "scale.small.team-mlx", "scale.small.no-extra-sharding", "purpose.finetune",
        "team.fp-none-jax", "deadline.ramp-up",
    ]),
    "gpu-lora-finetune": ("pytorch", "pytorch+deepspeed", [
        "hw.mlx-apple-only", "hw.gpu", "scale.small.team-pytorch",
        "scale.small.no-extra-sharding", "purpose.finetune", "migrate.keep-pytorch",
        "deadline.ramp-up",
    ]),
}


def test_every_example_is_covered() -> None:
    from sextant.advisor.profile import bundled_profiles

    files = sorted(p.stem for p in EXAMPLES.glob("*.toml"))
    assert files == sorted(EXPECTED)
    assert bundled_profiles() == sorted(BUNDLED)
    assert len({top for top, _, _ in {**EXPECTED, **BUNDLED}.values()}) >= 5  # contrasting


@pytest.mark.parametrize("name", sorted({**EXPECTED, **BUNDLED}))
def test_example_ranking_and_fired_rules(name: str) -> None:
    top, second, fired = {**EXPECTED, **BUNDLED}[name]
    advice = advise(load_profile(EXAMPLES / f"{name}.toml" if name in EXPECTED else name))
    assert [r.candidate for r in advice.ranking[:2]] == [top, second]
    assert [f.id for f in advice.fired] == fired
    # The winner's reasons name rules that fired, each with its rationale available.
    fired_ids = {f.id for f in advice.fired}
    assert advice.ranking[0].reasons
    assert all(rule_id in fired_ids for rule_id, _, _ in advice.ranking[0].reasons)
    assert all(f.rationale.endswith(".") for f in advice.fired)
    assert advice.ranking[0].candidate == advice.sensitivity.top


def test_excluded_candidates_carry_their_reason() -> None:
    advice = advise(load_profile(EXAMPLES / "tpu-research-lab-jax.toml"))
    excluded = {e.candidate: e.reasons for e in advice.excluded}
    assert set(excluded) == {"pytorch+deepspeed", "paddle", "mindspore", "mlx"}
    assert excluded["pytorch+deepspeed"][0][0] == "hw.deepspeed-no-tpu"
    assert "TPU" in excluded["pytorch+deepspeed"][0][1]
    assert all(r.candidate not in excluded for r in advice.ranking)


def test_ascend_example_has_an_exact_price_break_even() -> None:
    advice = advise(load_profile(EXAMPLES / "ascend-localisation.toml"))
    assert "falls below" in advice.sensitivity.headline
    assert "pytorch ranks first" in advice.sensitivity.headline
