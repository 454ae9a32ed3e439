"""Mixture-of-experts, expert parallelism and context parallelism (issue #18 item 4)."""

from __future__ import annotations

import json

import pytest

from sextant.cli import main
from sextant.core.errors import UserError
from sextant.planner.catalogue import load_catalogue
from sextant.planner.estimate import (
    Layout,
    PlanOptions,
    check_layout,
    evaluate_one,
    resolve_hardware,
)
from sextant.planner.models import TransformerShape, preset
from sextant.planner.profiles import PROFILES, profile


def _fig(shape, layout, batch, **opts):
    o = PlanOptions(global_batch=batch, **opts)
    hw = resolve_hardware(load_catalogue(calibration=None), "h100-sxm", "ib-ndr", options=o)
    cost = shape.cost()
    check_layout(cost, layout, layout.devices, batch)
    return evaluate_one(cost, hw, o, layout)


def test_moe_counts_active_parameters_for_model_flops():
    mix = preset("mixtral-8x7b")
    cost = mix.cost()
    dense_equivalent = 6 * (mix.total_params() - mix.embedding_params())
    assert cost.model_flops_per_token < 0.4 * dense_equivalent
    padded = TransformerShape(**{**_fields(mix), "capacity_factor": 1.25}).cost()
    assert padded.padding_flops_per_token > 0
    assert padded.model_flops_per_token == pytest.approx(cost.model_flops_per_token)


def _fields(shape):
    return {k: getattr(shape, k) for k in shape.__dataclass_fields__}


def test_expert_parallelism_divides_expert_memory_and_adds_all_to_alls():
    mix = preset("mixtral-8x7b")
    one = _fig(mix, Layout(dp=8, zero=1, mbs=1, recompute="full"), 64)
    eight = _fig(mix, Layout(dp=8, zero=1, mbs=1, recompute="full", ep=8), 64)
    assert eight.params_per_device < 0.3 * one.params_per_device
    assert one.seconds("ep_comm") == 0 and eight.seconds("ep_comm") > 0


def test_context_parallelism_divides_activations_and_exchanges_kv():
    long = TransformerShape(**{**_fields(preset("llama3-8b")), "seq_len": 65536})
    base = _fig(long, Layout(dp=8, zero=3, mbs=1, recompute="full"), 8)
    cp = _fig(long, Layout(dp=2, cp=4, zero=3, mbs=1, recompute="full"), 2)
    assert cp.memory_of("activations") == pytest.approx(base.memory_of("activations") / 4, rel=0.05)
    assert cp.seconds("cp_comm") >= 0


@pytest.mark.parametrize(
    "shape, layout, words",
    [
        ("mixtral-8x7b", Layout(dp=6, ep=3, zero=1), "divide the number of experts"),
        ("mixtral-8x7b", Layout(dp=4, ep=8, zero=1), "divide dp x cp"),
        ("llama2-7b", Layout(dp=4, ep=2, zero=1), "needs an MoE model"),
        ("llama2-7b", Layout(dp=1, cp=3), "context parallelism"),
    ],
)
def test_impossible_layouts_are_one_line_errors(shape, layout, words):
    cost = preset(shape).cost()
    with pytest.raises(UserError, match=words):
        check_layout(cost, layout, layout.devices, 96)


def test_cli_with_ep_cp_and_a_transformer_workload(capsys, tmp_path):
    rc = main(["plan", "--model", "mixtral-8x7b", "--gpus", "64", "--ep", "8", "--no-curve",
               "--json"])
    out = capsys.readouterr()
    assert rc == 0, out.err
    assert "ep8" in json.loads(out.out)["layout"]["label"]
    assert main(["plan", "--model", "mixtral-8x7b", "--gpus", "64", "--ep", "3",
                 "--no-curve"]) == 2
    assert "experts" in capsys.readouterr().err
    assert main(["plan", "--model", "llama2-7b", "--gpus", "8", "--cp", "3", "--no-curve"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "cp" in err
    wl = tmp_path / "moe.toml"
    wl.write_text(
        'name = "tiny-moe"\nglobal_batch = 64\n[model]\nfamily = "transformer"\n'
        "n_layers = 4\nd_model = 512\nn_heads = 8\nn_kv_heads = 2\nd_ff = 1408\n"
        "vocab_size = 32000\nseq_len = 2048\ngated_mlp = true\nlayernorm = false\n"
        "tied_embeddings = true\ndropout = false\nn_experts = 8\ntop_k = 2\n"
        "capacity_factor = 1.25\n"
    )
    assert main(["plan", "--workload", str(wl), "--gpus", "8", "--no-curve", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["model"]["name"] == "tiny-moe"
    wl.write_text(wl.read_text() + "experts_per_token = 2\n")
    assert main(["plan", "--workload", str(wl), "--gpus", "8", "--no-curve"]) == 2
    assert "unknown key" in capsys.readouterr().err


def test_context_parallel_ranks_exchange_only_their_tensor_parallel_heads():
    # llama3-8b has 8 K/V heads: with tp = 2 each rank holds 4 of them and sends only those
    # round the cp ring, half of what a tp = 1 rank sends. With one device per node (every
    # ring step on the network) at 8K tokens the exchange outlasts the attention that hides
    # it, so the exposed time shows it. tp = 2 halves both the bytes and the attention; the
    # ring's per-step latency does not halve (0.024 s against 0.042 s). Counting every head's
    # K/V on every rank, tp = 2 exposed more than tp = 1 (0.060 s).
    long = TransformerShape(**{**_fields(preset("llama3-8b")), "seq_len": 8192})
    thin = {"devices_per_node": 1, "nics_per_node": 1}
    one = _fig(long, Layout(dp=1, tp=1, cp=4, zero=0, mbs=1, recompute="none"), 1, **thin)
    two = _fig(long, Layout(dp=1, tp=2, cp=4, zero=0, mbs=1, recompute="none"), 1, **thin)
    assert one.seconds("cp_comm") > 0
    assert two.seconds("cp_comm") < 0.65 * one.seconds("cp_comm")


def test_all_gather_context_parallelism_exposes_the_gather_that_a_ring_hides():
    # At 128K tokens the ring's K/V blocks travel while the attention of the block before
    # them computes (nothing exposed on NVLink and the network here); all-gather context
    # parallelism (Llama 3 §3.3.2) needs every block before the local queries' attention,
    # so only the local block's share of the attention (1 / cp) can hide the gather.
    long = TransformerShape(**{**_fields(preset("llama3-8b")), "seq_len": 131072})
    layout = Layout(dp=1, tp=1, cp=16, zero=0, mbs=1, recompute="none")
    ring = _fig(long, layout, 1)
    gather = _fig(long, layout, 1, stack=PROFILES["llama3-2024"])
    assert ring.seconds("cp_comm") == 0
    assert gather.seconds("cp_comm") > 0
    assert gather.step == pytest.approx(ring.step + gather.seconds("cp_comm"), rel=1e-9)
    with pytest.raises(UserError, match="cp_method must be one of ring, allgather"):
        profile("generic").with_overrides(cp_method="alltoall")


def test_cli_cp_method(capsys):
    args = ["plan", "--model", "llama3-8b", "--gpus", "16", "--cp", "16", "--no-curve", "--json"]
    assert main(args + ["--cp-method", "allgather"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["assumptions"]["cp_method"] == "allgather"
    with pytest.raises(SystemExit) as exit_:  # argparse's own choices check
        main(args + ["--cp-method", "ulysses"])
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--cp-method" in err
