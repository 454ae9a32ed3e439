"""The planner's fine-tuning mode (`plan --finetune lora|full`, issue 46 item 5): LoRA's
frozen base, adapter states, FLOPs and gradient traffic, the published figures it is checked
against, and the flags' refusals."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from sextant.cli import main
from sextant.planner.catalogue import load_catalogue
from sextant.planner.estimate import Layout, PlanOptions, evaluate_one, resolve_hardware
from sextant.planner.finetune import FineTune, adapted, adapter_params
from sextant.planner.models import preset
from sextant.planner.references import GROUPS, MEASURED_TOLERANCE, run_references, shares

LORA = FineTune(method="lora", rank=8, targets=("q", "v"))


def _hw(opts: PlanOptions):
    return resolve_hardware(load_catalogue(calibration=None), "h100-sxm", "ib-ndr", options=opts)


def _eval(ft: FineTune | None, layout: Layout, **kw):
    opts = PlanOptions(global_batch=64, finetune=ft, **kw)
    cost = preset("llama3-8b").cost()
    return cost, evaluate_one(cost, _hw(opts), opts, layout)


def test_adapter_count_is_rank_times_each_targets_in_plus_out():
    shape = preset("llama3-8b")
    h, kv = shape.d_model, shape.n_kv_heads * shape.hd
    q = shape.n_heads * shape.hd
    expected = shape.n_layers * 8 * ((h + q) + (h + kv))
    assert adapter_params(shape.cost(), LORA) == expected
    every = FineTune(method="lora", rank=8, targets=("q", "k", "v", "o", "gate", "up", "down"))
    mlp = 3 * (h + shape.d_ff)
    assert adapter_params(shape.cost(), every) == shape.n_layers * 8 * (
        (h + q) + 2 * (h + kv) + (q + h) + mlp)


def test_gpt_adapters_on_the_fused_attention_input():
    """GPT-2's c_attn is one h x 3h matrix: r x (h + 3h) per layer, as PEFT counts it."""
    shape = preset("gpt3-175b")  # a GPT: one fused q, k, v input projection per layer
    h = shape.d_model
    qkv = FineTune(method="lora", rank=8, targets=("qkv",))
    assert adapter_params(shape.cost(), qkv) == shape.n_layers * 8 * (h + 3 * h)


def test_frozen_base_holds_weights_only_and_adapters_hold_full_states():
    layout = Layout(dp=1, zero=0, mbs=1, recompute="full")
    cost, full = _eval(None, layout)
    _, lora = _eval(LORA, layout)
    lcost = adapted(cost, LORA, "bf16")
    base = LORA.base_bytes("bf16")
    assert base == 2.0
    trained = lcost.trainable_share
    params, grads = lora.memory_parts[0].bytes, lora.memory_parts[1].bytes
    # Per device: the base's bytes plus the adapters' share of each trained coefficient.
    full_p, full_g, full_o = (float(p.bytes) for p in full.memory_parts[:3])
    assert params == pytest.approx(cost.total_params * base + trained * full_p, rel=1e-9)
    assert grads == pytest.approx(trained * full_g, rel=1e-9)
    assert float(lora.memory_parts[2].bytes) == pytest.approx(trained * full_o, rel=1e-9)
    # Activations are training's: the input gradients still flow.
    def activations(ev) -> float:
        return next(float(p.bytes) for p in ev.memory_parts if p.name == "activations")

    assert activations(lora) == pytest.approx(activations(full), rel=1e-9)
    assert float(lora.memory) < float(full.memory)


def test_zero3_shards_the_frozen_base_and_offload_params_moves_it_to_the_host():
    _, whole = _eval(LORA, Layout(dp=8, zero=0, mbs=1, recompute="full"))
    _, sharded = _eval(LORA, Layout(dp=8, zero=3, mbs=1, recompute="full"))
    assert float(sharded.memory_parts[0].bytes) == pytest.approx(
        float(whole.memory_parts[0].bytes) / 8, rel=1e-3)
    _, moved = _eval(LORA, Layout(dp=8, zero=3, mbs=1, recompute="full", offload="params"))
    assert float(moved.memory_parts[0].bytes) == 0.0
    assert float(moved.host.offload) >= float(sharded.memory_parts[0].bytes)


def test_flops_drop_the_frozen_weight_gradients_and_add_the_adapters():
    cost = preset("llama3-8b").cost()
    lcost = adapted(cost, LORA, "bf16")
    six_n = cost.model_flops_per_token - cost.attention_flops_per_token
    assert lcost.model_flops_per_token == pytest.approx(
        six_n * 4 / 6 + cost.attention_flops_per_token + 6 * lcost.adapter_params)
    layout = Layout(dp=8, zero=1, mbs=1, recompute="full")
    _, full = _eval(None, layout)
    _, lora = _eval(LORA, layout)
    assert float(lora.step) < float(full.step)
    # With full recomputation a frozen GEMM runs forward, recomputed forward and input
    # gradient (3 of training's 4 passes): the compute falls to about 3/4, not below 0.6.
    ratio = float(lora.seconds("compute")) / float(full.seconds("compute"))
    assert 0.6 < ratio < 0.9


def test_data_parallel_reduces_the_adapter_gradients_only():
    layout = Layout(dp=8, zero=0, mbs=1, recompute="full")
    _, full = _eval(None, layout, overlap=0.0)
    _, lora = _eval(LORA, layout, overlap=0.0)
    assert float(lora.dp_comm) < 0.01 * float(full.dp_comm)
    # ZeRO-3 still gathers every frozen weight for each pass.
    z3 = Layout(dp=8, zero=3, mbs=1, recompute="full")
    _, full3 = _eval(None, z3, overlap=0.0)
    _, lora3 = _eval(LORA, z3, overlap=0.0)
    assert float(lora3.dp_comm) > 0.3 * float(full3.dp_comm)


def test_full_finetuning_plans_as_pretraining():
    layout = Layout(dp=8, zero=1, mbs=1, recompute="full")
    _, none = _eval(None, layout)
    _, full = _eval(FineTune(method="full"), layout)
    assert float(full.step) == float(none.step)
    assert float(full.memory) == float(none.memory)


@pytest.mark.parametrize("ref", ["peft-bloomz-7b1-lora-memory", "lora-gpt3-175b-memory",
                                 "lora-gpt3-175b-checkpoint"])
def test_lora_memory_within_ten_percent_of_the_published_figures(ref):
    (row,) = run_references(only=ref)
    assert row.group == "fine-tuning" and row.split == "held-out"
    assert abs(row.error) <= MEASURED_TOLERANCE, (row.planner, row.published)


def test_fine_tuning_rows_are_a_share_of_their_own():
    rows = run_references(only="lora-gpt3-175b-memory")
    counted = shares(rows)
    assert counted["held-out"] == (0, 0)
    assert counted[GROUPS[1]] == (1, 1)
    far = [replace(rows[0], error=0.5)]
    assert shares(far)[GROUPS[1]] == (0, 1)


def test_plan_json_carries_the_fine_tuning_section(capsys):
    rc = main(["plan", "--model", "llama3-8b", "--gpus", "8", "--accelerator", "h100-sxm",
               "--no-curve", "--json", "--finetune", "lora", "--lora-rank", "16",
               "--lora-targets", "q,k,v,o", "--base-dtype", "fp32"])
    plan = json.loads(capsys.readouterr().out)
    assert rc == 0
    ft = plan["finetune"]
    cost = adapted(preset("llama3-8b").cost(), FineTune(
        method="lora", rank=16, targets=("q", "k", "v", "o"), base_dtype="fp32"), "bf16")
    assert ft["trainable_params"] == cost.adapter_params
    assert ft["frozen_weights_bytes"] == cost.total_params * 4.0
    assert ft["adapter_checkpoint_bytes"] == cost.adapter_params * 4.0
    assert plan["model"]["model_flops_per_token"] == cost.model_flops_per_token


def test_workload_finetune_table_is_read(tmp_path, capsys):
    src = (tmp_path / "w.toml")
    src.write_text(
        'name = "tiny"\n[model]\nfamily = "llama"\nn_layers = 2\nd_model = 64\nn_heads = 4\n'
        'd_ff = 128\nvocab_size = 256\nseq_len = 32\n'
        '[finetune]\nmethod = "lora"\nrank = 4\ntargets = ["q", "v"]\n'
    )
    rc = main(["plan", "--workload", str(src), "--gpus", "1", "--accelerator", "h100-sxm",
               "--no-curve", "--json"])
    out = capsys.readouterr()
    assert rc == 0, out.err
    ft = json.loads(out.out)["finetune"]
    assert ft["method"] == "lora" and ft["rank"] == 4 and ft["targets"] == ["q", "v"]


BASE = ["plan", "--model", "llama2-7b", "--gpus", "8", "--no-curve"]


@pytest.mark.parametrize(
    "flags, words",
    [
        (["--finetune", "lora", "--lora-rank", "0"], "--lora-rank"),
        (["--finetune", "lora", "--lora-targets", "q,x"], "--lora-targets"),
        (["--finetune", "lora", "--lora-targets", "q,q"], "--lora-targets"),
        (["--lora-rank", "8"], "need --finetune lora"),
        (["--finetune", "full", "--base-dtype", "bf16"], "need --finetune lora"),
    ],
)
def test_bad_fine_tuning_flags_are_one_line_errors(capsys, flags, words):
    rc = main(BASE + flags)
    err = capsys.readouterr().err.strip()
    assert rc == 2 and words in err and "\n" not in err and "Traceback" not in err


def test_lora_on_a_missing_projection_or_an_mlp_is_refused(capsys):
    rc = main(["plan", "--model", "gpt3-175b", "--gpus", "8", "--no-curve", "--finetune",
               "lora", "--lora-targets", "gate"])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and "gate" in err and "\n" not in err
    rc = main(["plan", "--workload", "digits-mlp", "--gpus", "1", "--no-curve", "--finetune",
               "lora"])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and "LoRA needs a transformer" in err and "\n" not in err


def test_a_lora_runs_predicted_step_is_the_lora_plan():
    # The planner's step stored beside a LoRA run is the LoRA plan's, not full training's.
    from pathlib import Path

    import sextant
    from sextant.planner.accelerator_run import predicted_step_s
    from sextant.workloads.spec import load_workload

    path = Path(sextant.__file__).parent / "workloads" / "llama-tiny.toml"
    workload = load_workload(path).to_dict()
    full = predicted_step_s(workload, "NVIDIA H200", "fp32")
    lora = predicted_step_s({**workload, "finetune": {"method": "lora", "rank": 4,
                                                      "targets": ["q", "v"]}},
                            "NVIDIA H200", "fp32")
    assert full is not None and lora is not None
    assert lora < full
