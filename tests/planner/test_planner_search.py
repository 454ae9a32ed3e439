"""Search and scaling curve."""

from __future__ import annotations

import time
from dataclasses import replace

import numpy as np

from sextant.planner.catalogue import load_catalogue
from sextant.planner.estimate import Layout, PlanOptions, check_layout, resolve_hardware
from sextant.planner.models import preset
from sextant.planner.search import knee, scaling_curve, search, starts_below
from sextant.planner.profiles import PROFILES

CAT = load_catalogue(calibration=None)


def _setup(model="llama2-70b", acc="h100-sxm", net="ib-ndr", **kw):
    shape = preset(model)
    opts = PlanOptions(global_batch=shape.global_batch, **kw)
    return shape.cost(), resolve_hardware(CAT, acc, net, options=opts), opts


def test_search_4096_devices_is_fast_and_the_best_fits():
    cost, hw, opts = _setup()
    t0 = time.perf_counter()
    res = search(cost, hw, opts, 4096)
    assert time.perf_counter() - t0 < 2.0
    best = res.best()
    assert best is not None and res.figures.fits[best]
    tps = res.figures.tokens_per_s[res.order]
    assert np.all(np.diff(tps) <= 1e-9 * tps[0])  # ranked fastest first
    layout = res.layout(best)
    check_layout(cost, layout, 4096, opts.global_batch)


def test_a_70b_model_does_not_fit_on_one_gpu():
    cost, hw, opts = _setup()
    res = search(cost, hw, opts, 1)
    assert res.count > 0 and res.best() is None


def test_scaling_curve_names_the_slow_network():
    cost, hw, opts = _setup("llama2-7b", "a100-80gb", "ethernet-10g")
    points = scaling_curve(cost, hw, opts, 256)
    assert [p.devices for p in points] == [1, 2, 4, 8, 16, 32, 64, 128, 256]
    k = knee(points, 0.8)
    assert k is not None and k.devices > 8  # inside one node NVLink keeps it efficient
    assert "ethernet-10g" in k.cause or "bubble" in k.cause


def test_fp8_scaling_efficiency_is_against_the_fp8_ideal():
    # The ideal prices the model's FLOPs as the step does (the layers' GEMMs at the fp8
    # peak): a compute-bound FP8 run does not reach more than all of it.
    cost, hw, opts = _setup("llama3-8b", "b200", "ib-ndr", fp8=True, stack=PROFILES["megatron-core"])
    points = scaling_curve(cost, hw, opts, 8)
    fitting = [p for p in points if p.layout is not None]
    assert fitting and all(0.5 < p.efficiency < 1.0 for p in fitting)


def test_scaling_efficiency_prices_the_attention_at_its_kernels_rate():
    # The same rule for the attention core: at 64K tokens on H100 the step runs it at
    # cuDNN's rate (Megatron-Core's flash3); an ideal that priced it otherwise put a
    # compute-bound run above all of it.
    shape = replace(preset("llama3-8b"), seq_len=65536, global_batch=64)
    opts = PlanOptions(global_batch=64, stack=PROFILES["megatron-core"])
    hw = resolve_hardware(CAT, "h100-sxm", "ib-ndr", options=opts)
    fitting = [p for p in scaling_curve(shape.cost(), hw, opts, 8) if p.layout is not None]
    assert fitting and all(0.5 < p.efficiency < 1.0 for p in fitting)


def test_a_curve_that_starts_low_names_what_costs_the_efficiency():
    # Llama 2 70B fits 2 H100 only by recomputing: the shortfall is named as recomputation,
    # not as the largest communication or offload overhead.
    cost, hw, opts = _setup("llama2-70b", "h100-sxm", "ib-ndr")
    low = starts_below(scaling_curve(cost, hw, opts, 4), 0.8)
    assert low is not None and low.layout is not None and low.layout.recompute != "none"
    assert low.shortfall.startswith("recomputation (")
    assert low.cause != low.shortfall


def test_pinned_knobs_are_respected():
    cost, hw, opts = _setup()
    res = search(cost, hw, opts, 512, fixed={"tp": 8, "pp": 4})
    assert np.all(res.layouts["tp"] == 8) and np.all(res.layouts["pp"] == 4)
    assert Layout.from_row(res.layouts, 0).dp == 16


def test_search_explains_why_the_choice_beats_the_runner_up(capsys):
    import json

    from sextant.cli import main

    rc = main(["plan", "--model", "llama2-70b", "--gpus", "256", "--search", "--top", "3",
               "--no-curve", "--json"])
    doc = json.loads(capsys.readouterr().out)
    assert rc == 0
    why = doc["search"]["why"]
    assert why["runner_up"] == doc["search"]["top"][1]["layout"]
    diffs = {d["name"]: d["value"] for d in why["differences"]}
    assert why["decisive"] in diffs
    assert diffs[why["decisive"]] == max(diffs.values())
    assert why["runner_up_step"] >= why["step"]
    assert "Decisive term" in why["text"] and "headroom" in why["text"]


def test_a_pinned_interleave_outside_the_searched_ones_is_evaluated():
    """The search tries v in (1, 2, 4); a recipe's v = 5 (Megatron-Bridge's Llama 3 70B on
    H100, 80 layers over pp 8) is a valid layout and must be found when pinned, not reported
    as 'no valid layout'."""
    opts = PlanOptions(global_batch=128)
    cost, hw = preset("llama3-70b").cost(), resolve_hardware(CAT, "h100-sxm", "ib-ndr", options=opts)
    res = search(cost, hw, opts, 64, fixed={"tp": 4, "pp": 8, "mbs": 1, "v": 5})
    assert res.count > 0 and set(res.layouts["v"].tolist()) == {5}
    assert res.layout(int(np.argmax(res.figures.tokens_per_s))).interleave == 5
    check_layout(cost, Layout(dp=2, tp=4, pp=8, interleave=5, mbs=1), 64, 128)
