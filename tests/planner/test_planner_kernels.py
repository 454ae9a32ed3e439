"""The kernels a stack runs: attention at its published rate, elementwise fused or eager, and a
chip's published GEMM rate as its default kernel efficiency."""

from __future__ import annotations

import json
from dataclasses import replace

import numpy as np
import pytest

from sextant.cli import main
from sextant.core.errors import UserError
from sextant.planner import efficiency
from sextant.planner.catalogue import load_catalogue
from sextant.planner.estimate import Layout, PlanOptions, evaluate_one, resolve_hardware
from sextant.planner.presets import PRESETS
from sextant.planner.profiles import profile


def test_a_stack_runs_the_first_of_its_kernels_the_chip_has_a_rate_for():
    rates = {"flash2": 0.3, "triton-2023": 0.2}
    assert efficiency.attention_kernel(rates, ("flash3", "flash2"), True) == ("flash2", 0.3)
    assert efficiency.attention_kernel(rates, ("triton-2023",), True) == ("triton-2023", 0.2)
    assert efficiency.attention_kernel(rates, ("flash3",), True) is None
    # A 2021-era stack stores the scores: no flash kernel at all.
    assert efficiency.attention_kernel(rates, ("flash2",), False) is None


def test_a_kernel_rate_times_the_causal_half_and_a_full_matrix_at_the_gemm_rate():
    peak, flops = 1e15, 4e12
    assert efficiency.attention_seconds(flops, peak, ("flash2", 0.4), 0.75) == pytest.approx(
        0.5 * flops / (0.4 * peak))
    assert efficiency.attention_seconds(flops, peak, None, 0.75) == pytest.approx(
        flops / (0.75 * peak))


def test_the_catalogue_gives_rates_per_chip_generation():
    cat = load_catalogue(calibration=None)
    hopper = cat.accelerator("h100-sxm").attention_rates
    assert cat.accelerator("h200").attention_rates == hopper
    assert cat.accelerator("h800").attention_rates == hopper
    ampere = cat.accelerator("a100-80gb").attention_rates
    assert cat.accelerator("a100-40gb").attention_rates == ampere
    # FlashAttention-2 uses none of Hopper's new instructions: a smaller share of its peak
    # than on A100, and below FlashAttention-3; Triton's kernel of 2023 below both.
    assert hopper["triton-2023"] < hopper["flash2"] < ampere["flash2"]
    assert hopper["flash2"] < hopper["flash3"] < 1.0
    assert "flash3" not in ampere
    for key in ("b200", "mi300x", "tpu-v5p", "cpu-local"):
        assert cat.accelerators[key].attention_rates == {}


@pytest.mark.parametrize(("text", "message"), [
    ("[attention.hopper]\nflash4 = 0.5\n", "unknown key attention.hopper.flash4"),
    ("[attention.hopper]\nflash2 = 1.5\n", r"fraction of peak in \(0, 1\]"),
    ("[attention.volta]\nflash2 = 0.3\n", "must cite a source"),
    ("[accelerators.h100-sxm]\narchitecture = 'volta'\n", r"has no \[attention.volta\] table"),
    ("[accelerators.tpu-v5p]\ngemm_efficiency = 0.9\n", "must cite a gemm_source"),
    ("[accelerators.tpu-v5e]\ngemm_efficiency = 1.5\n", r"fraction of peak in \(0, 1\]"),
])
def test_bad_kernel_figures_are_one_clear_error(tmp_path, text, message):
    path = tmp_path / "mine.toml"
    path.write_text(text)
    with pytest.raises(UserError, match=message):
        load_catalogue(override=path, calibration=None)


def test_a_profile_names_only_known_kernels():
    with pytest.raises(UserError, match="attention_kernels must be among"):
        profile("generic").with_overrides(attention_kernels=("flash9",))


def _figures(stack, accelerator="h100-sxm", seq=32768, **overrides):
    shape = replace(PRESETS["llama3-8b"], seq_len=seq, global_batch=8)
    opts = PlanOptions(global_batch=8, stack=profile(stack).with_overrides(**overrides))
    hw = resolve_hardware(load_catalogue(calibration=None), accelerator, None, options=opts)
    return evaluate_one(shape.cost(), hw, opts, Layout(dp=8, zero=3, mbs=1))


def test_the_attention_kernel_sets_a_long_sequence_apart_and_only_where_it_has_a_rate():
    # Megatron-Core runs cuDNN's fused attention on Hopper (flash3), torchtitan SDPA's flash
    # backend (flash2); with the elementwise kernels alike, only the attention differs.
    mcore = _figures("megatron-core", fused_elementwise=False)
    titan = _figures("torchtitan")
    assert mcore.compute.flops_bound < 0.8 * titan.compute.flops_bound
    # A100 has no flash3 rate: Megatron-Core falls back to FlashAttention-2 there.
    a_mcore = _figures("megatron-core", "a100-80gb", fused_elementwise=False)
    a_titan = _figures("torchtitan", "a100-80gb")
    assert a_mcore.compute.flops_bound == pytest.approx(a_titan.compute.flops_bound)


def test_eager_elementwise_kernels_move_more_bytes_than_fused_ones():
    eager = _figures("torchtitan", seq=2048)
    fused = _figures("torchtitan", seq=2048, fused_elementwise=True)
    assert eager.compute.flops_bound == pytest.approx(fused.compute.flops_bound)
    assert eager.compute.memory_ops > fused.compute.memory_ops
    assert eager.step > fused.step
    # Only the elementwise part scales, by EAGER / ELEMENTWISE passes.
    elementwise = np.asarray(efficiency.elementwise_bytes(1.0, 0.0, fused=False))
    assert float(elementwise) == pytest.approx(
        3.0 * efficiency.EAGER_ELEMENTWISE_PASSES)


def _plan(capsys, *flags):
    rc = main(["plan", "--model", "llama3-8b", "--gpus", "8", "--global-batch", "16",
               "--no-curve", *flags])
    out = capsys.readouterr()
    assert rc == 0, out.err
    return out.out


def test_the_plan_says_which_kernels_it_assumes(capsys):
    text = _plan(capsys, "--accelerator", "h100-sxm", "--stack", "torchtitan")
    assert "attention flash2 at 34% (its causal half)" in text
    assert "elementwise eager" in text
    doc = json.loads(_plan(capsys, "--accelerator", "h100-sxm", "--stack", "torchtitan",
                           "--elementwise", "fused", "--json"))
    assert doc["assumptions"]["attention_kernel"] == {"name": "flash2", "rate": 0.339}
    assert doc["assumptions"]["fused_elementwise"] is True
    assert "every score at the GEMM rate" in _plan(capsys, "--accelerator", "b200")


def test_a_chips_published_gemm_rate_is_its_default_kernel_efficiency(capsys):
    def efficiency_of(*flags):
        doc = json.loads(_plan(capsys, "--json", *flags))
        return doc["assumptions"]["kernel_efficiency"]

    assert efficiency_of("--accelerator", "tpu-v5e", "--gpus", "256", "--global-batch",
                         "256") == 0.923
    assert efficiency_of("--accelerator", "tpu-v5e", "--gpus", "256", "--global-batch", "256",
                         "--kernel-efficiency", "0.5") == 0.5
    assert efficiency_of("--accelerator", "h100-sxm") == efficiency.KERNEL_EFFICIENCY


def test_the_mfu_solve_scales_the_gemms_and_keeps_the_attention_at_its_rate(capsys):
    doc = json.loads(_plan(capsys, "--accelerator", "h100-sxm", "--json", "--mfu", "0.35"))
    assert doc["throughput"]["mfu"] == pytest.approx(0.35, rel=1e-3)


def test_a_measured_gpu_run_is_predicted_with_its_own_elementwise_kernels():
    # The planner's step beside a single-GPU run: a compiled run (torch.compile, jax.jit) fuses
    # its elementwise operators, an eager one runs them one kernel each.
    from pathlib import Path

    import sextant
    from sextant.planner.accelerator_run import predicted_step_s
    from sextant.workloads.spec import load_workload

    path = Path(sextant.__file__).parent / "workloads" / "gpt-small.toml"
    workload = load_workload(path).to_dict()
    compiled = predicted_step_s(workload, "NVIDIA H200", "bf16", compiled=True)
    eager = predicted_step_s(workload, "NVIDIA H200", "bf16", compiled=False)
    assert compiled is not None and eager is not None
    assert compiled < eager
    assert predicted_step_s(workload, "Some Unknown GPU", "bf16") is None
    # A TF32 run (torch's allow_tf32) is predicted at the TF32 peak, between fp32 and bf16.
    tf32 = predicted_step_s(workload, "NVIDIA H200", "tf32")
    fp32 = predicted_step_s(workload, "NVIDIA H200", "fp32")
    assert tf32 is not None and fp32 is not None
    assert compiled < tf32 < fp32
