"""Presets, workload files, parameter and FLOP counts."""

from __future__ import annotations

from pathlib import Path

import pytest

from sextant.core.errors import UserError
from sextant.planner.models import megatron_gpt, preset
from sextant.planner.presets import PRESETS
from sextant.planner.workload_shapes import load_workload_shape, shape_from_workload

ROOT = Path(__file__).resolve().parents[2]


# Parameter counts of the released checkpoints (sum of tensor sizes in the published weights).
@pytest.mark.parametrize(
    "name, params",
    [
        ("llama2-7b", 6_738_415_616),
        ("llama2-70b", 68_976_648_192),
        ("llama3-8b", 8_030_261_248),
        ("llama3-70b", 70_553_706_496),
        ("llama3-405b", 405_853_388_800),
    ],
)
def test_preset_parameter_counts_match_the_released_models(name, params):
    assert preset(name).total_params() == params


@pytest.mark.parametrize(
    "layers, hidden, heads, published_b",
    [
        (24, 2304, 24, 1.7),
        (40, 6144, 48, 18.4),
        (80, 12288, 96, 145.6),
        (128, 25600, 160, 1008.0),
    ],
)
def test_megatron_table_1_parameter_counts(layers, hidden, heads, published_b):
    # Narayanan et al. 2021, Table 1 (rounded to 0.1B).
    got = megatron_gpt(n_layers=layers, d_model=hidden, n_heads=heads).total_params() / 1e9
    assert got == pytest.approx(published_b, abs=0.05)


def test_palm_540b_parameter_count():
    # Chowdhery et al. 2022, Table 1: 540.35B.
    assert preset("palm-540b").total_params() / 1e9 == pytest.approx(540.35, abs=0.01)


def test_flops_per_token_is_6n_plus_attention():
    shape = preset("gpt3-175b")
    cost = shape.cost()
    matmul = (
        shape.n_layers * shape.layer_params()
        + shape.vocab_size * shape.d_model
        + shape.final_norm_params()
    )
    attention = 12 * shape.n_layers * shape.d_model * shape.seq_len  # PaLM appendix B
    assert cost.model_flops_per_token == 6 * matmul + attention


def test_aliases_and_unknown_presets():
    assert preset("llama-70b") is PRESETS["llama2-70b"]
    with pytest.raises(UserError, match="unknown model preset 'gpt-5'.*llama2-7b"):
        preset("gpt-5")


@pytest.mark.parametrize("name", ["gpt-tiny", "gpt-small", "digits-mlp"])
def test_bundled_workloads_match_the_runner_counts(name):
    init = pytest.importorskip("sextant.workloads.init")
    workload_mod = pytest.importorskip("sextant.workloads.spec")
    path = ROOT / "sextant" / "workloads" / f"{name}.toml"
    if not path.is_file():
        pytest.skip(f"{path} not present")
    shape = load_workload_shape(path)
    workload = workload_mod.load_workload(path)
    assert shape.total_params() == init.count_params(workload.model)
    tokens = workload.global_batch * workload.tokens_per_sample
    flops = init.flops_per_step(workload.model, workload.global_batch)
    assert shape.cost().model_flops_per_token * tokens == pytest.approx(flops, rel=1e-12)


def test_workload_errors_are_user_errors():
    with pytest.raises(UserError, match="model.family"):
        shape_from_workload({"name": "x", "model": {"family": "rnn"}})
    with pytest.raises(UserError, match="d_ff is required"):
        shape_from_workload(
            {
                "name": "x",
                "model": {
                    "family": "gpt",
                    "vocab_size": 256,
                    "seq_len": 8,
                    "d_model": 8,
                    "n_layers": 1,
                    "n_heads": 2,
                },
            }
        )
    with pytest.raises(UserError, match="not found"):
        load_workload_shape("/nonexistent/w.toml")
