"""New dimensions of issue #18: FP8, hybrid sharding, fabric oversubscription, host memory
per node; each impossible combination a one-line error."""

from __future__ import annotations

from dataclasses import replace

import json

import pytest

from sextant.cli import main
from sextant.core.errors import UserError
from sextant.planner.catalogue import load_catalogue
from sextant.planner.estimate import Layout, PlanOptions, evaluate_one, resolve_hardware
from sextant.planner.profiles import profile
from sextant.planner.models import preset


def _eval(layout: Layout, devices_per_node=None, **opts):
    o = PlanOptions(global_batch=1024, **opts)
    hw = resolve_hardware(load_catalogue(calibration=None), "h100-sxm", "ib-ndr", options=o)
    return evaluate_one(preset("llama2-70b").cost(), hw, o, layout)


def test_fp8_speeds_up_the_gemms_not_the_attention():
    lay = Layout(dp=64, tp=8, pp=2, zero=1, mbs=1)
    bf16, fp8 = _eval(lay), _eval(lay, fp8=True)
    ratio = fp8.compute.flops_bound / bf16.compute.flops_bound
    assert 0.5 < ratio < 0.6  # 1979 vs 989 TFLOP/s for the GEMMs, attention unchanged
    assert fp8.mfu > bf16.mfu  # MFU stays relative to the bf16 peak


def test_fp8_on_an_accelerator_without_fp8_is_a_one_line_error(capsys):
    rc = main(["plan", "--model", "llama2-7b", "--gpus", "8", "--accelerator", "a100-80gb",
               "--fp8", "--no-curve"])
    assert rc == 2 and "fp8" in capsys.readouterr().err


def test_hybrid_sharding_divides_states_by_the_node_and_keeps_gathers_inside_it():
    full = _eval(Layout(dp=128, tp=1, pp=1, zero=3, mbs=1, recompute="full"))
    hybrid = _eval(Layout(dp=128, tp=1, pp=1, zero=3, mbs=1, recompute="full", hsdp=True))
    assert hybrid.memory_of("optimizer") == pytest.approx(full.memory_of("optimizer") * 128 / 8)
    # With one 400 Gb/s port per GPU the node's network (8 x 50 GB/s) is nearly as fast as
    # its NVLink ring, so a ring over all ranks (pipelined through both) costs about what the
    # gathers on NVLink plus the replicas' all-reduce do. With two ports per node the
    # network is the bottleneck and hybrid sharding, which keeps the gathers inside the
    # node, moves less over it.
    slow = {"nics_per_node": 2}
    full = _eval(Layout(dp=128, tp=1, pp=1, zero=3, mbs=1, recompute="full"), **slow)
    hybrid = _eval(
        Layout(dp=128, tp=1, pp=1, zero=3, mbs=1, recompute="full", hsdp=True), **slow
    )
    assert hybrid.dp_comm < full.dp_comm  # gathers on NVLink instead of the network


def test_hsdp_needs_a_zero_stage():
    with pytest.raises(UserError, match="hsdp"):
        Layout(dp=16, hsdp=True)


def test_oversubscription_slows_collectives_across_leaves():
    lay = Layout(dp=128, tp=8, pp=1, zero=1, mbs=1, recompute="full")
    flat = _eval(lay)
    tapered = _eval(lay, oversubscription=3.0, nodes_per_leaf=32)
    assert tapered.dp_comm > flat.dp_comm
    same_leaf = _eval(lay, oversubscription=3.0, nodes_per_leaf=1024)
    assert same_leaf.dp_comm == pytest.approx(flat.dp_comm)


def test_host_memory_per_node_limits_offload(capsys):
    lay = Layout(dp=16, tp=1, pp=1, zero=3, mbs=1, recompute="full", offload="optimizer")
    free = _eval(lay)
    assert free.host.per_node > 100e9
    limited = _eval(lay, host_memory_gb=64)
    assert bool(limited.fits) is False


def test_cli_flags(capsys):
    rc = main(["plan", "--model", "llama2-70b", "--gpus", "256", "--fp8", "--hsdp", "on",
               "--zero", "3", "--oversubscription", "2", "--nodes-per-leaf", "16",
               "--host-memory-gb", "2048", "--no-curve", "--json"])
    out = capsys.readouterr()
    assert rc == 0, out.err
    assert "hsdp" in json.loads(out.out)["layout"]["label"]
    assert main(["plan", "--model", "llama2-70b", "--gpus", "256", "--oversubscription", "2",
                 "--no-curve"]) == 2
    assert "--nodes-per-leaf" in capsys.readouterr().err


def test_torchtitan_checkpointing_modes_sit_between_none_and_full():
    # "op": every other matmul recomputed (torchtitan selective op AC); "alternate": every
    # second layer fully recomputed (selective layer AC, option 2).
    figs = {
        rc: _eval(Layout(dp=128, tp=8, pp=1, zero=1, mbs=1, recompute=rc))
        for rc in ("none", "op", "alternate", "full")
    }
    acts = {rc: f.memory_of("activations") for rc, f in figs.items()}
    flops = {rc: f.compute.hw_flops_per_token for rc, f in figs.items()}
    assert acts["full"] < acts["op"] < acts["none"]
    assert acts["full"] < acts["alternate"] < acts["none"]
    assert flops["none"] < flops["op"] < flops["full"]
    assert flops["alternate"] == pytest.approx((flops["none"] + flops["full"]) / 2)
    # llama2-70b's matmuls in order Q K V O gate up down: K, O and up are recomputed.
    cost = preset("llama2-70b").cost()
    h, kv, f = 8192, 1024, 28672
    assert cost.op_recompute_flops_per_token == pytest.approx(
        80 * 2 * (h * kv + h * h + h * f)
    )


def _search_json(capsys, *extra: str) -> dict:
    rc = main(["plan", "--model", "llama3-405b", "--gpus", "16384", "--accelerator", "h100-sxm",
               "--network", "ethernet-400g", "--tp", "8", "--pp", "16", "--no-curve", "--json",
               *extra])
    assert rc in (0, None)
    return json.loads(capsys.readouterr().out)


def test_the_search_tries_the_recomputation_between_none_and_full(capsys):
    # Llama 3 405B on 16K H100 (TP 8, PP 16, 8K tokens): no recomputation does not fit
    # without offloading, full recomputation costs a third more compute; the search must
    # find the operator-level mode between them, unpinned, and it must be the faster.
    best = _search_json(capsys)
    full = _search_json(capsys, "--recompute", "full")
    assert "rc-op" in best["layout"]["label"] or "rc-alternate" in best["layout"]["label"]
    assert best["throughput"]["tokens_per_s"] > 1.1 * full["throughput"]["tokens_per_s"]


def test_pinned_torchtitan_modes_reach_the_search(capsys):
    rc = main(["plan", "--model", "llama3-8b", "--gpus", "64", "--accelerator", "a100-80gb",
               "--dp", "64", "--zero", "3", "--mbs", "1", "--recompute", "op",
               "--memory-model", "torch", "--global-batch", "64", "--no-curve", "--json"])
    assert rc in (0, None)
    out = capsys.readouterr().out
    assert "rc-op" in out
    # The torch memory model is below torchtitan's published peak memory: the plan says so.
    assert any("lower bound" in w for w in json.loads(out)["warnings"])


def test_selective_recomputation_hfu_is_korthikantis_count():
    """Korthikanti et al. 2022, Appendix A: model FLOPs 72 B L s h^2 (1 + s/6h + v/12hL)
    (Eq. 7), hardware FLOPs with selective recomputation 72 B L s h^2 (1 + s/3h + v/12hL)
    (Eq. 8), the ratio behind Table 5's HFU; the step pays the forward re-run only."""
    from sextant.planner.models import megatron_gpt

    L, h, s, v = 105, 20480, 2048, 51200  # the 530B model of their Table 3
    shape = megatron_gpt(n_layers=L, d_model=h, n_heads=128, seq_len=s, vocab_size=v,
                         global_batch=8)
    opts = PlanOptions(global_batch=8, stack=profile("megatron-lm-2021"))
    hw = resolve_hardware(load_catalogue(calibration=None), "a100-80gb", "ib-hdr", options=opts)
    lay = Layout(tp=8, pp=1, dp=1, mbs=1, recompute="selective", sp=True)
    sel = evaluate_one(shape.cost(flash_attention=False), hw, opts, lay)
    none = evaluate_one(shape.cost(flash_attention=False), hw, opts,
                        replace(lay, recompute="none"))
    eq7 = 1 + s / (6 * h) + v / (12 * h * L)
    eq8 = 1 + s / (3 * h) + v / (12 * h * L)
    assert sel.hfu / sel.mfu == pytest.approx(eq8 / eq7, rel=1e-3)
    # The time pays 4 L s h a token (the attention core's forward again), not Eq. 8's 12.
    extra = sel.seconds("compute") - none.seconds("compute")
    attention_fwd = 4 * L * s * h * 8 * s / (8 * hw.accelerator.peak("bf16"))
    assert 0 < extra < 1.5 * attention_fwd / opts.compute_efficiency
