"""LoRA: one definition on every framework that has it (A from the canonical generator,
B = 0, scale alpha / rank, the base frozen), so step 0 is the base model, the trainable
counts agree, and torch, JAX, TensorFlow, DeepSpeed, MLX and Keras train the same
numbers."""

from __future__ import annotations

import importlib.util
import math
import tempfile
from pathlib import Path

import numpy as np
import pytest

from sextant.core.errors import UserError
from sextant.workloads.init import adapter_shapes, init_adapters, param_shapes
from sextant.runner import check_workload_fits, execute
from sextant.strategy import Strategy
from sextant.workloads.spec import FinetuneSpec, load_workload, workload_from_dict
from sextant.pretrained.weights import initial_params, trainable_count
from tests.helpers import REPO, needs_torch, run_cli, same_training, short

LORA = FinetuneSpec(method="lora", rank=4, alpha=8.0,
                    targets=("q", "k", "v", "o", "gate", "up", "down"))
GPT_LORA = FinetuneSpec(method="lora", rank=4, alpha=8.0, targets=("qkv", "o", "up", "down"))
"""GPT-2's c_attn, attn.c_proj, mlp.c_fc and mlp.c_proj."""
PARITY = [f for f in ("torch", "jax", "tensorflow", "deepspeed", "mlx", "keras")
          if importlib.util.find_spec(f)]


def _raw(finetune: dict, family: str = "llama") -> dict:
    return {"name": "x", "model": {"family": family}, "data": {"dataset": "python-reference"},
            "finetune": finetune}


@pytest.mark.parametrize(("finetune", "family", "message"), [
    ({"method": "qlora"}, "llama", r"finetune.method must be one of \['full', 'lora'\]"),
    ({"method": "lora", "rank": 0}, "llama", r"finetune.rank must be an integer"),
    ({"method": "lora", "alpha": -1}, "llama", r"finetune.alpha must be a number > 0"),
    ({"method": "lora", "targets": ["q", "wq"]}, "llama", r"finetune.targets must list "
     r"distinct projections among \['q', 'k', 'v', 'o', 'gate', 'up', 'down'\]"),
    ({"method": "lora", "targets": []}, "llama", r"finetune.targets must list"),
    ({"method": "lora", "base_dtype": "fp16"}, "llama",
     r"finetune.base_dtype must be one of \['fp32', 'bf16'\]"),
    ({"base_dtype": "bf16"}, "llama", r"finetune.base_dtype = 'bf16' is for method = 'lora'"),
    ({"method": "lora", "dropout": 0.1}, "llama", r"unknown key finetune.dropout"),
    ({"method": "lora"}, "gpt", r"finetune.targets for a gpt model must list distinct "
     r"projections among \['qkv', 'o', 'up', 'down'\]. Received: \['q', 'v'\]"),
    ({"method": "lora", "targets": ["qkv"]}, "llama", r"finetune.targets for a llama model"),
    ({"method": "lora"}, "mlp", r"'lora' adapts the llama and gpt families'"),
])
def test_bad_finetune_tables_are_one_line_errors(finetune: dict, family: str,
                                                 message: str) -> None:
    with pytest.raises(UserError, match=message) as caught:
        workload_from_dict(_raw(finetune, family))
    assert "\n" not in str(caught.value)


def test_adapters_are_peft_s_and_counted() -> None:
    w = short("llama-tiny", 5).replace(finetune=LORA)
    spec, shapes = w.model, adapter_shapes(w.model, LORA)
    d, f, kv = spec.d_model, spec.d_ff, spec.n_kv_heads * spec.head_dim
    assert shapes["blocks.0.attn.k.lora_a"] == (d, 4) and shapes["blocks.0.attn.k.lora_b"] == (4, kv)
    assert shapes["blocks.1.mlp.down.lora_a"] == (f, 4)
    assert len(shapes) == 2 * 7 * spec.n_layers
    adapters = init_adapters(spec, LORA, w.seed)
    for name, value in adapters.items():
        if name.endswith("lora_b"):
            assert not value.any()  # B = 0: the adapted model starts as the base model
        else:  # PEFT's kaiming_uniform(a=sqrt(5)) on (rank, in): uniform in +-1/sqrt(in)
            bound = 1 / math.sqrt(value.shape[0])
            assert np.abs(value).max() <= bound and np.abs(value).max() > 0.8 * bound
    assert np.array_equal(init_adapters(spec, LORA, w.seed)["blocks.0.attn.q.lora_a"],
                          adapters["blocks.0.attn.q.lora_a"])
    trained, total = trainable_count(w)
    assert trained == sum(math.prod(s) for s in shapes.values())
    assert total == trained + sum(math.prod(s) for s in param_shapes(spec).values())
    # Full fine-tuning is the default and leaves every stored workload's hash alone.
    base = short("llama-tiny", 5)
    assert base.replace(finetune=FinetuneSpec()).content_hash() == base.content_hash()
    assert w.content_hash() != base.content_hash()
    assert initial_params(w).keys() == {**param_shapes(spec), **shapes}.keys()


def test_what_lora_is_not_built_for_is_refused_before_any_worker() -> None:
    w = short("llama-tiny", 5).replace(finetune=LORA)
    for framework in ("paddle", "mindspore"):
        with pytest.raises(UserError, match=rf"^{framework}'s model code has no LoRA adapters"):
            check_workload_fits(w, Strategy(framework=framework))
    with pytest.raises(UserError, match=r"runs with --parallel single or dp in fp32"):
        check_workload_fits(w, Strategy(framework="torch", parallel="fsdp", workers=2))
    with pytest.raises(UserError, match=r"runs with --parallel single or dp in fp32"):
        check_workload_fits(w, Strategy(framework="torch", precision="bf16"))
    # compare leaves those rows out with the reason, unless the frameworks were named.
    from sextant.commands.compare import _model_supported
    from sextant.core.display import console

    rows = [Strategy(framework=f) for f in ("torch", "paddle", "jax")]
    assert [s.framework for s in _model_supported(w, rows, console(), False)] == ["torch", "jax"]
    with pytest.raises(UserError, match=r"^paddle's model code has no LoRA"):
        _model_supported(w, rows, console(), True)


def test_from_hf_writes_the_finetune_table(tmp_path: Path) -> None:
    out = run_cli("workload", "from-hf", str(REPO / "tests/data/hf/qwen2-0.5b/config.json"),
                  "--layers", "2", "--width", "126", "--seq-len", "64", "--lora-rank", "4",
                  "--lora-targets", "q,k,v,o", timeout=120)
    assert out.returncode == 0, out.stderr
    (tmp_path / "w.toml").write_text(out.stdout)
    w = load_workload(tmp_path / "w.toml")
    assert w.finetune == FinetuneSpec(method="lora", rank=4, alpha=8.0,
                                      targets=("q", "k", "v", "o"))
    assert w.model.qkv_bias
    bad = run_cli("workload", "from-hf", str(REPO / "tests/data/hf/qwen2-0.5b/config.json"),
                  "--lora-targets", "q", timeout=120)
    assert bad.returncode == 2 and "--lora-targets go with --lora-rank" in bad.stderr


@needs_torch
@pytest.mark.slow
def test_lora_trains_alike_from_the_base_model_on_every_framework() -> None:
    full = short("llama-tiny", 6)
    lora = full.replace(finetune=LORA)
    base = execute(full, Strategy(framework="torch"), runs_dir=Path(tempfile.mkdtemp()))
    runs = {f: execute(lora, Strategy(framework=f), runs_dir=Path(tempfile.mkdtemp()))
            for f in PARITY}
    trained, total = trainable_count(lora)
    for f, run in runs.items():
        # Step 0 is the base model's: B = 0 adds exactly nothing.
        assert run.losses[0] == pytest.approx(base.losses[0], rel=1e-6), f
        same_training(run, runs["torch"])
        acc = run.ranks[0].memory_accounting
        assert (acc["trainable_parameters"], acc["parameters"]) == (trained, total), f
        # The frozen base is exactly the initial one; the adapters moved.
        final = np.load(Path(run.run_dir) / "final_params.npz")
        start = initial_params(lora)
        assert all(np.array_equal(final[k], start[k]) for k in param_shapes(lora.model)), f
        assert not np.array_equal(final["blocks.0.attn.q.lora_b"], 0)
        adapters = Path(run.run_dir) / "adapters.npz"
        assert run.ranks[0].details["adapter_bytes"] == adapters.stat().st_size
        assert set(np.load(adapters).files) == set(adapter_shapes(lora.model, LORA))
    # LoRA's updates differ from full fine-tuning's after step 0.
    assert runs["torch"].losses[1] != pytest.approx(base.losses[1], rel=1e-4)


@needs_torch
@pytest.mark.slow
def test_lora_on_the_gpt_family_trains_alike() -> None:
    """GPT-2-shaped models: adapters on the fused qkv, the attention output and both MLP
    matrices, with their biases frozen, train alike (step 0 as the base model: B = 0, which
    test_the_merged_model_is_the_adapted_model's gpt case and the llama runs above hold)."""
    lora = short("gpt-tiny", 4).replace(finetune=GPT_LORA)
    shapes = adapter_shapes(lora.model, GPT_LORA)
    d = lora.model.d_model
    assert shapes["blocks.0.attn.qkv.lora_b"] == (4, 3 * d)
    assert shapes["blocks.1.mlp.proj.lora_a"] == (lora.model.d_ff, 4)
    runs = {f: execute(lora, Strategy(framework=f), runs_dir=Path(tempfile.mkdtemp()))
            for f in ("torch", "jax", "tensorflow", "mlx") if importlib.util.find_spec(f)}
    trained, total = trainable_count(lora)
    for f, run in runs.items():
        same_training(run, runs["torch"], rtol=2e-5 if f == "mlx" else 1e-5)
        acc = run.ranks[0].memory_accounting
        assert (acc["trainable_parameters"], acc["parameters"]) == (trained, total), f
        final = np.load(Path(run.run_dir) / "final_params.npz")
        assert np.array_equal(final["blocks.0.attn.qkv.bias"],
                              initial_params(lora)["blocks.0.attn.qkv.bias"]), f
        assert not np.array_equal(final["blocks.0.attn.qkv.lora_b"], 0), f


@needs_torch
@pytest.mark.slow
def test_lora_data_parallel_matches_one_process() -> None:
    w = short("llama-tiny", 5).replace(finetune=FinetuneSpec(method="lora", rank=2, alpha=4.0))
    one = execute(w, Strategy(framework="torch"), runs_dir=Path(tempfile.mkdtemp()))
    for f in [f for f in PARITY if f != "deepspeed"]:  # DeepSpeed's: torch's modules
        two = execute(w, Strategy(framework=f, parallel="dp", workers=2),
                      runs_dir=Path(tempfile.mkdtemp()))
        same_training(two, one)


@needs_torch
@pytest.mark.slow
def test_run_prints_the_trainable_parameters(tmp_path: Path) -> None:
    toml = tmp_path / "lora.toml"
    toml.write_text((REPO / "workloads" / "llama-tiny.toml").read_text()
                    + '\n[finetune]\nmethod = "lora"\nrank = 4\nalpha = 8.0\n'
                      'targets = ["q", "v"]\n')
    out = run_cli("run", "--framework", "torch", "--workload", str(toml), "--steps", "6",
                  "--db", str(tmp_path / "results.db"), timeout=300)
    assert out.returncode == 0, out.stderr
    trained, total = trainable_count(load_workload(toml))
    assert (f"LoRA rank 4, alpha 8 (scale 2) on q, v: trainable parameters {trained:,} of "
            f"{total:,}") in out.stdout.replace("\n", " ")


@needs_torch
@pytest.mark.parametrize(("name", "lora"), [("llama-tiny", LORA), ("gpt-tiny", GPT_LORA)])
def test_the_merged_model_is_the_adapted_model(name: str, lora: FinetuneSpec) -> None:
    """merge_adapters folds W + A B * alpha / rank: the plain model it gives computes the
    adapted model's logits (torch, fp32), with nonzero B so the merge has work to do."""
    import torch

    from sextant.backends.torch_backend.model import add_adapters, build, load_canonical
    from sextant.pretrained.weights import merge_adapters

    LORA = lora  # noqa: N806
    w = short(name, 5).replace(finetune=LORA)
    params = initial_params(w)
    rng = np.random.default_rng(0)
    params = {k: (rng.standard_normal(v.shape).astype(np.float32) * 0.05
                  if k.endswith("lora_b") else v) for k, v in params.items()}
    adapted = build(w.model)
    add_adapters(adapted, adapter_shapes(w.model, LORA), LORA.scale)
    load_canonical(adapted, params)
    merged = build(w.model)
    load_canonical(merged, merge_adapters(params, LORA.scale))
    tokens = torch.from_numpy(rng.integers(0, 256, (2, 16)))
    with torch.no_grad():
        a, m = adapted(tokens).numpy(), merged(tokens).numpy()
        base = build(w.model)
        load_canonical(base, {k: v for k, v in params.items() if k in param_shapes(w.model)})
        b = base(tokens).numpy()
    assert np.abs(a - m).max() < 1e-4 * np.abs(a).max()
    assert np.abs(a - b).max() > 1e-2 * np.abs(a).max()  # the adapters changed the model


@pytest.mark.slow
@pytest.mark.skipif(importlib.util.find_spec("jax") is None, reason="needs JAX")
def test_a_killed_lora_run_resumes_where_it_was(tmp_path: Path) -> None:
    """JAX's masked optimizer state (moments for the adapters only) goes through its
    checkpoint and back: the resumed run continues the uninterrupted one."""
    import functools

    from tests.helpers import kill_then_resume

    w = short("llama-tiny", 8).replace(finetune=LORA)
    whole = execute(w, Strategy(framework="jax"), runs_dir=tmp_path / "a")
    resumed = kill_then_resume(w, functools.partial(Strategy, framework="jax"), tmp_path)
    same_training(resumed, whole, b_from=3)


@needs_torch
@pytest.mark.slow
def test_a_bf16_frozen_base_trains_alike_on_torch_and_jax() -> None:
    """finetune.base_dtype = 'bf16': the blocks' frozen matrices stored rounded to bfloat16
    (half their bytes), every matmul still in fp32, so torch and JAX train the same numbers
    of the rounded base; frameworks without it refuse before any worker."""
    import ml_dtypes

    from sextant.pretrained.weights import bf16_base_names

    spec = FinetuneSpec(method="lora", rank=4, alpha=8.0, targets=("q", "v", "down"))
    fp32 = short("llama-tiny", 4).replace(finetune=spec)
    bf16 = fp32.replace(finetune=FinetuneSpec(method="lora", rank=4, alpha=8.0,
                                              targets=("q", "v", "down"), base_dtype="bf16"))
    assert bf16.content_hash() != fp32.content_hash()
    with pytest.raises(UserError, match=r"tensorflow's model code has no bf16 frozen base .* "
                                        r"Frameworks that have it: torch, jax"):
        check_workload_fits(bf16, Strategy(framework="tensorflow"))
    runs = {f: execute(bf16, Strategy(framework=f), runs_dir=Path(tempfile.mkdtemp()))
            for f in ("torch", "jax") if importlib.util.find_spec(f)}
    rounded = bf16_base_names(bf16)
    start = initial_params(bf16)
    frozen = [k for k in param_shapes(bf16.model)]
    expected_bytes = sum(start[k].nbytes // (2 if k in rounded else 1) for k in frozen)
    for f, record in runs.items():
        same_training(record, runs["torch"])
        final = np.load(Path(record.run_dir) / "final_params.npz")
        for name in rounded:
            expected = start[name].astype(ml_dtypes.bfloat16).astype(np.float32)
            assert np.array_equal(final[name], expected), (f, name)
            assert not np.array_equal(expected, start[name])  # the rounding is real
        # The frozen base's bytes as the framework holds them: its matrices at 2 bytes.
        assert record.ranks[0].memory_accounting["frozen_params"] == expected_bytes, f


@needs_torch
def test_compare_levers_sets_lora_against_full_fine_tuning() -> None:
    """The LoRA lever row: PEFT's defaults on the family's default targets, the baseline's
    strategy, named in the levers table, with its optimizer state a fraction of full
    fine-tuning's."""
    import io

    from rich.console import Console

    from sextant.commands.compare import lever_table, lora_lever

    full = short("gpt-tiny", 4)
    lora = lora_lever(full)
    assert lora is not None and lora.finetune.targets == ("qkv",) and lora.finetune.rank == 8
    assert lora_lever(short("llama-tiny", 4)).finetune.targets == ("q", "v")  # type: ignore[union-attr]
    assert lora_lever(lora) is None and lora_lever(short("digits-mlp", 4)) is None
    strategy = Strategy(framework="torch")
    records = [execute(w, strategy, runs_dir=Path(tempfile.mkdtemp())) for w in (full, lora)]
    console = Console(file=io.StringIO(), width=200)
    console.print(lever_table(records))
    text = console.file.getvalue()  # type: ignore[attr-defined]
    rows = [line for line in text.splitlines() if line.startswith("│ torch")]
    assert len(rows) == 2 and "lora r8 (qkv)" in rows[1] and "lora" not in rows[0]
    full_opt, lora_opt = (r.ranks[0].memory_accounting["optimizer_state"] for r in records)
    assert lora_opt < full_opt / 10
