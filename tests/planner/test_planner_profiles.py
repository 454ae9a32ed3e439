"""Stack profiles: what each stack does by default, one frozen record each (--stack)."""

from __future__ import annotations

import dataclasses
import json

import pytest

from sextant.cli import main
from sextant.core.errors import UserError
from sextant.planner.catalogue import load_catalogue
from sextant.planner.estimate import Layout, PlanOptions, evaluate_one, resolve_hardware
from sextant.planner.memory import model_state_bytes
from sextant.planner.models import preset
from sextant.planner.profiles import PROFILES, profile

CAT = load_catalogue(calibration=None)
QUIRKS = {"memory_model", "dp_schedule", "zero3_gather", "balanced_stages", "cp_method",
          "dp_bucket_bytes"}


def _figures(stack: str, layout: Layout, model: str = "llama3-8b", batch: int = 64):
    opts = PlanOptions(global_batch=batch, stack=profile(stack))
    hw = resolve_hardware(CAT, "h100-sxm", "ib-ndr", options=opts)
    return evaluate_one(preset(model).cost(), hw, opts, layout)


def test_plan_options_hold_no_stack_quirk():
    names = {f.name for f in dataclasses.fields(PlanOptions)}
    assert not names & QUIRKS
    assert "stack" in names


def test_the_bundled_stacks_and_their_dated_variants():
    assert {"generic", "megatron-core", "deepspeed", "torchtitan", "maxtext"} <= set(PROFILES)
    for p in PROFILES.values():
        assert dataclasses.is_dataclass(p) and p.release
        with pytest.raises(dataclasses.FrozenInstanceError):
            p.memory_model = "zero"  # type: ignore[misc]
        if p.release.startswith("dated"):
            assert "for" in p.release  # each dated variant says which figures need it


def test_megatron_core_keeps_fp32_main_gradients():
    # Megatron-Core's table: 18 bytes a parameter without the distributed optimizer, 6 + 12/d
    # with it (bf16 parameters, fp32 gradients); the ZeRO paper's accounting keeps 16.
    p = profile("megatron-core")
    assert p.memory_model == "megatron"
    assert model_state_bytes(1, 8, 0, memory_model=p.memory_model)["total"] == 18
    assert model_state_bytes(1, 8, 1, memory_model=p.memory_model)["total"] == 6 + 12 / 8
    assert model_state_bytes(1, 8, 0, memory_model=profile("generic").memory_model)[
        "total"
    ] == 16


def test_torchtitan_and_maxtext_keep_fp32_parameters():
    # FSDP2 with a bf16 MixedPrecisionPolicy and MaxText's float32 weight_dtype: the fp32
    # parameters are the master copy; more device memory than the ZeRO paper's accounting.
    lay = Layout(dp=8, zero=3, mbs=1, recompute="full")
    for stack in ("torchtitan", "maxtext"):
        assert profile(stack).memory_model == "torch"
        assert _figures(stack, lay, batch=8).memory > _figures("generic", lay, batch=8).memory


def test_deepspeed_counts_its_estimators_bytes():
    p = profile("deepspeed")
    # Stage 2: fp16 parameters and gradients whole (4 bytes) + 16 / N_d.
    assert model_state_bytes(1, 8, 2, memory_model=p.memory_model)["total"] == pytest.approx(
        4 + 16 / 8
    )


def test_the_dated_zero3_stack_gathers_per_tensor():
    lay = Layout(dp=64, zero=3, mbs=1, recompute="full")
    old = _figures("deepspeed-0.3", lay)
    new = _figures("deepspeed", lay)
    assert profile("deepspeed-0.3").zero3_gather == "tensor"
    assert old.dp_comm > new.dp_comm


def test_megatron_lm_2021_splits_stages_evenly():
    lay = Layout(dp=1, tp=8, pp=4, mbs=1, recompute="full")
    even = _figures("megatron-lm-2021", lay, batch=32)
    balanced = _figures("generic", lay, batch=32)
    assert even.step > balanced.step


def test_torchtitan_context_parallelism_gathers_k_and_v():
    lay = Layout(dp=1, cp=16, mbs=1, recompute="none")
    long = dataclasses.replace(preset("llama3-8b"), seq_len=131072)
    figs = {}
    for stack in ("megatron-core", "torchtitan"):
        opts = PlanOptions(global_batch=1, stack=profile(stack))
        hw = resolve_hardware(CAT, "h100-sxm", "ib-ndr", options=opts)
        figs[stack] = evaluate_one(long.cost(), hw, opts, lay)
    assert profile("torchtitan").cp_method == "allgather"
    assert figs["torchtitan"].seconds("cp_comm") > figs["megatron-core"].seconds("cp_comm")


def test_overrides_keep_the_rest_of_the_profile():
    p = profile("torchtitan").with_overrides(memory_model="zero", cp_method=None)
    assert p.memory_model == "zero" and p.dp_schedule == "zero"
    assert p.cp_method == "allgather" and "overridden" in p.name
    assert profile("torchtitan").with_overrides() is profile("torchtitan")
    with pytest.raises(UserError, match="memory_model must be one of"):
        profile("generic").with_overrides(memory_model="jax")


def test_cli_stack(capsys):
    args = ["plan", "--model", "llama3-8b", "--gpus", "8", "--dp", "8", "--zero", "1",
            "--no-curve", "--json"]
    assert main(args + ["--stack", "megatron-core"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["assumptions"]["stack"] == "megatron-core"
    assert doc["assumptions"]["memory_model"] == "megatron"
    assert main(args) == 0
    assert json.loads(capsys.readouterr().out)["assumptions"]["stack"] == "generic"
    assert main(args + ["--stack", "megatron-core", "--memory-model", "torch"]) == 0
    assert json.loads(capsys.readouterr().out)["assumptions"]["memory_model"] == "torch"
    assert main(args + ["--stack", "jax-2019"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert "unknown stack 'jax-2019'" in err and "megatron-core" in err


def test_host_memory_at_load_follows_how_the_stack_builds_the_model(capsys):
    # DeepSpeed's users build the whole model on every rank (fp32, 4 bytes a parameter)
    # before deepspeed.initialize; torchtitan and Megatron-Core build each rank's shard on
    # the device. With --host-memory-gb the larger of load and offload must fit a node.
    params = preset("llama3-70b").total_params()
    lay = Layout(dp=8, zero=3, mbs=1, recompute="full")
    ds = _figures("deepspeed", lay, model="llama3-70b", batch=8)
    tt = _figures("torchtitan", lay, model="llama3-70b", batch=8)
    assert ds.host.load_per_rank == pytest.approx(4 * params)
    # DeepSpeed's estimators ask 1.5 x what they keep on the host (additional_buffer_factor).
    assert ds.host.load_per_node == pytest.approx(1.5 * 8 * 4 * params)
    assert tt.host.load_per_node == 0
    base = ["plan", "--model", "llama3-70b", "--gpus", "64", "--no-curve",
            "--host-memory-gb", "1000"]
    assert main([*base, "--stack", "deepspeed"]) == 0
    assert "does not fit host memory" in capsys.readouterr().out
    assert main([*base, "--stack", "torchtitan"]) == 0
    assert "does not fit" not in capsys.readouterr().out
    assert main([*base, "--stack", "deepspeed", "--json"]) == 0
    mem = json.loads(capsys.readouterr().out)["memory"]
    assert mem["host_load_per_node"] == pytest.approx(1.5 * 8 * 4 * params)


@pytest.mark.parametrize("zero, offload, nodes", [(2, "optimizer", 1), (3, "params", 1),
                                                  (3, "params", 4), (3, "optimizer", 2)])
def test_deepspeed_memory_is_its_own_estimator(zero, offload, nodes):
    """The deepspeed profile against DeepSpeed's estimators themselves (its model built
    whole on every rank: zero_init off): the host memory a node asks for, buffer factor 1.5
    included, and the device's model states, ZeRO-3 keeping its largest layer whole on the
    device even with the parameters offloaded."""
    z12 = pytest.importorskip("deepspeed.runtime.zero.stage_1_and_2")
    z3 = pytest.importorskip("deepspeed.runtime.zero.stage3")
    devices = 8 * nodes
    f = _figures("deepspeed", Layout(dp=devices, zero=zero, mbs=1, offload=offload),
                 model="llama2-7b", batch=devices)
    cost = preset("llama2-7b").cost()
    total, largest = cost.total_params, cost.largest_module_params
    if zero == 3:
        cpu, gpu, _ = z3.estimate_zero3_model_states_mem_needs(
            total, largest, num_gpus_per_node=8, num_nodes=nodes, cpu_offload=True,
            cpu_offload_params=offload == "params", zero_init=False)
    else:
        cpu, gpu = z12.estimate_zero2_model_states_mem_needs(
            total, num_gpus_per_node=8, num_nodes=nodes, cpu_offload=True)
    states = sum(f.memory_of(k) for k in ("params", "grads", "optimizer", "zero3_buffers"))
    assert max(f.host.per_node, f.host.load_per_node) == pytest.approx(cpu, rel=1e-6)
    assert states == pytest.approx(gpu, rel=1e-6)


def test_the_search_keeps_to_what_the_stack_runs_and_refuses_a_pin_it_lacks():
    """A stack without ZeRO-1/2, optimizer offload or selective recomputation is never planned
    with them; pinning one is a one-line error that names what the stack runs."""
    from sextant.planner.search import enumerate_layouts

    fsdp_only = dataclasses.replace(profile("generic"), name="fsdp-only", zero_stages=(0, 3),
                                    offloads=("none", "params"),
                                    recomputes=("none", "full"), runs_source="a test")
    cost = preset("llama2-7b").cost()
    every = enumerate_layouts(cost, 64, 64)
    kept = enumerate_layouts(cost, 64, 64, stack=fsdp_only)
    assert set(every["zero"].tolist()) == {0, 1, 2, 3}
    assert set(kept["zero"].tolist()) == {0, 3}
    assert set(kept["off"].tolist()) <= {0, 2} and set(kept["rc"].tolist()) <= {0, 2}
    assert 0 < len(kept["dp"]) < len(every["dp"])
    with pytest.raises(UserError, match=r"fsdp-only has no ZeRO stage 1: it runs 0, 3 \("):
        enumerate_layouts(cost, 64, 64, fixed={"zero": 1}, stack=fsdp_only)
    with pytest.raises(UserError, match="recomputes must be a non-empty list"):
        dataclasses.replace(fsdp_only, recomputes=("some",))
