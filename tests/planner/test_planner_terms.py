"""The step's terms, each alone: _evaluate is their sum over one LayoutContext."""

from __future__ import annotations

import ast
import dataclasses
import inspect

import numpy as np
import pytest

from sextant.planner import estimate
from sextant.planner.catalogue import load_catalogue
from sextant.planner.context import layout_context, links
from sextant.planner.estimate import Layout, PlanOptions, resolve_hardware
from sextant.planner.terms import (
    bubble_term,
    compute_term,
    cp_term,
    dp_term,
    ep_term,
    memory_term,
    optimizer_term,
    pp_term,
    tp_term,
)
from sextant.planner.models import preset
from sextant.planner.profiles import PROFILES

CAT = load_catalogue(calibration=None)


def _ctx(model="llama3-8b", batch=64, acc="h100-sxm", net="ib-ndr", **knobs):
    opts = PlanOptions(global_batch=batch, **knobs.pop("opts", {}))
    hw = resolve_hardware(CAT, acc, net, options=opts)
    lays = [Layout(**k) for k in knobs.pop("layouts")]
    arrays = {key: np.concatenate([lay.arrays()[key] for lay in lays]) for key in lays[0].arrays()}
    return layout_context(preset(model).cost(), hw, opts, arrays)


def test_the_context_counts_devices_microbatches_and_tokens():
    c = _ctx(layouts=[dict(dp=4, tp=2, pp=2, mbs=2), dict(dp=2, tp=2, cp=4, mbs=1)])
    assert list(c.n) == [16, 16]
    assert list(c.m) == [8, 32]
    assert list(c.tok_dev) == [2 * 8192, 8192 / 4]
    # The last stage holds the output projection, the first the embedding (same size here,
    # untied): both hold ceil(32 / 2) layers; without a pipeline all of the model.
    assert c.psi_first[0] == pytest.approx(c.psi_last[0], rel=0.01)
    assert c.psi_first[1] == pytest.approx(preset("llama3-8b").total_params() / 2, rel=1e-9)


def test_memory_term_is_sharded_states_plus_activations_plus_allowance():
    c = _ctx(layouts=[dict(dp=8, zero=0), dict(dp=8, zero=3)], batch=8)
    m = memory_term(c)
    assert m.memory[1] < m.memory[0]
    assert np.allclose(m.memory, m.raw * (1 + c.opts.fragmentation) + 1e9)
    assert np.all(m.activations > 0) and list(m.fits) == [False, True]  # 187 GB vs 64 GB


def test_compute_term_counts_recomputation_and_fp8():
    c = _ctx(layouts=[dict(dp=8, recompute="none"), dict(dp=8, recompute="full")])
    t = compute_term(c)
    assert 1.25 < t.flops_bound[1] / t.flops_bound[0] < 1.34  # +1 forward of 3 passes
    fp8 = compute_term(_ctx(layouts=[dict(dp=8)], opts={"fp8": True}, acc="b200"))
    bf16 = compute_term(_ctx(layouts=[dict(dp=8)], acc="b200"))
    assert fp8.flops_bound[0] < bf16.flops_bound[0]


def test_optimizer_term_shrinks_with_sharding_and_grows_with_offload():
    c = _ctx(layouts=[dict(dp=8, zero=0), dict(dp=8, zero=1), dict(dp=8, zero=1,
                                                                    offload="optimizer")])
    t = optimizer_term(c)
    assert t[1] == pytest.approx(t[0] / 8)
    assert t[2] > t[1]


def test_tensor_parallel_term_grows_when_it_leaves_the_node():
    c = _ctx(model="llama2-70b", batch=32,
             layouts=[dict(dp=16, tp=1), dict(dp=2, tp=8), dict(dp=1, tp=16)])
    t = tp_term(c, links(c))
    assert t[0] == 0 and t[2] > t[1] > 0


def test_pipeline_context_and_expert_terms_vanish_without_their_parallelism():
    c = _ctx(layouts=[dict(dp=8), dict(dp=2, pp=4), dict(dp=1, cp=8)], batch=16)
    lk = links(c)
    assert pp_term(c, lk)[0] == 0 and pp_term(c, lk)[1] > 0
    assert cp_term(c, lk, compute_term(c).peak)[0] == 0
    assert np.all(ep_term(c, lk) == 0)  # a dense model
    moe = _ctx(model="mixtral-8x7b", layouts=[dict(dp=8, ep=1), dict(dp=8, ep=8)], batch=16)
    t = ep_term(moe, links(moe))
    assert t[0] == 0 and t[1] > 0


def test_all_gather_context_parallelism_hides_less():
    kw = {"layouts": [dict(dp=1, cp=16)], "batch": 1}
    long = dataclasses.replace(preset("llama3-8b"), seq_len=131072)
    out = {}
    for stack in ("megatron-core", "torchtitan"):
        opts = PlanOptions(global_batch=1, stack=PROFILES[stack])
        hw = resolve_hardware(CAT, "h100-sxm", "ib-ndr", options=opts)
        lay = Layout(**kw["layouts"][0]).arrays()
        c = layout_context(long.cost(), hw, opts, lay)
        out[stack] = cp_term(c, links(c), compute_term(c).peak)[0]
    assert out["torchtitan"] > out["megatron-core"]


def test_bubble_term_is_p_minus_1_over_v_m():
    c = _ctx(layouts=[dict(dp=2, pp=4, interleave=2)], batch=16)
    work = np.array([1.0])
    assert bubble_term(c, work)[0] == pytest.approx(3 / (2 * 8))


def test_dp_term_hides_at_most_the_overlap_share():
    c = _ctx(layouts=[dict(dp=64, zero=0)], batch=64)
    comp = compute_term(c).seconds
    t = dp_term(c, links(c), comp)
    assert t.exposed[0] == pytest.approx(t.seconds[0] - t.hidden[0])
    assert t.hidden[0] <= 0.5 * t.seconds[0] + 1e-15
    none = PlanOptions(global_batch=64, overlap=0.0)
    c0 = dataclasses.replace(c, opts=none)
    assert dp_term(c0, links(c0), comp).hidden[0] == 0


def test_the_step_is_the_sum_of_the_terms():
    c = _ctx(model="llama2-70b", batch=64,
             layouts=[dict(dp=4, tp=8, pp=2, zero=1, mbs=1, recompute="full", sp=True)])
    res = estimate._evaluate(c.cost, c.hw, c.opts, Layout(dp=4, tp=8, pp=2, zero=1, mbs=1,
                                                           recompute="full", sp=True).arrays())
    names = ("compute", "optimizer", "tp_comm", "cp_comm", "ep_comm", "pp_comm", "bubble",
             "dp_exposed")
    assert tuple(p.name for p in res.step_parts) == names
    assert res.step[0] == sum(p.seconds[0] for p in res.step_parts)  # the sum, in this order


def test_evaluate_is_short_and_every_term_simple():
    src = inspect.getsource(estimate._evaluate)
    assert len(src.splitlines()) <= 60
    # No branch in _evaluate: the terms hold them.
    tree = ast.parse(src)
    assert not any(isinstance(n, (ast.If, ast.For, ast.While, ast.IfExp)) for n in ast.walk(tree))
