"""Pretrained weights: tiny Llama, Mistral, Qwen2 and GPT-2 models made here by transformers
(`from_config`, random weights, `save_pretrained` as safetensors; nothing fetched) load into
sextant's own model code on every framework installed, whose fp32 logits agree with
transformers' forward on the same tokens; a checkpoint that does not fit is refused in one
line naming the tensor; a run from `hf:DIR` starts from those weights."""

from __future__ import annotations

import importlib.util
import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import pytest

from sextant.core.errors import UserError
from sextant.sources import resolve_workload
from sextant.pretrained.weights import initial_params
from tests.helpers import REPO

pytest.importorskip("transformers")
pytest.importorskip("safetensors")

SEQ = 16
LOGITS_RTOL = 1e-4
"""fp32 logits: the largest difference from transformers' over the largest logit."""


def _configs() -> dict:
    from transformers import GPT2Config, LlamaConfig, MistralConfig, Qwen2Config

    llama_like = dict(vocab_size=300, hidden_size=32, intermediate_size=48,
                      num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2)
    return {
        # Grouped-query attention, an untied head, a non-default rotary base.
        "llama": LlamaConfig(**llama_like, rope_theta=5000.0, rms_norm_eps=1e-5),
        # A sliding window longer than the sequence: it never bites.
        "mistral": MistralConfig(**llama_like, sliding_window=2 * SEQ),
        # Biases on q, k and v; tied embeddings.
        "qwen2": Qwen2Config(**llama_like, tie_word_embeddings=True, rope_theta=1e6),
        # Tied head, fused Conv1D qkv, more positions than the workload's sequence.
        "gpt2": GPT2Config(vocab_size=300, n_embd=32, n_layer=2, n_head=4, n_positions=4 * SEQ,
                           bos_token_id=0, eos_token_id=0),
    }


@pytest.fixture(scope="session")
def checkpoints(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Path, np.ndarray]]:
    """family -> (its checkpoint folder, transformers' fp32 logits on folder/tokens.npy).
    Every parameter is redrawn (norm scales around 1, biases nonzero), so a parameter that
    is mapped wrong, or left at its initial value, moves the logits."""
    import torch
    from transformers import AutoModelForCausalLM

    root = tmp_path_factory.mktemp("hf-models")
    out = {}
    for i, (family, cfg) in enumerate(_configs().items()):
        torch.manual_seed(i)
        model = AutoModelForCausalLM.from_config(cfg).eval()
        with torch.no_grad():
            for name, p in model.named_parameters():
                is_scale = name.endswith("norm.weight") or ".ln_" in name and "weight" in name
                p.copy_(torch.randn_like(p) * 0.2 + (1.0 if is_scale else 0.0))
        folder = root / family
        model.save_pretrained(folder, safe_serialization=True)
        tokens = torch.randint(0, cfg.vocab_size, (2, SEQ), generator=torch.Generator().manual_seed(i))
        np.save(folder / "tokens.npy", tokens.numpy())
        with torch.no_grad():
            out[family] = (folder, model(tokens).logits.numpy())
    return out


def _spec(folder: Path) -> str:
    return f"hf:{folder},seq_len={SEQ}"


def _relative(ours: np.ndarray, ref: np.ndarray) -> float:
    return float(np.abs(ours - ref).max() / np.abs(ref).max())


FORWARD_FRAMEWORKS = [f for f in ("torch", "jax", "tensorflow", "keras", "mlx")
                      if importlib.util.find_spec(f) is not None]


@pytest.mark.parametrize("framework", FORWARD_FRAMEWORKS)
def test_every_family_gives_transformers_logits(framework: str, checkpoints: dict,
                                                tmp_path: Path) -> None:
    """One process per framework (frameworks are never imported together), all four
    families in it; DeepSpeed trains torch's modules, so torch's row covers it."""
    families = list(checkpoints)
    run = subprocess.run(
        [sys.executable, "-m", "tests.pretrained_forward", framework, str(tmp_path),
         *(_spec(checkpoints[f][0]) for f in families)],
        cwd=REPO, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    for i, family in enumerate(families):
        ours, ref = np.load(tmp_path / f"{i}.npy"), checkpoints[family][1]
        assert ours.shape == ref.shape, family
        assert _relative(ours, ref) < LOGITS_RTOL, (family, _relative(ours, ref))


def test_the_mapping_is_checked_against_a_wrong_model(checkpoints: dict) -> None:
    """The comparison can fail: logits from seeded (not loaded) weights are far off."""
    from sextant.backends.torch_backend.model import build, load_canonical

    import torch

    folder, ref = checkpoints["qwen2"]
    w = resolve_workload(_spec(folder))
    net = build(w.model)
    load_canonical(net, {**initial_params(w), "blocks.0.attn.k.bias":
                         np.zeros_like(initial_params(w)["blocks.0.attn.k.bias"])})
    with torch.no_grad():
        ours = net(torch.from_numpy(np.load(folder / "tokens.npy"))).numpy()
    assert _relative(ours, ref) > 100 * LOGITS_RTOL


def _rewrite(src: Path, dst: Path, change) -> Path:
    """A copy of checkpoint `src` whose tensors went through `change(dict) -> dict`."""
    from safetensors.numpy import load_file, save_file

    shutil.copytree(src, dst)
    tensors = change(load_file(str(dst / "model.safetensors")))
    save_file(tensors, str(dst / "model.safetensors"))
    return dst


@pytest.mark.parametrize(("change", "message"), [
    (lambda t: {k: v for k, v in t.items() if k != "model.layers.1.self_attn.v_proj.bias"},
     r"^weights: tensor model\.layers\.1\.self_attn\.v_proj\.bias \(sextant's "
     r"blocks\.1\.attn\.v\.bias\) is missing from the checkpoint in "),
    (lambda t: {**t, "model.layers.0.mlp.up_proj.weight": np.zeros((48, 16), np.float32)},
     r"^weights: tensor model\.layers\.0\.mlp\.up_proj\.weight in .* has shape \[48, 16\]; "
     r"this workload's model needs \[48, 32\] \(sextant's blocks\.0\.mlp\.up\.weight\)$"),
    (lambda t: {**t, "model.layers.0.self_attn.o_proj.bias": np.zeros(32, np.float32)},
     r"^weights: tensor model\.layers\.0\.self_attn\.o_proj\.bias in .* is not a parameter "
     r"of this workload's llama model \(1 such tensor\)"),
    (lambda t: {**t, "lm_head.weight": t["model.embed_tokens.weight"] + 1},
     r"^weights: tensor lm_head\.weight in .* differs from the embedding"),
])
def test_a_checkpoint_that_does_not_fit_is_refused_in_one_line(
        checkpoints: dict, tmp_path: Path, change, message: str) -> None:
    folder = _rewrite(checkpoints["qwen2"][0], tmp_path / "bad", change)
    with pytest.raises(UserError, match=message) as caught:
        initial_params(resolve_workload(_spec(folder)))
    assert "\n" not in str(caught.value)


def test_the_cli_refuses_a_misshapen_checkpoint_before_any_worker(
        checkpoints: dict, tmp_path: Path) -> None:
    from tests.helpers import run_cli

    folder = _rewrite(checkpoints["llama"][0], tmp_path / "bad", lambda t: {
        **t, "model.norm.weight": np.ones(31, np.float32)})
    out = run_cli("run", "--framework", "torch", "--workload", _spec(folder),
                  "--db", str(tmp_path / "results" / "results.db"), timeout=120)
    assert out.returncode == 2 and "Traceback" not in out.stderr, out.stderr
    assert "tensor model.norm.weight in" in out.stderr and "has shape [31]" in out.stderr
    assert len(out.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "results").exists()  # refused before anything ran or was stored


def test_no_safetensors_and_pickles_are_refused(tmp_path: Path, checkpoints: dict) -> None:
    folder = tmp_path / "pickled"
    folder.mkdir()
    shutil.copy(checkpoints["llama"][0] / "config.json", folder)
    (folder / "pytorch_model.bin").write_bytes(b"not read")
    # Without *.safetensors the folder is only a config: its seeded model, never the .bin.
    assert not resolve_workload(_spec(folder)).weights
    from sextant.pretrained.weights import load_weights

    with pytest.raises(UserError, match=r"holds no \*\.safetensors file .* never pickled"):
        load_weights(resolve_workload(_spec(folder)).model, folder)


def test_sharded_and_bf16_checkpoints_load(checkpoints: dict, tmp_path: Path) -> None:
    import torch
    from transformers import AutoModelForCausalLM

    folder = checkpoints["llama"][0]
    whole = initial_params(resolve_workload(_spec(folder)))
    model = AutoModelForCausalLM.from_pretrained(folder)
    model.save_pretrained(tmp_path / "sharded", safe_serialization=True, max_shard_size="20KB")
    index = json.loads((tmp_path / "sharded" / "model.safetensors.index.json").read_text())
    assert len(set(index["weight_map"].values())) > 2
    sharded = initial_params(resolve_workload(_spec(tmp_path / "sharded")))
    assert sharded.keys() == whole.keys()
    assert all(np.array_equal(sharded[k], whole[k]) for k in whole)

    model.to(torch.bfloat16).save_pretrained(tmp_path / "bf16", safe_serialization=True)
    bf16 = initial_params(resolve_workload(_spec(tmp_path / "bf16")))
    for name, value in whole.items():  # exactly the bf16 rounding of each value
        rounded = torch.from_numpy(value).to(torch.bfloat16).float().numpy()
        assert np.array_equal(bf16[name], rounded), name


@pytest.mark.slow
@pytest.mark.parametrize(("family", "frameworks", "lora"), [
    ("qwen2", ("torch", "jax", "tensorflow"), False),
    ("gpt2", ("torch", "keras", "mlx"), False),
    ("qwen2", ("torch", "jax", "tensorflow"), True),
])
def test_runs_from_hf_dir_start_from_the_pretrained_weights(
        checkpoints: dict, family: str, frameworks: tuple[str, ...], lora: bool) -> None:
    """The workers load the checkpoint: torch's first loss is transformers' loss on global
    batch 0, and the other frameworks train the same numbers from it (Qwen2's biases and
    GPT-2's tied head get their gradients alike; LoRA on the pretrained model too)."""
    import torch
    from transformers import AutoModelForCausalLM

    from sextant.data import global_batch
    from sextant.runner import execute
    from sextant.strategy import Strategy
    from tests.helpers import same_training

    folder = checkpoints[family][0]
    w = resolve_workload(f"hf:{folder},seq_len={SEQ},global_batch=4,steps=4")
    w = w.replace(measure=w.measure.__class__(warmup_steps=1, nosync_steps=0, log_every=1))
    if lora:
        from sextant.workloads.spec import FinetuneSpec

        w = w.replace(finetune=FinetuneSpec(method="lora", rank=2, alpha=4.0,
                                            targets=("q", "k", "v", "o", "up")))
    x, y = global_batch(w, 0)
    with torch.no_grad():
        logits = AutoModelForCausalLM.from_pretrained(folder)(torch.from_numpy(x)).logits
        expected = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]),
                                                     torch.from_numpy(y).reshape(-1)).item()
    runs = {f: execute(w, Strategy(framework=f), runs_dir=Path(tempfile.mkdtemp()))
            for f in frameworks if importlib.util.find_spec(f)}
    assert runs["torch"].losses[0] == pytest.approx(expected, rel=1e-5)
    for f, record in runs.items():
        same_training(record, runs["torch"])


def test_a_backend_without_the_model_part_refuses_before_any_worker(checkpoints: dict) -> None:
    from sextant.runner import check_workload_fits
    from sextant.strategy import Strategy

    for family, part in (("qwen2", "query/key/value biases"), ("gpt2", "tied to the embedding")):
        w = resolve_workload(_spec(checkpoints[family][0]))
        for framework in ("paddle", "mindspore"):
            with pytest.raises(UserError, match=rf"^{framework}'s model code has no .*{part}.*"
                                                r"Frameworks that have it: torch, jax, "):
                check_workload_fits(w, Strategy(framework=framework))
        check_workload_fits(w, Strategy(framework="torch"))


def test_the_weights_content_names_the_workload(checkpoints: dict, tmp_path: Path,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """The same weights in another folder are the same workload; changed weights in the same
    folder are another one, and a worker refuses weights that changed after the workload was
    resolved."""
    monkeypatch.setenv("SEXTANT_CACHE", str(tmp_path / "cache"))
    folder = checkpoints["llama"][0]
    w = resolve_workload(_spec(folder))
    assert len(w.weights_digest) == 24
    moved = resolve_workload(_spec(shutil.copytree(folder, tmp_path / "elsewhere" / folder.name)))
    assert moved.weights != w.weights
    assert (moved.content_hash(), moved.state_hash()) == (w.content_hash(), w.state_hash())
    changed_folder = _rewrite(folder, tmp_path / "changed" / folder.name, lambda t: {
        **t, "model.norm.weight": t["model.norm.weight"] * 2})
    changed = resolve_workload(_spec(changed_folder))
    assert changed.content_hash() != w.content_hash()
    stale = changed.replace(weights_digest=w.weights_digest)
    with pytest.raises(UserError, match=r"^weights: the checkpoint in .* is not the one the "
                                        r"workload was loaded with"):
        initial_params(stale)
