"""ZeRO-3 collectives per layer or per parameter tensor (issue #18: ZeRO-3 over ~1,500 GPUs)."""

from __future__ import annotations

import json

import pytest

from sextant.cli import main
from sextant.core.errors import UserError
from sextant.planner import comms
from sextant.planner.catalogue import load_catalogue
from sextant.planner.estimate import (
    Layout,
    PlanOptions,
    evaluate_one,
    resolve_hardware,
)
from sextant.planner.terms import gathered_again
from sextant.planner.models import MLPShape, megatron_gpt, preset
from sextant.planner.profiles import profile


def _gpt175():
    """Narayanan et al.'s 174.6B GPT, the Table 2 rows' model."""
    return megatron_gpt(n_layers=96, d_model=12288, n_heads=96, global_batch=1536)


def _gpt175_zero3(devices: int, mbs: int, gather: str) -> dict:
    shape = _gpt175()
    opts = PlanOptions(
        global_batch=1536, flash_attention=False, overlap=0.0,
        stack=profile("generic").with_overrides(zero3_gather=gather),
    )
    hw = resolve_hardware(load_catalogue(calibration=None), "a100-80gb", "ib-hdr", options=opts)
    layout = Layout(dp=devices, zero=3, mbs=mbs, recompute="full")
    return evaluate_one(shape.cost(flash_attention=False), hw, opts, layout)


def test_layer_tensors_follow_the_megatron_layout():
    # GPT: fused QKV, attention output, MLP in, MLP out, each with a bias, and two
    # LayerNorms with scale and bias. Llama: no biases, RMSNorm (scale only), gate and up
    # fused. An MLP workload: a weight and a bias per linear layer.
    gpt = preset("gpt3-175b").cost().layer_tensors
    h = 12288
    assert sorted(gpt) == sorted(
        [3 * h * h, h * h, 4 * h * h, 4 * h * h, 3 * h, h, 4 * h, h, h, h, h, h]
    )
    assert sum(gpt) == preset("gpt3-175b").layer_params()
    assert len(preset("llama3-8b").cost().layer_tensors) == 6
    assert sum(preset("llama3-8b").cost().layer_tensors) == preset("llama3-8b").layer_params()
    assert len(preset("mixtral-8x7b").cost().layer_tensors) == 2 + 8 * 2 + 1 + 2
    mlp = MLPShape(name="m", input_dim=8, hidden=(16, 16), num_classes=4)
    assert mlp.cost().layer_tensors == (128, 16, 256, 16, 64, 4)


@pytest.mark.parametrize("devices, mbs", [(384, 4), (1536, 1)])
def test_gathering_every_tensor_pays_the_ring_latency_per_tensor(devices, mbs, monkeypatch):
    # One micro-batch: 2 all-gathers of each of a layer's 4 weight matrices (its 8 biases
    # and norms, under 1e5 elements, stay gathered) and 1 reduce-scatter of each of its 12
    # gradients. Per layer and step that is 2 x 4 + 12 - 3 = 17 more collectives over every
    # rank than gathering per layer, each paying NCCL's ring latency over all of them
    # ((n - nodes) NVLink steps + (nodes - 1) network steps).
    monkeypatch.setattr("sextant.planner.terms.HOST_OP_SECONDS", 0.0)
    layer = _gpt175_zero3(devices, mbs, "layer")
    tensor = _gpt175_zero3(devices, mbs, "tensor")
    cat = load_catalogue(calibration=None)
    nvlink, ib = cat.link("nvlink3"), cat.link("ib-hdr")
    ring = float(comms.ring_latency(8, devices // 8, nvlink.latency, ib.latency))
    assert tensor.dp_comm - layer.dp_comm >= 96 * 17 * ring
    assert tensor.seconds("compute") == layer.seconds("compute")
    # No overlap (--overlap 0): the whole of it is on the step.
    assert tensor.step - layer.step == pytest.approx(
        tensor.dp_comm - layer.dp_comm, rel=1e-9
    )


def test_the_per_tensor_cost_grows_with_the_ranks():
    # The same bytes per rank at any data-parallel degree; the latency grows with the ring.
    extra_384 = (_gpt175_zero3(384, 4, "tensor").dp_comm
                 - _gpt175_zero3(384, 4, "layer").dp_comm)
    extra_1536 = _gpt175_zero3(1536, 1, "tensor").dp_comm - _gpt175_zero3(
        1536, 1, "layer"
    ).dp_comm
    assert extra_1536 > 2.5 * extra_384


def test_zero3_gather_is_validated():
    with pytest.raises(UserError, match="zero3_gather must be one of layer, tensor"):
        profile("generic").with_overrides(zero3_gather="param")


def test_cli_zero3_gather(capsys):
    args = ["plan", "--model", "llama3-8b", "--gpus", "64", "--dp", "64", "--tp", "1", "--pp", "1",
            "--zero", "3", "--no-curve", "--json"]
    assert main(args) == 0
    layer = json.loads(capsys.readouterr().out)
    assert main(args + ["--zero3-gather", "tensor"]) == 0
    tensor = json.loads(capsys.readouterr().out)
    assert layer["assumptions"]["zero3_gather"] == "layer"
    assert tensor["assumptions"]["zero3_gather"] == "tensor"
    assert layer["layout"] == tensor["layout"]
    assert tensor["time"]["dp_comm_total"] > layer["time"]["dp_comm_total"]
    with pytest.raises(SystemExit) as exit_:  # argparse's own choices check
        main(args + ["--zero3-gather", "module"])
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--zero3-gather" in err


@pytest.mark.parametrize("devices, mbs", [(384, 4), (1536, 1)])
def test_per_tensor_collectives_pay_the_host_work_of_their_per_rank_lists(devices, mbs, monkeypatch):
    # Per rank and call at 2 us: each all-gather of a weight matrix 2 calls (a narrow(), then
    # ProcessGroupNCCL's copy of the flat result into that rank's tensor), each reduce-scatter
    # of a gradient 3 (view().narrow(), then the copy into the flat input), and once per
    # step the persistent biases and norms: 2 calls for the gather, 4 per tensor for the
    # copies back. One micro-batch: 2 x 4 gathers, 3 more for the recomputed forward (the
    # MLP-out weight stays gathered for its backward) and 12 reduce-scatters per layer.
    with_host = _gpt175_zero3(devices, mbs, "tensor")
    monkeypatch.setattr("sextant.planner.terms.HOST_OP_SECONDS", 0.0)
    without = _gpt175_zero3(devices, mbs, "tensor")
    calls = 96 * ((2 * 4 + 3) * 2 + 12 * 3) + 2 + 96 * 8 * 4
    expected = calls * devices * 2e-6
    assert with_host.dp_comm - without.dp_comm == pytest.approx(expected, rel=1e-9)
    # Gathered per layer, nothing of the kind is paid.
    assert _gpt175_zero3(devices, mbs, "layer").dp_comm < without.dp_comm


def test_a_layout_without_zero3_says_the_gather_mode_changes_nothing(capsys):
    args = ["plan", "--model", "llama3-8b", "--gpus", "64", "--dp", "64", "--zero", "1",
            "--zero3-gather", "tensor", "--no-curve", "--json"]
    assert main(args) == 0
    warnings = json.loads(capsys.readouterr().out)["warnings"]
    assert any("--zero3-gather tensor changes nothing here" in w for w in warnings)


def _zero3_dp_comm(shape, recompute: str, gather: str, devices: int = 384) -> float:
    opts = PlanOptions(global_batch=devices, flash_attention=False, overlap=0.0,
                       stack=profile("generic").with_overrides(zero3_gather=gather))
    hw = resolve_hardware(load_catalogue(calibration=None), "a100-80gb", "ib-hdr", options=opts)
    layout = Layout(dp=devices, zero=3, mbs=1, recompute=recompute)
    return evaluate_one(shape.cost(flash_attention=False), hw, opts, layout).dp_comm


def test_a_recomputed_forward_gathers_again_what_it_will_not_reuse_soon():
    # DeepSpeed v0.3.13: the recomputed forward's module hooks gather each weight and release
    # it unless fewer than stage3_max_reuse_distance (1e9) elements are used before its
    # backward: 2 x the later weights' elements. At h = 12288 the QKV, attention-output and
    # MLP-in weights (distances 2.7e9, 2.4e9, 1.2e9) go again and the MLP-out weight
    # (distance 0) stays; at h = 4096 every distance is under 1e9 (at most 3.0e8).
    h = 12288
    assert list(gathered_again([3 * h * h, h * h, 4 * h * h, 4 * h * h])) == [
        True, True, True, False
    ]
    assert not gathered_again([3 * 4096**2, 4096**2, 4 * 4096**2, 4 * 4096**2]).any()
    assert list(gathered_again([6e8, 6e8], max_distance=1.2e9)) == [True, False]
    wide, narrow = _gpt175(), megatron_gpt(n_layers=32, d_model=4096, n_heads=32)
    assert _zero3_dp_comm(narrow, "full", "tensor") == _zero3_dp_comm(narrow, "none", "tensor")
    assert _zero3_dp_comm(wide, "full", "tensor") > _zero3_dp_comm(wide, "none", "tensor")
    # Gathered per layer (FSDP2: the pre-backward hook unshards the block before its
    # recomputation, whose forward hooks leave it alone), recomputation adds no collective.
    assert _zero3_dp_comm(wide, "full", "layer") == _zero3_dp_comm(wide, "none", "layer")
