"""Properties that must hold for every input (hypothesis)."""

from __future__ import annotations

from dataclasses import replace
from itertools import pairwise

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from sextant.planner.catalogue import load_catalogue
from sextant.planner.estimate import PlanOptions, evaluate, resolve_hardware
from sextant.planner.models import preset
from sextant.planner.search import enumerate_layouts

CAT = load_catalogue(calibration=None)
MODELS = ["llama2-7b", "llama3-8b", "gpt3-175b", "llama2-70b"]
BATCH = 4096


def _row(**kw):
    base = {"dp": 1, "tp": 1, "pp": 1, "zero": 0, "mbs": 1, "rc": 0, "sp": 0, "off": 0, "v": 1}
    base.update(kw)
    return {k: np.array([v]) for k, v in base.items()}


def _memory(model, **kw):
    opts = PlanOptions(global_batch=BATCH)
    hw = resolve_hardware(CAT, "h100-sxm", "ib-ndr", options=opts)
    return float(evaluate(preset(model).cost(), hw, opts, _row(**kw)).memory[0])


knobs = {
    "model": st.sampled_from(MODELS),
    "zero": st.integers(0, 3),
    "rc": st.sampled_from([0, 2]),
    "off": st.integers(0, 1),
    "pp": st.sampled_from([1, 2, 4, 8]),
    "mbs": st.sampled_from([1, 2, 4]),
}


@settings(max_examples=60, deadline=None)
@given(
    dp=st.sampled_from([1, 2, 4, 8, 16, 32]),
    tp=st.sampled_from([1, 2, 4, 8]),
    sp=st.integers(0, 1),
    **knobs,
)
def test_memory_never_increases_when_a_sharding_degree_grows(
    model, zero, rc, off, pp, mbs, dp, tp, sp
):
    sp = sp if tp > 1 else 0
    common = {"zero": zero, "rc": rc, "off": off, "pp": pp, "mbs": mbs, "sp": sp}
    here = _memory(model, dp=dp, tp=tp, **common)
    assert _memory(model, dp=2 * dp, tp=tp, **common) <= here * (1 + 1e-12)  # data parallel
    assert _memory(model, dp=dp, tp=2 * tp, **common) <= here * (1 + 1e-12)  # tensor parallel


@settings(max_examples=60, deadline=None)
@given(dp=st.sampled_from([2, 8, 64]), model=st.sampled_from(MODELS), off=st.integers(0, 1))
def test_model_states_never_increase_with_the_zero_stage(dp, model, off):
    from sextant.planner.memory import model_state_bytes

    psi = preset(model).total_params()
    totals = [float(model_state_bytes(psi, dp, z, offload=off)["total"]) for z in range(4)]
    assert all(b <= a for a, b in pairwise(totals))


def _slower(link, factor_bw, factor_lat):
    return replace(link, bandwidth=link.bandwidth / factor_bw, latency=link.latency * factor_lat)


@settings(max_examples=80, deadline=None)
@given(
    model=st.sampled_from(MODELS),
    dp=st.sampled_from([1, 4, 16, 64]),
    tp=st.sampled_from([1, 2, 8, 16]),
    pp=st.sampled_from([1, 4]),
    zero=st.integers(0, 3),
    rc=st.sampled_from([0, 2]),
    v=st.sampled_from([1, 2]),
    overlap=st.sampled_from([0.0, 0.5, 1.0]),
    which=st.sampled_from(["intra", "inter"]),
    bw=st.floats(1.0, 100.0),
    lat=st.floats(1.0, 100.0),
)
def test_time_never_decreases_when_a_link_gets_slower(
    model, dp, tp, pp, zero, rc, v, overlap, which, bw, lat
):
    v = v if pp > 1 else 1
    zero = zero if dp > 1 else 0
    opts = PlanOptions(global_batch=BATCH, overlap=overlap)
    hw = resolve_hardware(CAT, "a100-80gb", "ib-hdr", options=opts)
    row = _row(dp=dp, tp=tp, pp=pp, zero=zero, rc=rc, v=v)
    cost = preset(model).cost()
    before = evaluate(cost, hw, opts, row)
    slow_hw = replace(hw, **{which: _slower(getattr(hw, which), bw, lat)})
    after = evaluate(cost, slow_hw, opts, row)
    assert after.step[0] >= before.step[0] * (1 - 1e-12)
    assert after.step_no_overlap[0] >= before.step_no_overlap[0] * (1 - 1e-12)


@settings(max_examples=40, deadline=None)
@given(
    twos=st.integers(0, 12),
    threes=st.integers(0, 2),
    fives=st.integers(0, 1),
    model=st.sampled_from(MODELS),
    batch=st.sampled_from([256, 1024, 1536, 4096]),
)
def test_layouts_always_multiply_to_n(twos, threes, fives, model, batch):
    n = 2**twos * 3**threes * 5**fives
    cost = preset(model).cost()
    lay = enumerate_layouts(cost, n, batch)
    assert np.all(lay["dp"] * lay["tp"] * lay["pp"] == n)
    assert np.all(cost.n_heads % lay["tp"] == 0)
    assert np.all(batch % (lay["dp"] * lay["mbs"]) == 0)
    assert np.all((lay["sp"] == 0) | (lay["tp"] > 1))
