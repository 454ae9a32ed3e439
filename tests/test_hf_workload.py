"""Workloads from Hugging Face config.json files: the real configs shipped in tests/data/hf
(sources in tests/data/hf/README.md), mapped, counted, refused, scaled, planned and trained."""

from __future__ import annotations

import importlib.util
import json
import tempfile
from pathlib import Path

import pytest

from sextant.core.errors import UserError
from sextant.pretrained.hf import workload_from_hf, workload_from_spec
from sextant.workloads.init import count_params
from sextant.sources import resolve_workload, workload_source
from sextant.workloads.spec import GPTSpec, LlamaSpec, load_workload, workload_from_dict
from tests.helpers import PARITY_RTOL, REPO, needs_torch, run_cli, same_training

HF = REPO / "tests" / "data" / "hf"
TINYLLAMA = HF / "tinyllama-1.1b-chat-v1.0" / "config.json"
SMOLLM2 = HF / "smollm2-135m" / "config.json"
GPT2 = HF / "gpt2" / "config.json"
QWEN2 = HF / "qwen2-0.5b" / "config.json"


def config(path: Path) -> dict:
    return json.loads(path.read_text())


def write(tmp_path: Path, cfg: dict) -> Path:
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg))
    return path


@pytest.mark.parametrize(("path", "published"), [
    (TINYLLAMA, 1.1e9),   # "TinyLlama-1.1B"
    (SMOLLM2, 135e6),     # "SmolLM2-135M"
    (QWEN2, 0.49e9),      # Qwen2-0.5B's card: 0.49B parameters (tied embeddings)
    (GPT2, 124e6),        # GPT-2's 124M, its tied head counted once
])
def test_parameter_counts_agree_with_the_published_size(path: Path, published: float) -> None:
    w = workload_from_dict(workload_from_hf(path))
    assert abs(count_params(w.model) - published) / published < 0.01


def test_llama_fields_are_mapped() -> None:
    w = workload_from_dict(workload_from_hf(TINYLLAMA))
    assert w.model == LlamaSpec(vocab_size=32000, seq_len=2048, d_model=2048, n_layers=22,
                                n_heads=32, n_kv_heads=4, d_ff=5632, tie_embeddings=False,
                                rope_theta=10000.0, norm_eps=1e-5)
    smol = workload_from_dict(workload_from_hf(SMOLLM2, seq_len=128)).model
    assert isinstance(smol, LlamaSpec)
    assert (smol.tie_embeddings, smol.rope_theta, smol.n_heads, smol.n_kv_heads,
            smol.seq_len) == (True, 100000.0, 9, 3, 128)
    assert "tinyllama-1.1b-chat-v1.0" in w.description and "1.10B" in w.description


def test_gpt2_maps_with_its_tied_head_or_untied() -> None:
    w = workload_from_dict(workload_from_hf(GPT2))
    assert w.model == GPTSpec(vocab_size=50257, seq_len=1024, d_model=768, n_layers=12,
                              n_heads=12, d_ff=3072, tie_embeddings=True)
    assert "without dropout (attn_pdrop=0.1, embd_pdrop=0.1, resid_pdrop=0.1)" in w.description
    with tempfile.TemporaryDirectory() as tmp:
        raw = workload_from_hf(write(Path(tmp), {**config(GPT2), "tie_word_embeddings": False}))
    untied = workload_from_dict(raw).model
    assert isinstance(untied, GPTSpec) and not untied.tie_embeddings
    # Untied, the head adds vocab x width of its own.
    assert count_params(untied) - count_params(w.model) == 50257 * 768


def test_qwen2_maps_to_the_llama_family_with_qkv_biases() -> None:
    w = workload_from_dict(workload_from_hf(QWEN2, seq_len=512))
    assert w.model == LlamaSpec(vocab_size=151936, seq_len=512, d_model=896, n_layers=24,
                                n_heads=14, n_kv_heads=2, d_ff=4864, tie_embeddings=True,
                                rope_theta=1e6, norm_eps=1e-6, qkv_bias=True)
    out = run_cli("workload", "from-hf", str(QWEN2), "--seq-len", "512", timeout=120)
    assert out.returncode == 0, out.stderr
    assert "qkv_bias = true" in out.stdout and "tie_embeddings = true" in out.stdout


def test_a_mistral_window_no_shorter_than_the_sequence_maps(tmp_path: Path) -> None:
    path = write(tmp_path, {**config(TINYLLAMA), "model_type": "mistral",
                            "sliding_window": 1024})
    # The default sequence stays inside the window, where full attention is the model's own.
    assert workload_from_dict(workload_from_hf(path)).model.seq_len == 1024
    assert workload_from_dict(workload_from_hf(path, seq_len=1024)).model.n_kv_heads == 4
    with pytest.raises(UserError, match=r"sliding_window = 1024 is not supported: --seq-len "
                                        r"2048 is longer than the window"):
        workload_from_hf(path, seq_len=2048)


@pytest.mark.parametrize(("change", "message"), [
    ({"model_type": "mistral", "use_sliding_window": True}, r"use_sliding_window = true is"),
    ({"model_type": "qwen2", "use_sliding_window": True, "sliding_window": 4096},
     r"use_sliding_window = true is not supported"),
    ({"layer_types": ["sliding_attention"] * 22}, r"layer_types = .* full causal attention"),
    ({"rope_scaling": {"rope_type": "llama3", "factor": 8.0}},
     r'rope_scaling = \{"rope_type": "llama3", "factor": 8.0\} is not supported'),
    ({"num_local_experts": 8}, r"num_local_experts = 8 is not supported: mixture-of-experts"),
    ({"mlp_bias": True}, r"mlp_bias = true is not supported: sextant.s llama family has biases on the query"),
    ({"model_type": "gpt_neox"}, r'model_type = "gpt_neox" is not supported: GPT-NeoX puts'),
    ({"model_type": "falcon"}, r'model_type = "falcon" is not supported: supported: llama'),
    ({"attention_bias": True}, r"attention_bias = true is not supported"),
    ({"hidden_act": "gelu"}, r'hidden_act = "gelu" is not supported'),
    ({"head_dim": 128}, r"head_dim = 128 is not supported: .* must be hidden_size / "),
    ({"parallel_attn": True}, r"parallel_attn = true is not supported: sextant cannot tell"),
    ({"num_hidden_layers": "22"}, r'num_hidden_layers must be an integer from 1 to 2\*\*53. '
                                  r'Received: "22"'),
])
def test_what_the_families_cannot_express_is_refused_in_one_line(
        tmp_path: Path, change: dict, message: str) -> None:
    path = write(tmp_path, {**config(TINYLLAMA), **change})
    with pytest.raises(UserError, match=message) as caught:
        workload_from_hf(path)
    assert "\n" not in str(caught.value) and str(path) in str(caught.value)


def test_mistral_without_a_sliding_window_maps(tmp_path: Path) -> None:
    path = write(tmp_path, {**config(TINYLLAMA), "model_type": "mistral",
                            "sliding_window": None})
    assert workload_from_dict(workload_from_hf(path)).model.n_kv_heads == 4


@pytest.mark.parametrize("path", [TINYLLAMA, SMOLLM2])
def test_scale_keeps_the_shape(path: Path) -> None:
    full = workload_from_dict(workload_from_hf(path)).model
    small = workload_from_dict(workload_from_hf(path, scale=0.01)).model
    assert isinstance(full, LlamaSpec) and isinstance(small, LlamaSpec)
    assert small.n_heads // small.n_kv_heads == full.n_heads // full.n_kv_heads
    assert small.vocab_size == full.vocab_size and small.tie_embeddings == full.tie_embeddings
    assert small.d_ff / small.d_model == pytest.approx(full.d_ff / full.d_model, rel=0.02)

    def in_layers(m: LlamaSpec) -> int:  # all but the embedding, head and final norm
        return count_params(m) - m.vocab_size * m.d_model * (1 if m.tie_embeddings else 2) \
            - m.d_model

    ratio = in_layers(small) / in_layers(full)
    assert 0.004 < ratio < 0.025, ratio
    assert "scaled by 0.01" in workload_from_dict(workload_from_hf(path, scale=0.01)).description


def test_layers_and_width_override_and_bad_values_are_refused() -> None:
    m = workload_from_dict(workload_from_hf(TINYLLAMA, layers=2, width=64, seq_len=32)).model
    assert (m.n_layers, m.d_model, m.n_heads, m.n_kv_heads, m.d_ff) == (2, 64, 8, 1, 176)
    with pytest.raises(UserError, match=r"--width 64 does not split into 3 heads of even "
                                        r"width .* use a multiple of 6, e.g. 66"):
        workload_from_hf(SMOLLM2, width=64)
    for bad in ({"scale": 0}, {"scale": 1.5}, {"layers": 0}, {"seq_len": -1}):
        with pytest.raises(UserError, match=r"must be"):
            workload_from_hf(TINYLLAMA, **bad)


def test_hf_specs_are_workloads_everywhere(tmp_path: Path) -> None:
    spec = f"hf:{TINYLLAMA},layers=2,width=64,seq_len=32,global_batch=8"
    w = resolve_workload(spec)
    assert w == workload_from_spec(spec) and w.global_batch == 8 and w.model.n_layers == 2
    assert workload_source(spec) == spec  # already absolute
    with pytest.raises(UserError, match=r"key one of scale, layers"):
        resolve_workload(f"hf:{TINYLLAMA},depth=2")
    with pytest.raises(UserError, match=r"Hugging Face config not found"):
        resolve_workload("hf:no/such/config.json")
    # The command writes the same workload as a TOML file that loads.
    out = run_cli("workload", "from-hf", str(TINYLLAMA), "--layers", "2", "--width", "64",
                  "--seq-len", "32", "--global-batch", "8", timeout=120)
    assert out.returncode == 0, out.stderr
    (tmp_path / "w.toml").write_text(out.stdout)
    assert load_workload(tmp_path / "w.toml") == w
    refused = run_cli("workload", "from-hf",
                      str(write(tmp_path, {**config(TINYLLAMA), "model_type": "falcon"})),
                      timeout=120)
    assert refused.returncode == 2 and "Traceback" not in refused.stderr
    assert 'model_type = "falcon" is not supported' in refused.stderr


def test_the_planner_reads_the_same_config() -> None:
    from sextant.planner.workload_shapes import load_workload_shape

    for path in (TINYLLAMA, GPT2):  # GPT-2's tied head counted once by both
        shape = load_workload_shape(f"hf:{path}")
        assert shape.total_params() == count_params(workload_from_dict(
            workload_from_hf(path)).model)
    out = run_cli("plan", "--workload", f"hf:{SMOLLM2},seq_len=2048", "--gpus", "8",
                  timeout=120)
    assert out.returncode == 0, out.stderr
    assert "135M parameters" in out.stdout.replace("\n", " ")


@needs_torch
@pytest.mark.slow
def test_a_scaled_tinyllama_trains_alike_on_every_framework() -> None:
    """`compare --workload hf:<TinyLlama>,...`'s runs: torch, JAX and TensorFlow train the
    same numbers from the mapped config (vocabulary 32,000 on the byte-level corpus)."""
    from sextant.runner import execute
    from sextant.strategy import Strategy

    w = resolve_workload(f"hf:{TINYLLAMA},layers=2,width=64,seq_len=32,global_batch=8,steps=6")
    w = w.replace(measure=w.measure.__class__(warmup_steps=1, nosync_steps=0, log_every=2))
    runs = {f: execute(w, Strategy(framework=f, mode="eager" if f == "torch" else "compiled"),
                       runs_dir=Path(tempfile.mkdtemp()))
            for f in ("torch", "jax", "tensorflow")
            if importlib.util.find_spec(f) is not None}
    assert runs["torch"].losses[-1] < runs["torch"].losses[0]
    # torch's float32 norm of the 32,000 x 64 head gradient is coarser than the others'.
    for f, record in runs.items():
        same_training(record, runs["torch"], norm_rtol=PARITY_RTOL["fp32-torch-cpu-norm"])
    if "tensorflow" in runs:
        same_training(runs["tensorflow"], runs["jax"])


@pytest.mark.parametrize(("change", "message"), [
    ({"rope_parameters": [1, 2]}, r"rope_parameters must be a table \(a JSON object\). "
                                  r"Received: \[1, 2\]"),
    ({"rope_parameters": "default"}, r"rope_parameters must be a table"),
    ({"rope_theta": "10000"}, r'rope_theta must be a finite number > 0. Received: "10000"'),
    ({"rope_theta": [1.0]}, r"rope_theta must be a finite number > 0"),
    ({"rope_theta": None}, r"rope_theta must be a finite number > 0. Received: null"),
    ({"rope_parameters": {"rope_theta": None}},
     r"rope_parameters.rope_theta must be a finite number > 0"),
    ({"rms_norm_eps": "1e-5"}, r"rms_norm_eps must be a finite number > 0"),
    ({"rms_norm_eps": None}, r"rms_norm_eps must be a finite number > 0"),
    ({"head_dim": {"x": 1}}, r'head_dim must be an integer from 1 to 2\*\*53. Received: '
                             r'\{"x": 1\}'),
    ({"num_key_value_heads": 64}, r"num_attention_heads must be a multiple of "
                                  r"num_key_value_heads .* Received: num_attention_heads=32, "
                                  r"num_key_value_heads=64"),
    ({"vocab_size": 10 ** 400}, r"vocab_size must be an integer from 1 to 2\*\*53. "
                                r"Received: 1000000000\d{190}\.\.\.$"),
])
def test_config_values_of_the_wrong_type_are_refused_in_one_line(
        tmp_path: Path, change: dict, message: str) -> None:
    path = write(tmp_path, {**config(TINYLLAMA), **change})
    with pytest.raises(UserError, match=message) as caught:
        workload_from_hf(path, scale=0.1)
    assert "\n" not in str(caught.value) and str(path) in str(caught.value)


@pytest.mark.parametrize(("text", "message"), [
    ('{"vocab_size": 1' + "0" * 5000 + "}", r"is not a JSON config.json: Exceeds the limit"),
    ("[" * 100_000 + "]" * 100_000, r"is not a JSON config.json: nested too deeply"),
    (b"\xff\xfe{}", r"is not a JSON config.json: not UTF-8 text \(byte 0\)"),
])
def test_unreadable_configs_are_refused_in_one_line(tmp_path: Path, text: str | bytes,
                                                    message: str) -> None:
    path = tmp_path / "config.json"
    if isinstance(text, bytes):
        path.write_bytes(text)
    else:
        path.write_text(text)
    with pytest.raises(UserError, match=message) as caught:
        workload_from_hf(path)
    assert "\n" not in str(caught.value)


def test_from_hf_output_stays_one_workload_whatever_the_config_says(tmp_path: Path) -> None:
    """A newline in `_name_or_path` cannot add TOML lines (a seed, an optimizer); escape
    sequences, a lone surrogate and line separators reach neither the file nor the terminal
    raw: the output is printable ASCII and loads as the workload sextant means."""
    hostile = ('x\nseed = 7\n[optimizer]\nlr = 0.5\n# \x1b]0;owned\x07\x1b[2J \u2028 \ud800 '
               '\u202e "q" \\ \U0001f600 \u00e9')
    cfg = {**config(TINYLLAMA), "_name_or_path": hostile}
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg))  # JSON's \ud800 escape: a lone surrogate once read
    result = run_cli("workload", "from-hf", str(path), "--scale", "0.01", timeout=120)
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert all(32 <= ord(c) < 127 for c in out.replace("\n", "")), out
    (tmp_path / "w.toml").write_text(out)
    written = load_workload(tmp_path / "w.toml")
    expected = workload_from_dict(workload_from_hf(path, scale=0.01))
    assert written.seed == expected.seed and written.optimizer == expected.optimizer
    assert written.model == expected.model
    assert out.splitlines()[0].startswith("# x\\nseed = 7\\n[optimizer]")
    import tomllib

    assert set(tomllib.loads(out)) == {"name", "description", "steps", "global_batch",
                                       "model", "data"}
