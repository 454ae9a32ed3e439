"""The Llama family: its shapes are validated in one line, its rotary embedding is a real
rotation, and torch, JAX and TensorFlow train it identically (untied and tied embeddings)."""

from __future__ import annotations

import dataclasses
import importlib.util
import tempfile
from pathlib import Path

import numpy as np
import pytest

from sextant.core.errors import UserError
from sextant.workloads.init import count_params, init_params, matmul_params, param_shapes, rope_tables
from sextant.runner import execute
from sextant.strategy import FRAMEWORKS, Strategy
from sextant.workloads.spec import LlamaSpec, workload_from_dict
from sextant.sources import resolve_workload
from tests.helpers import needs_torch, same_training, short

HAS = {m: importlib.util.find_spec(m) is not None for m in FRAMEWORKS}


@pytest.mark.parametrize("change, message", [
    ({"n_heads": 3}, "model.n_heads must divide model.d_model. Received: d_model=64, n_heads=3"),
    ({"n_kv_heads": 3}, "model.n_kv_heads must divide model.n_heads"),
    ({"n_heads": 64, "n_kv_heads": 1}, "(the head width) must be even: rotary"),
    ({"tie_embeddings": 1}, "model.tie_embeddings must be true or false"),
    ({"rope_theta": 0}, "model.rope_theta must be a number > 0"),
    ({"n_experts": 4}, "unknown key model.n_experts"),
])
def test_inconsistent_shapes_are_one_line_errors(change: dict, message: str) -> None:
    raw = {"name": "x", "model": {"family": "llama", "n_heads": 4, "n_kv_heads": 2, **change},
           "data": {"dataset": "python-reference"}}
    with pytest.raises(UserError) as info:
        workload_from_dict(raw)
    assert message in str(info.value) and "\n" not in str(info.value)


def test_llama_tiny_shapes_and_counts() -> None:
    spec = resolve_workload("llama-tiny").model
    shapes = param_shapes(spec)
    hd = spec.head_dim
    assert shapes["blocks.0.attn.q.weight"] == (64, 4 * hd)
    assert shapes["blocks.0.attn.k.weight"] == (64, 2 * hd)  # grouped-query: 2 kv heads
    assert shapes["blocks.1.mlp.down.weight"] == (spec.d_ff, 64)
    assert not any(n.endswith(".bias") for n in shapes)
    assert 100_000 < count_params(spec) < 1_000_000
    tied = dataclasses.replace(spec, tie_embeddings=True)
    assert "head.weight" not in param_shapes(tied)
    # The tied head is still a matrix multiply: the FLOPs count it once.
    assert matmul_params(tied) == matmul_params(spec)
    assert count_params(tied) == count_params(spec) - 256 * 64


def test_rotary_tables_turn_pairs_by_position_times_frequency() -> None:
    """Checked against the complex-number form: pair i of a head, (x[i], x[i + hd/2]), is
    multiplied by exp(1j * pos * theta^(-2i/hd)); so q.k depends only on the distance."""
    spec = LlamaSpec(seq_len=16, d_model=32, n_heads=2, n_kv_heads=1)
    cos, sin = rope_tables(spec)
    hd, half = spec.head_dim, spec.head_dim // 2
    rng = np.random.default_rng(0)
    x = rng.standard_normal(hd)

    def rotate(v: np.ndarray, pos: int) -> np.ndarray:
        return v * cos[pos] + np.concatenate([-v[half:], v[:half]]) * sin[pos]

    freq = spec.rope_theta ** (-np.arange(half) * 2 / hd)
    for pos in (0, 3, 15):
        z = (x[:half] + 1j * x[half:]) * np.exp(1j * pos * freq)
        np.testing.assert_allclose(rotate(x, pos), np.concatenate([z.real, z.imag]), atol=1e-6)
    q, k = rng.standard_normal(hd), rng.standard_normal(hd)
    assert np.dot(rotate(q, 5), rotate(k, 2)) == pytest.approx(np.dot(rotate(q, 13),
                                                                      rotate(k, 10)), rel=1e-5)


def test_tp_and_pp_refuse_what_does_not_split_in_one_line() -> None:
    from sextant.runner import check_workload_fits

    llama = resolve_workload("llama-tiny")
    cases = [
        (resolve_workload("gpt-tiny"), dict(parallel="tp", workers=2, tp=2),
         "splits a Llama-shaped model"),
        (llama.replace(model=dataclasses.replace(llama.model, n_kv_heads=1)),
         dict(parallel="tp", workers=2, tp=2), "--tp 2 must divide model.n_kv_heads (1)"),
        (llama.replace(model=dataclasses.replace(llama.model, n_layers=3)),
         dict(parallel="pp", workers=2, pp=2, microbatches=2),
         "--pp 2 must divide model.n_layers (3)"),
        (llama.replace(model=dataclasses.replace(llama.model, tie_embeddings=True)),
         dict(parallel="pp", workers=2, pp=2, microbatches=2), "with tied embeddings"),
        (llama, dict(parallel="pp", workers=2, pp=2, microbatches=5),
         "--microbatches 5 does not divide the 16 rows"),
    ]
    for workload, fields, message in cases:
        with pytest.raises(UserError, match=message.replace("(", r"\(").replace(")", r"\)")):
            check_workload_fits(workload, Strategy(framework="torch", **fields))
    with pytest.raises(UserError, match="needs --tp N >= 2 dividing the 2 devices"):
        Strategy(framework="torch", parallel="tp", workers=2, tp=3)
    with pytest.raises(UserError, match="--pp, --microbatches and --schedule are for"):
        Strategy(framework="torch", parallel="dp", workers=2, microbatches=2)


@needs_torch
@pytest.mark.slow
@pytest.mark.parametrize("tied", [False, True])
def test_three_frameworks_train_llama_alike(tied: bool) -> None:
    w = short("llama-tiny", 10)
    if tied:
        w = w.replace(model=dataclasses.replace(w.model, tie_embeddings=True))
    frameworks = [f for f in FRAMEWORKS if HAS[f]]
    if tied:  # one pair is enough to hold the tied head to the same numbers
        frameworks = frameworks[:2]
    runs = {f: execute(w, Strategy(framework=f, mode="eager" if f in ("torch", "deepspeed")
                                   else "compiled"),
                       runs_dir=Path(tempfile.mkdtemp()))
            for f in frameworks}
    # Byte-level: the first loss is close to ln(256) with 0.02-scaled weights.
    assert runs["torch"].losses[0] == pytest.approx(np.log(256), rel=0.03)
    assert runs["torch"].losses[-1] < runs["torch"].losses[0] - 0.5
    for f in frameworks[1:]:
        same_training(runs[f], runs["torch"])
    assert init_params(w.model, w.seed).keys() == param_shapes(w.model).keys()
