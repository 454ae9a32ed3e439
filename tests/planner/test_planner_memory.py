"""Memory model: ZeRO model states and Korthikanti activation formulas, against the papers."""

from __future__ import annotations

import importlib.util

import numpy as np
import pytest

from sextant.core.errors import UserError
from sextant.planner.catalogue import load_catalogue
from sextant.planner.estimate import Layout, PlanOptions, evaluate_one, resolve_hardware
from sextant.planner.memory import (
    activation_bytes_per_layer,
    loss_bytes_factor,
    model_state_bytes,
    pipeline_inflight,
    state_bytes,
    transient_param_bytes,
)
from sextant.planner.models import TransformerShape, preset
from sextant.planner.profiles import profile

GB = 1e9


def test_mixed_precision_adam_is_16_bytes_per_parameter():
    assert sum(state_bytes("bf16", "adam")) == 16
    assert sum(state_bytes("fp16", "adam")) == 16
    assert sum(state_bytes("fp32", "adam")) == 16  # 4 + 4 + 8


def test_70b_model_states_before_sharding():
    states = model_state_bytes(70e9)
    assert float(states["total"]) == pytest.approx(1120 * GB, rel=1e-12)
    assert float(states["params"]) == pytest.approx(140 * GB, rel=1e-12)


@pytest.mark.parametrize("stage, published_gb", [(0, 120.0), (1, 31.4), (2, 16.6), (3, 1.9)])
def test_zero_paper_figure_1(stage, published_gb):
    # Rajbhandari et al. 2020, Figure 1: 7.5B parameters, N_d = 64, K = 12.
    got = float(model_state_bytes(7.5e9, 64, stage)["total"]) / GB
    assert got == pytest.approx(published_gb, abs=0.05)  # the paper prints one decimal


def test_offload_moves_optimizer_and_gradients_then_parameters_to_host():
    # ZeRO-Offload (Ren et al. 2021 §4) offloads the gradients, the optimizer state and the
    # optimizer step: the host keeps the optimizer shard plus an fp32 gradient partition.
    on = model_state_bytes(1e9, 8, 3, offload=0)
    opt = model_state_bytes(1e9, 8, 3, offload=1)
    params = model_state_bytes(1e9, 8, 3, offload=2)
    assert float(opt["optimizer"]) == 0 and float(opt["grads"]) == 0
    assert float(opt["host"]) == pytest.approx(float(on["optimizer"]) + 4 * 1e9 / 8)
    assert float(params["params"]) == 0
    assert float(params["host"]) == pytest.approx(float(opt["host"] + on["params"]))


@pytest.mark.parametrize(
    "precision, plain, dist_fixed, dist_sharded",
    [("fp16", 20, 4, 16), ("bf16", 18, 6, 12), ("fp32", 16, 8, 8)],
)
def test_megatron_distributed_optimizer_table(precision, plain, dist_fixed, dist_sharded):
    # Megatron-Core developer guide, "Distributed Optimizer": bytes per parameter.
    d = 64
    no = float(model_state_bytes(1, 1, 0, precision=precision, memory_model="megatron")["total"])
    dist = float(model_state_bytes(1, d, 1, precision=precision, memory_model="megatron")["total"])
    assert no == pytest.approx(plain)
    assert dist == pytest.approx(dist_fixed + dist_sharded / d)


@pytest.mark.parametrize("n", [1, 8, 64])
def test_deepspeed_estimators(n):
    # DeepSpeed estimate_zero2_model_states_mem_needs: 4 P + 16 P / n per GPU (2 P offloaded);
    # estimate_zero3_model_states_mem_needs: 18 P / n + 4 x largest layer (offload: 2 P / n).
    p = 1e9
    z2 = model_state_bytes(p, n, 2, memory_model="deepspeed")
    assert float(z2["total"]) == pytest.approx(4 * p + 16 * p / n)
    z2o = model_state_bytes(p, n, 2, offload=1, memory_model="deepspeed")
    assert float(z2o["total"]) == pytest.approx(2 * p)
    assert float(z2o["host"]) * n == pytest.approx(16 * p)
    z3 = model_state_bytes(p, n, 3, memory_model="deepspeed")
    layer = transient_param_bytes(5e8, 10, 3, memory_model="deepspeed", largest_module_params=1e8)
    assert float(z3["total"]) == pytest.approx(18 * p / n)
    assert float(layer) == pytest.approx(4 * 1e8)
    z3o = model_state_bytes(p, n, 3, offload=1, memory_model="deepspeed")
    assert float(z3o["total"]) == pytest.approx(2 * p / n)


def test_torch_keeps_fp32_parameters_and_gradients():
    t = model_state_bytes(1, 1, 0, precision="bf16", memory_model="torch")
    assert (float(t["params"]), float(t["grads"]), float(t["optimizer"])) == (4, 4, 8)
    # FSDP2 shards parameters at rest in SHARD_GRAD_OP (zero 2) as well.
    z2 = model_state_bytes(1, 4, 2, precision="bf16", memory_model="torch")
    assert float(z2["total"]) == pytest.approx(16 / 4)


def test_unknown_memory_model_is_a_user_error():
    with pytest.raises(UserError, match="memory model"):
        state_bytes("bf16", "adam", "jax")


def test_unknown_precision_is_a_user_error():
    with pytest.raises(UserError, match="precision"):
        state_bytes("int3")


# Korthikanti et al. 2022, Table 2, for a GPT layer (dropout, stored attention scores).
S, B, H, A, T = 2048, 1, 12288, 96, 8
GPT = TransformerShape(
    name="gpt",
    n_layers=96,
    d_model=H,
    n_heads=A,
    n_kv_heads=A,
    d_ff=4 * H,
    vocab_size=51200,
    seq_len=S,
    biases=True,
    learned_positions=True,
    tied_embeddings=True,
    dropout=True,
)
COST = GPT.cost(flash_attention=False)
SBH = S * B * H


@pytest.mark.parametrize(
    "tp, sp, rc, expected",
    [
        (1, 0, 0, SBH * (34 + 5 * A * S / H)),  # no parallelism
        (T, 0, 0, SBH * (10 + 24 / T + 5 * A * S / (H * T))),  # tensor parallel
        (T, 1, 0, SBH * (34 / T + 5 * A * S / (H * T))),  # + sequence parallel
        (T, 0, 1, SBH * (10 + 24 / T)),  # + selective recomputation
        (T, 1, 1, SBH * (34 / T)),  # + both
        (1, 0, 2, 2 * SBH),  # full recomputation
    ],
)
def test_korthikanti_table_2(tp, sp, rc, expected):
    got = float(activation_bytes_per_layer(COST, S * B, tp, sp, rc))
    assert got == pytest.approx(expected, rel=1e-12)


def test_flash_attention_drops_the_score_term():
    flash = GPT.cost(flash_attention=True)
    got = float(activation_bytes_per_layer(flash, S, 1, 0, 0))
    assert got == pytest.approx(SBH * 34, rel=1e-12)


@pytest.mark.parametrize(
    "tp, sp, rc, expected",
    [
        # The linear inputs (QKV 2h, projection 2h, MLP in 2h, MLP out 8h) at 1 byte: 34 - 7.
        (1, 0, 0, SBH * 27),
        (T, 0, 1, SBH * (10 - 2 + (24 - 5) / T)),  # selective: 2h outside, 5h inside TP
        (T, 1, 1, SBH * (27 / T)),
        (1, 0, 2, 2 * SBH),  # full recomputation keeps the 16-bit layer input only
    ],
)
def test_fp8_keeps_the_linear_inputs_in_one_byte(tp, sp, rc, expected):
    flash = GPT.cost(flash_attention=True)
    got = float(activation_bytes_per_layer(flash, S * B, tp, sp, rc, fp8_inputs=True))
    assert got == pytest.approx(expected, rel=1e-12)
    op = activation_bytes_per_layer(flash, S * B, tp, sp, 3, fp8_inputs=True)
    assert float(op) == float(activation_bytes_per_layer(flash, S * B, tp, sp, 3))


def test_pipeline_first_stage_holds_min_p_m_microbatches():
    assert float(pipeline_inflight(4, 100)) == 4
    assert float(pipeline_inflight(8, 3)) == 3
    # Interleaved schedule: (1 + (p - 1) / (p v)) times more (Korthikanti §4.2.3).
    assert float(pipeline_inflight(4, 100, 2)) == pytest.approx(4 * (1 + 3 / 8))
    assert np.all(pipeline_inflight(np.array([1, 2]), np.array([5, 5])) == [1, 2])


def _llama3_8b_on_8(memory_model: str, zero: int, part: str) -> float:
    """One figure of Llama 3 8B on 8 H100 at dp 8, micro-batch 1, full recomputation."""
    opts = PlanOptions(global_batch=8, stack=profile("generic").with_overrides(memory_model=memory_model))
    hw = resolve_hardware(load_catalogue(calibration=None), "h100-sxm", None, options=opts)
    lay = Layout(dp=8, zero=zero, mbs=1, recompute="full")
    return float(evaluate_one(preset("llama3-8b").cost(), hw, opts, lay).memory_of(part))


def test_torch_loss_holds_the_logits_three_times():
    """torchtitan's loss, cross_entropy(pred.float()) then backward, peaks in the
    log-softmax's backward: its saved output, nll_loss's dense gradient and the result, all
    fp32: 12 bytes per vocabulary entry and token, 3 x Korthikanti's fp32 logits (4 s b V);
    the other memory models keep 4."""
    assert loss_bytes_factor("torch", "bf16") == loss_bytes_factor("torch", "fp32") == 3.0
    assert loss_bytes_factor("megatron", "bf16") == loss_bytes_factor("zero", "fp32") == 1.0
    shape = preset("llama3-8b")
    acts = {model: _llama3_8b_on_8(model, 3, "activations") for model in ("zero", "torch")}
    logits = shape.seq_len * 4 * shape.vocab_size
    assert acts["torch"] - acts["zero"] == pytest.approx(2.0 * logits, rel=1e-9)


def test_torch_loss_under_tensor_parallelism_holds_its_shard_four_times():
    """With tp > 1 torchtitan's loss runs in PyTorch's loss_parallel(): 16 bytes per entry of
    the rank's vocabulary shard (4 x 4 s b V / t); with tp = 1 the plain loss's 12."""
    assert loss_bytes_factor("torch", "bf16", 2) == loss_bytes_factor("torch", "fp32", 8) == 4.0
    assert loss_bytes_factor("torch", "bf16", 1) == 3.0
    assert loss_bytes_factor("megatron", "bf16", 8) == 1.0
    assert list(loss_bytes_factor("torch", "bf16", np.array([1.0, 2.0, 8.0]))) == [3.0, 4.0, 4.0]
    shape = preset("llama3-8b")
    opts = {
        m: PlanOptions(global_batch=4, stack=profile("generic").with_overrides(memory_model=m)) for m in ("zero", "torch")
    }
    acts = {}
    for model, opt in opts.items():
        hw = resolve_hardware(load_catalogue(calibration=None), "h100-sxm", None, options=opt)
        lay = Layout(dp=4, tp=2, zero=3, mbs=1, recompute="full")
        acts[model] = evaluate_one(shape.cost(), hw, opt, lay).memory_of("activations")
    shard = shape.seq_len * 4 * shape.vocab_size / 2
    assert acts["torch"] - acts["zero"] == pytest.approx(3.0 * shard, rel=1e-9)


@pytest.mark.torch
@pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="needs PyTorch")
def test_pytorch_loss_parallel_holds_what_the_factor_says():
    # The real loss_parallel() on a one-rank gloo group, beside the plain loss, both from the
    # profiler's memory timeline (sextant/measure/loss_memory.py): the difference is the factor's.
    probe = _loss_probe()
    plain = probe.measure_timeline(False, tokens=512, vocab=4096)
    parallel = probe.measure_timeline(True, tokens=512, vocab=4096)
    step = 4.0 * (loss_bytes_factor("torch", "bf16", 2) - loss_bytes_factor("torch", "bf16", 1))
    assert parallel - plain == pytest.approx(step, abs=0.1)
    assert plain == pytest.approx(4.0 * loss_bytes_factor("torch", "bf16"), abs=0.5)


@pytest.mark.torch
@pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="needs PyTorch")
@pytest.mark.parametrize("precision, forward", [("bf16", 10.0), ("fp32", 8.0)])
def test_pytorch_holds_what_the_torch_loss_factor_says(precision, forward):
    # The real PyTorch loss, forward and backward, every tensor of at least a quarter of the
    # logits followed from allocation to release (sextant/measure/loss_memory.py).
    fwd, peak, at = _loss_probe().measure(precision, tokens=512, vocab=4096)
    assert fwd == pytest.approx(forward)
    assert peak == pytest.approx(4.0 * loss_bytes_factor("torch", precision))
    assert "log_softmax_backward" in at


def _loss_probe():
    from sextant.measure import loss_memory

    return loss_memory


def test_fsdp2_root_unit_is_whole_at_the_backward_start():
    """--memory-model torch, ZeRO-3: besides two gathered blocks, FSDP2's root unit
    (embedding, final norm, output projection: torchtitan's root fully_shard) is whole in
    bf16; other memory models and ZeRO < 3 have no such term."""
    cost = preset("llama3-8b").cost()
    gathered = {
        (model, zero): _llama3_8b_on_8(model, zero, "zero3_buffers")
        for model, zero in (("torch", 3), ("zero", 3), ("torch", 1))
    }
    root = 2 * (cost.embed_params + cost.head_params + cost.other_params)
    assert gathered["torch", 3] - gathered["zero", 3] == pytest.approx(root, rel=1e-9)
    assert gathered["torch", 1] == 0.0


def test_ddp_buckets_need_a_second_replica_and_are_shown_in_the_split():
    """torch's DDP copies every gradient into its buckets (gradient_as_bucket_view=False);
    with one data-parallel replica nothing wraps the model in DDP, so no buckets. The split
    names them, and its parts sum to the device's memory."""
    opts = PlanOptions(global_batch=8, stack=profile("torchtitan"))
    hw = resolve_hardware(load_catalogue(calibration=None), "h100-sxm", None, options=opts)
    cost = preset("llama3-8b").cost()
    for dp, tp, expected in ((8, 1, 4.0 * cost.total_params / 1), (1, 8, 0.0)):
        f = evaluate_one(cost, hw, opts, Layout(dp=dp, tp=tp, zero=0, mbs=1, recompute="full"))
        assert f.memory_of("ddp_buckets") == pytest.approx(expected, rel=0.02)
        assert sum(p.bytes for p in f.memory_parts) == pytest.approx(f.memory, rel=1e-9)


def test_tf32_keeps_fp32_values_and_runs_the_matmuls_at_the_tf32_peak():
    """TF32 rounds only the tensor cores' inputs: every byte is fp32's, the GEMMs run at the
    accelerator's TF32 peak (A100: 156 TFLOP/s against fp32's 19.5)."""
    cost = preset("llama3-8b").cost()
    lay = Layout(dp=8, zero=1, mbs=1, recompute="full")
    figures = {}
    for precision in ("fp32", "tf32"):
        opts = PlanOptions(global_batch=8, precision=precision)
        hw = resolve_hardware(load_catalogue(calibration=None), "a100-80gb", None, options=opts)
        figures[precision] = evaluate_one(cost, hw, opts, lay)
    assert figures["tf32"].memory == pytest.approx(figures["fp32"].memory, rel=1e-12)
    ratio = figures["fp32"].seconds("compute") / figures["tf32"].seconds("compute")
    assert 156.0 / 19.5 * 0.5 < ratio <= 156.0 / 19.5 * 1.0001
