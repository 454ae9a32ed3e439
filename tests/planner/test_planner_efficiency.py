"""The efficiency model: compute time depends on the shapes; --mfu is end-to-end MFU."""

from __future__ import annotations

import json

import pytest

from sextant.cli import main
from sextant.planner import efficiency
from sextant.planner.catalogue import load_catalogue
from sextant.planner.estimate import Layout, PlanOptions, evaluate_one, resolve_hardware
from sextant.planner.models import megatron_gpt
from sextant.planner.profiles import profile


def _compute_efficiency(hidden: int, heads: int, tp: int) -> float:
    """Model FLOPs of the compute phase over (compute time x peak): the kernels' MFU."""
    shape = megatron_gpt(n_layers=8, d_model=hidden, n_heads=heads, global_batch=8)
    opts = PlanOptions(global_batch=8, flash_attention=False)
    hw = resolve_hardware(load_catalogue(calibration=None), "a100-80gb", "ib-hdr", options=opts)
    cost = shape.cost(flash_attention=False)
    f = evaluate_one(cost, hw, opts, Layout(dp=1, tp=tp, mbs=1))
    flops = cost.model_flops_per_token * 8 * shape.seq_len / tp
    return flops / (f.seconds("compute") * hw.accelerator.peak("bf16"))


def test_wider_models_run_closer_to_peak():
    small, large = _compute_efficiency(2304, 24, 1), _compute_efficiency(12288, 96, 1)
    assert small < large < efficiency.KERNEL_EFFICIENCY


def test_tensor_parallelism_thins_the_gemms():
    assert _compute_efficiency(4096, 32, 8) < _compute_efficiency(4096, 32, 1)


def test_gemm_operand_bytes_split_by_tp():
    gemms = ((4.0, 8.0, True), (8.0, 4.0, False))
    # column: K=4, M=8/2=4; row: K=8/2=4, M=4 -> each t*4 + 16 + t*4 elements, 2 bytes.
    assert float(efficiency.gemm_operand_bytes(gemms, 10, 2)) == pytest.approx(2 * 2 * (96))


def _plan(capsys, *flags):
    rc = main(["plan", "--model", "llama2-13b", "--gpus", "64", "--accelerator", "a100-80gb",
               "--network", "ib-hdr", "--no-curve", "--json", *flags])
    out = capsys.readouterr()
    assert rc == 0, out.err
    return json.loads(out.out)


@pytest.mark.parametrize("target", [0.3, 0.45])
def test_mfu_is_end_to_end(capsys, target):
    doc = _plan(capsys, "--mfu", str(target))
    assert doc["throughput"]["mfu"] == pytest.approx(target, rel=1e-3)
    assert doc["assumptions"]["target_mfu"] == target


def test_kernel_efficiency_keeps_the_old_meaning(capsys):
    low = _plan(capsys, "--kernel-efficiency", "0.3")
    high = _plan(capsys, "--kernel-efficiency", "0.6")
    assert low["assumptions"]["kernel_efficiency"] == 0.3
    assert low["throughput"]["mfu"] < high["throughput"]["mfu"] < 0.6


def test_an_unreachable_mfu_is_answered_not_refused(capsys):
    # The best layout at the default kernel efficiency, the MFU it reaches, the most it could
    # reach with kernels at 100 % of peak, and what limits it.
    base = ["plan", "--model", "llama2-13b", "--gpus", "64", "--no-curve"]
    assert main([*base, "--mfu", "0.99"]) == 0
    assert "out of reach" in capsys.readouterr().out
    assert main([*base, "--mfu", "0.99", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    goal = doc["mfu_target"]
    assert goal["requested"] == 0.99 and goal["reachable"] is False
    assert goal["reached"] == pytest.approx(doc["throughput"]["mfu"])
    assert goal["reached"] < goal["ceiling"] < 0.99
    assert goal["limit"] and 0 < goal["limit_share"] < 1
    assert doc["assumptions"]["kernel_efficiency"] == pytest.approx(0.75)
    assert main([*base, "--json"]) == 0
    assert doc["layout"] == json.loads(capsys.readouterr().out)["layout"]
    # A reachable target is met on the layout, the record says so.
    assert main([*base, "--mfu", "0.3", "--json"]) == 0
    goal = json.loads(capsys.readouterr().out)["mfu_target"]
    assert goal["reachable"] is True and goal["reached"] == pytest.approx(0.3, rel=1e-3)


def test_both_mfu_flags_are_one_line_errors(capsys):
    base = ["plan", "--model", "llama2-13b", "--gpus", "64", "--no-curve"]
    assert main([*base, "--mfu", "0.4", "--kernel-efficiency", "0.5"]) == 2
    assert "not both" in capsys.readouterr().err
    assert main([*base, "--mfu", "nan"]) == 2


def test_the_pipeline_runs_at_its_slowest_stage():
    # BLOOM-like: a 250,880-token projection on the last of 12 stages of 70 layers.
    from sextant.planner.models import TransformerShape

    shape = TransformerShape(name="big-vocab", n_layers=72, d_model=4096, n_heads=32,
                             n_kv_heads=32, d_ff=16384, vocab_size=250880, seq_len=2048,
                             global_batch=96)
    cat = load_catalogue(calibration=None)
    lay = Layout(dp=1, tp=8, pp=12, mbs=1, recompute="full")
    steps = {}
    for balanced in (False, True):
        opts = PlanOptions(global_batch=96, stack=profile("generic").with_overrides(balanced_stages=balanced))
        hw = resolve_hardware(cat, "a100-80gb", "ib-hdr", options=opts)
        steps[balanced] = evaluate_one(shape.cost(), hw, opts, lay).compute.flops_bound
    # Even split: 6 layers + a projection of ~2 layers on the last stage; balanced: 4 + 2.
    assert steps[False] > 1.25 * steps[True]


def test_fp8_gemms_read_one_byte_operands_and_write_sixteen_bit_results():
    # One column-parallel (K=8, M=16) weight over tp 2, 4 tokens: reads 4 x 8 + 8 x 8 at 1
    # byte, writes 4 x 8 at 2.
    gemms = [(8, 16, True)]
    assert efficiency.gemm_operand_bytes(gemms, 4, 2, 1.0, output_bytes=2.0) == 4 * 8 + 64 + 64
    assert efficiency.gemm_operand_bytes(gemms, 4, 2) == 2 * (4 * 8 + 64 + 4 * 8)


def test_fp8_current_scaling_casts_inputs_and_output_gradients():
    # Transformer Engine's current scaling: an amax pass (2 bytes read), then the cast (2
    # read, 1 + 1 written: row-wise and transposed) of each GEMM input per forward and each
    # output gradient in the backward.
    assert efficiency.FP8_QUANTIZE_BYTES == 2 + 2 + 1 + 1
    gemms = [(8, 16, True), (16, 8, False)]  # column- then row-parallel, tp 2
    inputs, grads = 8 + 16 / 2, 16 / 2 + 8
    assert efficiency.fp8_quantize_bytes(gemms, 4, 2) == 6 * 4 * (inputs + grads)
    assert efficiency.fp8_quantize_bytes(gemms, 4, 2, forwards=2.0) == 6 * 4 * (2 * inputs + grads)


def test_fp8_adds_the_casts_to_the_memory_traffic_and_halves_the_operands():
    shape = megatron_gpt(n_layers=8, d_model=4096, n_heads=32, global_batch=8)
    cost = shape.cost()
    figures = {}
    for fp8 in (False, True):
        opts = PlanOptions(global_batch=8, fp8=fp8)
        hw = resolve_hardware(load_catalogue(calibration=None), "h100-sxm", None, options=opts)
        figures[fp8] = evaluate_one(cost, hw, opts, Layout(dp=8, mbs=1))
    tokens, bw = shape.seq_len, 3.35e12
    operands = {
        fp8: efficiency.gemm_operand_bytes(cost.gemms, tokens, 1, 1.0 if fp8 else 2.0,
                                           output_bytes=2.0)
        for fp8 in (False, True)
    }
    casts = efficiency.fp8_quantize_bytes(cost.gemms, tokens, 1)
    weights = 8 * shape.layer_params() * efficiency.FP8_QUANTIZE_BYTES
    expected = 8 * (3 * (operands[True] - operands[False]) + casts) + weights
    delta = figures[True].compute.memory_ops - figures[False].compute.memory_ops
    assert delta == pytest.approx(expected / bw, rel=1e-9)


def test_fp8_keeps_the_output_projection_and_the_attention_core_at_the_16_bit_rate():
    # Megatron-Core's output layer is not a Transformer Engine module and torchtitan skips
    # "output" when it converts to float8: only the layers' GEMMs run at the fp8 peak. The
    # attention core runs in its own kernel, its causal half at the kernel's published rate
    # of the 16-bit peak (FlashAttention-2 on Hopper for the generic stack).
    shape = megatron_gpt(n_layers=8, d_model=4096, n_heads=32, global_batch=8)
    cost = shape.cost()
    opts = PlanOptions(global_batch=8, fp8=True)
    hw = resolve_hardware(load_catalogue(calibration=None), "h100-sxm", None, options=opts)
    f = evaluate_one(cost, hw, opts, Layout(dp=8, mbs=1))
    acc = hw.accelerator
    head = 6.0 * shape.vocab_size * shape.d_model
    attention = cost.attention_flops_per_token + cost.flash_recompute_flops_per_token
    gemms = cost.model_flops_per_token - cost.attention_flops_per_token - head
    per_token = gemms / acc.peak("fp8") + head / acc.peak("bf16")
    at_rate = 0.5 * attention / (acc.attention_rates["flash2"] * acc.peak("bf16"))
    expected = 8 * shape.seq_len * (per_token / efficiency.KERNEL_EFFICIENCY + at_rate) / 8
    assert f.compute.flops_bound == pytest.approx(expected, rel=1e-9)
