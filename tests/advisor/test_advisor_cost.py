"""Cost of ownership arithmetic, the exact sensitivity break-even, and determinism."""

from __future__ import annotations

import dataclasses
import json
import math

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sextant.advisor import advise, load_profile, load_rules, to_dict
from sextant.advisor.engine import Advice, BreakEven
from sextant.advisor.profile import TeamProfile
from tests.advisor.util import EXAMPLES, profile


def test_tco_arithmetic_by_hand() -> None:
    # compute = 100 h x 8 devices x $2 = $1,600 for every stack (no throughput difference on
    # NVIDIA); people = (ramp-up days x 2 engineers + migration days) x $500.
    advice = advise(profile())
    tco = {r.candidate: r.cost.total_usd for r in advice.ranking}
    assert tco == {
        "pytorch": 1600.0,  # expert, existing code: no people cost
        "pytorch+deepspeed": 1600.0 + (5 * 2 + 5) * 500,  # DeepSpeed ramp-up + integration
        "jax": 1600.0 + ((5 + 3) * 2 + 40) * 500,  # some JAX + some FP, default migration
        "tensorflow": 1600.0 + (20 * 2 + 40) * 500,
        "paddle": 1600.0 + (20 * 2 + 25) * 500,
        "mindspore": 1600.0 + (20 * 2 + 30) * 500,
    }
    jax = next(r for r in advice.ranking if r.candidate == "jax")
    assert jax.cost.person_days == 56 and jax.cost.calendar_days == 8 + 40 / 2
    assert jax.cost_penalty == pytest.approx(2.0 * math.log2(29600 / 1600))
    assert jax.score == pytest.approx(jax.fit - jax.deadline_penalty - jax.cost_penalty)


def test_training_hours_derived_from_tokens() -> None:
    advice = advise(profile(training_hours=None, training_tokens=1e11))
    from sextant.planner.catalogue import load_catalogue

    peak = load_catalogue().accelerators["h100-sxm"].peak_flops["bf16"]  # the one source
    hours = 6 * 7e9 * 1e11 / (8 * peak * 0.40) / 3600
    top = advice.ranking[0]
    assert top.cost.reference_hours == pytest.approx(hours)
    assert top.cost.compute_usd == pytest.approx(hours * 8 * 2.0)
    derived = [e for e in advice.evidence if e.metric == "training_hours"]
    assert derived and all(e.source == "rule of thumb" for e in derived)


def test_rule_of_thumb_throughput_scales_compute() -> None:
    advice = advise(profile(hardware="tpu", experience={"jax": "expert"}, existing_code="jax"))
    costs = {r.candidate: r.cost for r in advice.ranking}
    assert costs["pytorch"].throughput_factor == 0.8
    assert costs["pytorch"].compute_usd == pytest.approx(costs["jax"].compute_usd / 0.8)


def _with(p: TeamProfile, name: str, value: float) -> TeamProfile:
    return dataclasses.replace(p, **{name: value})


def _top(p: TeamProfile) -> str:
    return advise(p).top


def check_break_evens(p: TeamProfile, advice: Advice) -> None:
    """Just before each break-even the top holds, just past it new_top leads; none earlier."""
    if p.training_hours is None:  # move hours directly, as the break-even does
        p = dataclasses.replace(p, training_hours=advice.ranking[0].cost.reference_hours)
    for b in advice.sensitivity.break_evens:
        assert isinstance(b, BreakEven)
        side = 1.0 if b.value > b.current else -1.0
        assert _top(_with(p, b.input, b.value * (1 - side * 1e-7))) == advice.top
        assert _top(_with(p, b.input, b.value * (1 + side * 1e-7))) == b.new_top
        for t in (0.25, 0.5, 0.75, 0.95):  # no earlier crossing on the way there
            x = b.current + t * (b.value - b.current)
            assert _top(_with(p, b.input, x)) == advice.top


def test_break_even_matches_the_closed_form() -> None:
    p = load_profile(EXAMPLES / "ascend-localisation.toml")
    advice = advise(p)
    price = next(b for b in advice.sensitivity.break_evens if b.input == "gpu_price_per_hour")
    assert price.new_top == "pytorch" and price.value < price.current
    # mindspore: fit 6, people 55 person-days x $700; pytorch: fit 1.5, no people cost, 0.9x
    # throughput. Tie: 38,500 + 800*64*x = 2**((6 - 1.5) / 2) * (800 / 0.9) * 64 * x.
    r = 2 ** ((6 - 1.5) / 2)
    expected = 38500 / (r * 800 / 0.9 * 64 - 800 * 64)
    assert price.value == pytest.approx(expected, rel=1e-12)
    assert advice.sensitivity.headline.startswith(
        "mindspore stays first unless the GPU price per device-hour falls below $0.18/h")
    check_break_evens(p, advice)


@pytest.mark.parametrize("name", ["large-gpu-deepspeed", "ascend-localisation"])
def test_example_break_evens_are_exact(name: str) -> None:
    p = load_profile(EXAMPLES / f"{name}.toml")
    advice = advise(p)
    assert advice.sensitivity.break_evens
    check_break_evens(p, advice)


def test_no_break_even_says_so() -> None:
    advice = advise(profile())  # pytorch is both best fit and cheapest
    assert advice.sensitivity.break_evens == ()
    assert "lead comes from the rules" in advice.sensitivity.headline


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    hardware=st.sampled_from(["nvidia", "amd", "tpu", "ascend", "apple"]),
    params=st.sampled_from([1e9, 7e9, 3e10, 7e10]),
    price=st.floats(0.2, 10),
    hours=st.floats(5, 5000),
    rate=st.floats(100, 2000),
    team=st.integers(1, 10),
    devices=st.integers(1, 512),
    existing=st.sampled_from(["pytorch", "jax", "tensorflow", "none"]),
    levels=st.tuples(*[st.sampled_from(["none", "some", "expert"])] * 3),
    parallelism=st.sampled_from(["auto", "manual", "none"]),
)
def test_break_evens_are_exact_for_random_profiles(hardware, params, price, hours, rate, team,
                                                   devices, existing, levels, parallelism):
    p = profile(hardware=hardware, model_params=params, gpu_price_per_hour=price,
                training_hours=hours, engineer_cost_per_day=rate, team_size=team,
                devices=devices, existing_code=existing, parallelism=parallelism,
                experience=dict(zip(("pytorch", "jax", "tensorflow"), levels)))
    check_break_evens(p, advise(p))


def test_advice_is_deterministic() -> None:
    for path in sorted(EXAMPLES.glob("*.toml")):
        a = json.dumps(to_dict(advise(load_profile(path))), sort_keys=True)
        b = json.dumps(to_dict(advise(load_profile(path), rules=load_rules())), sort_keys=True)
        assert a == b


def test_ties_break_by_cost_then_fixed_order() -> None:
    # Same fit, same cost: the fixed candidate order decides, never dict/set order.
    p = profile(experience={}, existing_code="none", hardware="cpu", model_params=1e9,
                purpose="research", functional_programming="some")
    advice = advise(p)
    scores = [(r.score, r.cost.total_usd) for r in advice.ranking]
    assert scores == sorted(scores, key=lambda s: (-s[0], s[1]))
