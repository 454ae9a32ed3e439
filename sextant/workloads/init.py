"""Canonical parameters: names, shapes and seeded initial values, in numpy.

Every backend receives exactly these arrays and only maps them into its own layout (for
example PyTorch's Linear stores weights as (out, in), so it transposes). The canonical layout
of a dense layer is (in, out): y = x @ W + b.

GPT layout of the fused attention input projection `blocks.{i}.attn.qkv.weight`: shape
(d_model, 3 * d_model), columns [q | k | v]; within each, head h owns columns
[h * head_dim, (h + 1) * head_dim). `head.weight` is absent when the embeddings are tied.

Llama layout: separate `attn.q/k/v/o.weight` ((d_model, n_heads * head_dim) for q,
(d_model, n_kv_heads * head_dim) for k and v, head h at columns [h * head_dim, (h + 1) *
head_dim)), SwiGLU `mlp.gate/up.weight` (d_model, d_ff) and `mlp.down.weight` (d_ff, d_model),
RMSNorm `scale`s; `attn.q/k/v.bias` only with `qkv_bias` (Qwen2); `head.weight` is absent when the embeddings are tied (the head is
`wte` transposed).

Each array is drawn from its own generator keyed by (seed, name), so adding a parameter never
changes the values of the others.
"""

from __future__ import annotations

import hashlib
import math
import zlib

import numpy as np

from sextant.workloads.spec import FinetuneSpec, GPTSpec, LlamaSpec, MLPSpec, ModelSpec

INIT_STD = 0.02  # GPT-2 / nanoGPT convention


def param_shapes(model: ModelSpec) -> dict[str, tuple[int, ...]]:
    """Canonical names and shapes, in a fixed order (the order every backend iterates)."""
    shapes: dict[str, tuple[int, ...]] = {}
    if isinstance(model, MLPSpec):
        widths = [model.input_dim, *model.hidden, model.num_classes]
        for i, (fan_in, fan_out) in enumerate(zip(widths[:-1], widths[1:])):
            shapes[f"layers.{i}.weight"] = (fan_in, fan_out)
            shapes[f"layers.{i}.bias"] = (fan_out,)
        return shapes
    if isinstance(model, LlamaSpec):
        return _llama_shapes(model)
    d, f = model.d_model, model.d_ff
    shapes["wte"] = (model.vocab_size, d)
    shapes["wpe"] = (model.seq_len, d)
    for i in range(model.n_layers):
        p = f"blocks.{i}."
        shapes[p + "ln1.scale"] = (d,)
        shapes[p + "ln1.bias"] = (d,)
        shapes[p + "attn.qkv.weight"] = (d, 3 * d)
        shapes[p + "attn.qkv.bias"] = (3 * d,)
        shapes[p + "attn.proj.weight"] = (d, d)
        shapes[p + "attn.proj.bias"] = (d,)
        shapes[p + "ln2.scale"] = (d,)
        shapes[p + "ln2.bias"] = (d,)
        shapes[p + "mlp.fc.weight"] = (d, f)
        shapes[p + "mlp.fc.bias"] = (f,)
        shapes[p + "mlp.proj.weight"] = (f, d)
        shapes[p + "mlp.proj.bias"] = (d,)
    shapes["ln_f.scale"] = (d,)
    shapes["ln_f.bias"] = (d,)
    if not model.tie_embeddings:
        shapes["head.weight"] = (d, model.vocab_size)
    return shapes


def _llama_shapes(model: LlamaSpec) -> dict[str, tuple[int, ...]]:
    d, f, hd = model.d_model, model.d_ff, model.head_dim
    shapes: dict[str, tuple[int, ...]] = {"wte": (model.vocab_size, d)}
    for i in range(model.n_layers):
        p = f"blocks.{i}."
        shapes[p + "attn_norm.scale"] = (d,)
        for proj, heads in (("q", model.n_heads), ("k", model.n_kv_heads),
                            ("v", model.n_kv_heads)):
            shapes[p + f"attn.{proj}.weight"] = (d, heads * hd)
            if model.qkv_bias:
                shapes[p + f"attn.{proj}.bias"] = (heads * hd,)
        shapes[p + "attn.o.weight"] = (model.n_heads * hd, d)
        shapes[p + "mlp_norm.scale"] = (d,)
        shapes[p + "mlp.gate.weight"] = (d, f)
        shapes[p + "mlp.up.weight"] = (d, f)
        shapes[p + "mlp.down.weight"] = (f, d)
    shapes["norm_f.scale"] = (d,)
    if not model.tie_embeddings:
        shapes["head.weight"] = (d, model.vocab_size)
    return shapes


LLAMA_TARGET_MODULES = {t: f"{'mlp' if t in ('gate', 'up', 'down') else 'attn'}.{t}"
                        for t in ("q", "k", "v", "o", "gate", "up", "down")}
GPT_TARGET_MODULES = {"qkv": "attn.qkv", "o": "attn.proj", "up": "mlp.fc", "down": "mlp.proj"}
"""finetune.targets -> the canonical module each adapts, per family."""


def adapter_shapes(model: ModelSpec, finetune: FinetuneSpec) -> dict[str, tuple[int, ...]]:
    """LoRA's adapters, after the base parameters in the canonical order: for each block and
    target projection `P` (canonical weight (in, out)), `P.lora_a` (in, rank) and `P.lora_b`
    (rank, out). Empty unless finetune.method is 'lora'."""
    if not finetune.lora or isinstance(model, MLPSpec):
        return {}
    base = param_shapes(model)
    module = (GPT_TARGET_MODULES if isinstance(model, GPTSpec) else LLAMA_TARGET_MODULES)
    shapes: dict[str, tuple[int, ...]] = {}
    for i in range(model.n_layers):
        for target in finetune.targets:
            prefix = f"blocks.{i}.{module[target]}."
            fan_in, fan_out = base[prefix + "weight"]
            shapes[prefix + "lora_a"] = (fan_in, finetune.rank)
            shapes[prefix + "lora_b"] = (finetune.rank, fan_out)
    return shapes


def init_adapters(model: ModelSpec, finetune: FinetuneSpec, seed: int
                  ) -> dict[str, np.ndarray]:
    """LoRA's initial adapters: A uniform in +-1/sqrt(in), PEFT's (torch's kaiming_uniform
    with a = sqrt(5) on its (rank, in) matrix), drawn from each name's own generator as every
    canonical array is; B = 0, so the adapted model starts as the base model."""
    out: dict[str, np.ndarray] = {}
    for name, shape in adapter_shapes(model, finetune).items():
        if name.endswith(".lora_b"):
            out[name] = np.zeros(shape, np.float32)
        else:
            rng = np.random.default_rng([seed, zlib.crc32(name.encode())])
            bound = 1.0 / math.sqrt(shape[0])
            out[name] = rng.uniform(-bound, bound, shape).astype(np.float32)
    return out


def is_adapter(name: str) -> bool:
    return name.endswith((".lora_a", ".lora_b"))


def _std(model: ModelSpec, name: str, shape: tuple[int, ...]) -> float:
    if isinstance(model, MLPSpec):
        return math.sqrt(2.0 / shape[0])  # He init for ReLU
    if name.endswith(("attn.proj.weight", "mlp.proj.weight", "attn.o.weight",
                      "mlp.down.weight")):
        # GPT-2: residual projections scaled by 1/sqrt(2 * n_layers).
        return INIT_STD / math.sqrt(2 * model.n_layers)
    return INIT_STD


def init_params(model: ModelSpec, seed: int) -> dict[str, np.ndarray]:
    """Initial float32 parameters, identical for every framework and worker count."""
    params: dict[str, np.ndarray] = {}
    for name, shape in param_shapes(model).items():
        if name.endswith(".scale"):
            params[name] = np.ones(shape, np.float32)
        elif name.endswith(".bias"):
            params[name] = np.zeros(shape, np.float32)
        else:
            rng = np.random.default_rng([seed, zlib.crc32(name.encode())])
            params[name] = rng.standard_normal(shape, dtype=np.float32) * np.float32(
                _std(model, name, shape)
            )
    return params


def decays(name: str, shape: tuple[int, ...]) -> bool:
    """Weight decay applies to matrices (embeddings included), not to biases or norms."""
    return len(shape) >= 2


def count_params(model: ModelSpec) -> int:
    return sum(math.prod(s) for s in param_shapes(model).values())


def matmul_params(model: ModelSpec) -> int:
    """Parameters that take part in a matrix multiply (embedding lookups do not; a tied
    head counts, once, as the matrix multiply it is)."""
    tied_head = 0
    if not isinstance(model, MLPSpec) and getattr(model, "tie_embeddings", False):
        tied_head = model.vocab_size * model.d_model
    return tied_head + sum(
        math.prod(s)
        for n, s in param_shapes(model).items()
        if n not in ("wte", "wpe")
    )


def flops_per_step(model: ModelSpec, global_batch: int) -> int:
    """Training FLOPs of one optimizer step (forward + backward), by the PaLM formula.

    6 * N per token for the matrix multiplies (2 forward, 4 backward; N excludes embedding
    lookups), plus 12 * n_layers * d_model * seq_len per token for attention scores and their
    product with the values (Chowdhery et al. 2022, appendix B; the causal mask is not
    discounted, as in that formula). For the MLP, one sample counts as one token.
    """
    if isinstance(model, (GPTSpec, LlamaSpec)):
        tokens = global_batch * model.seq_len
        attention = 12 * model.n_layers * model.d_model * model.seq_len
        return tokens * (6 * matmul_params(model) + attention)
    return 6 * matmul_params(model) * global_batch


def params_digest(params: dict[str, np.ndarray]) -> str:
    """sha256 over (name, float32 bytes) in canonical order: equal digests mean bit-identical
    parameters, whichever framework produced them."""
    digest = hashlib.sha256()
    for name, value in params.items():
        digest.update(name.encode())
        digest.update(np.ascontiguousarray(value, dtype=np.float32).tobytes())
    return digest.hexdigest()


def rope_tables(model: LlamaSpec) -> tuple[np.ndarray, np.ndarray]:
    """The rotary embedding's (cos, sin), float32 (seq_len, head_dim), computed in float64
    once so that every backend turns by exactly the same angles.

    Rotate-half form: pair i of a head is (x[i], x[i + head_dim/2]), turned by position *
    rope_theta^(-2i/head_dim); rotated = x * cos + rotate_half(x) * sin with
    rotate_half(x) = [-x2, x1], so both halves of the tables repeat the same angles.
    """
    half = model.head_dim // 2
    inv_freq = model.rope_theta ** (-np.arange(half, dtype=np.float64) * 2 / model.head_dim)
    angles = np.arange(model.seq_len, dtype=np.float64)[:, None] * inv_freq[None, :]
    angles = np.concatenate([angles, angles], axis=-1)
    return np.cos(angles).astype(np.float32), np.sin(angles).astype(np.float32)
