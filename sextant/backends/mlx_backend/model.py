"""The canonical models as MLX functions of the canonical parameters.

The parameters are MLX's own kind of tree: `mlx.utils.tree_unflatten` of the canonical
(name, array) pairs, so `blocks.0.attn.qkv.weight` is `p["blocks"][0]["attn"]["qkv"]["weight"]`
and `tree_flatten` gives the canonical names back (the names MLX's optimizers and
`nn.average_gradients` see). Dense weights keep the canonical (in, out) layout: `x @ w`.
Attention is `mx.fast.scaled_dot_product_attention` with the causal mask, on (B, heads, T, hd).
"""

from __future__ import annotations

import math
from typing import Any

import mlx.core as mx
import numpy as np

from sextant.workloads.init import rope_tables
from sextant.workloads.spec import IGNORE_TARGET, GPTSpec, LlamaSpec, MLPSpec, ModelSpec

LAYER_NORM_EPS = 1e-5
Tree = Any  # nested dicts and lists of mx.array, as mlx.utils.tree_unflatten makes them


def to_tree(params: dict[str, np.ndarray]) -> Tree:
    """Canonical float32 arrays -> MLX's parameter tree."""
    from mlx.utils import tree_unflatten

    return tree_unflatten([(name, mx.array(value)) for name, value in params.items()])


def to_canonical(tree: Tree) -> dict[str, np.ndarray]:
    from mlx.utils import tree_flatten

    return {name: np.array(value.astype(mx.float32)) for name, value in tree_flatten(tree)}


def _layer_norm(x: mx.array, p: Tree) -> mx.array:
    # mx.fast.layer_norm: biased variance, as torch.nn.LayerNorm.
    return mx.fast.layer_norm(x, p["scale"], p["bias"], LAYER_NORM_EPS)


def mlp_logits(spec: MLPSpec, p: Tree, x: mx.array) -> mx.array:  # (B, in) -> (B, classes)
    layers = p["layers"]
    for i, layer in enumerate(layers):
        x = x @ layer["weight"] + layer["bias"]
        if i < len(layers) - 1:
            x = mx.maximum(x, 0)
    return x


def _attention(q: mx.array, k: mx.array, v: mx.array) -> mx.array:
    """(B, T, heads, hd) in, (B, T, heads * hd) out; grouped K/V heads are broadcast."""
    B, T, _, hd = q.shape
    q, k, v = (t.transpose(0, 2, 1, 3) for t in (q, k, v))
    y = mx.fast.scaled_dot_product_attention(q, k, v, scale=1.0 / math.sqrt(hd),
                                             mask="causal")
    return y.transpose(0, 2, 1, 3).reshape(B, T, -1)


def _gelu_tanh(x: mx.array) -> mx.array:
    return 0.5 * x * (1 + mx.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x ** 3)))


def gpt_block(spec: GPTSpec, bp: Tree, x: mx.array, lora_scale: float = 1.0
              ) -> mx.array:  # (B, T, C) -> same
    B, T, C = x.shape
    H = spec.n_heads
    h = _layer_norm(x, bp["ln1"])
    qkv = _proj(h, bp["attn"]["qkv"], lora_scale)
    q, k, v = (t.reshape(B, T, H, C // H) for t in mx.split(qkv, 3, axis=-1))
    x = x + _proj(_attention(q, k, v), bp["attn"]["proj"], lora_scale)
    h = _layer_norm(x, bp["ln2"])
    h = _gelu_tanh(_proj(h, bp["mlp"]["fc"], lora_scale))
    return x + _proj(h, bp["mlp"]["proj"], lora_scale)


def gpt_logits(spec: GPTSpec, p: Tree, idx: mx.array, lora_scale: float = 1.0
               ) -> mx.array:  # (B, T) -> (B, T, V)
    T = idx.shape[1]
    x = p["wte"][idx] + p["wpe"][:T]
    for bp in p["blocks"]:
        x = gpt_block(spec, bp, x, lora_scale)
    return _layer_norm(x, p["ln_f"]) @ (p["wte"].T if spec.tie_embeddings
                                        else p["head"]["weight"])


def _rotate(x: mx.array, cos: mx.array, sin: mx.array) -> mx.array:
    """Rotary embedding, rotate-half form: x (B, T, heads, hd), cos/sin (T, 1, hd)."""
    x1, x2 = mx.split(x, 2, axis=-1)
    return x * cos + mx.concatenate([-x2, x1], axis=-1) * sin


def _rms_norm(x: mx.array, scale: mx.array, eps: float) -> mx.array:
    return x * mx.rsqrt(mx.mean(mx.square(x), axis=-1, keepdims=True) + eps) * scale


def _proj(h: mx.array, p: Tree, lora_scale: float) -> mx.array:
    """A projection: h W, plus its bias where the model has one (gpt's, Qwen2's q, k, v),
    plus its LoRA adapter where the tree holds one: (h A) B * alpha / rank, low-rank."""
    y = h @ p["weight"] + p["bias"] if "bias" in p else h @ p["weight"]
    if "lora_a" in p:
        y = y + (h @ p["lora_a"]) @ p["lora_b"] * lora_scale
    return y


def llama_block(spec: LlamaSpec, bp: Tree, x: mx.array, cos: mx.array, sin: mx.array,
                lora_scale: float = 1.0) -> mx.array:
    B, T, _ = x.shape
    hd = spec.head_dim
    attn, mlp = bp["attn"], bp["mlp"]
    h = _rms_norm(x, bp["attn_norm"]["scale"], spec.norm_eps)
    q = _rotate(_proj(h, attn["q"], lora_scale).reshape(B, T, -1, hd), cos, sin)
    k = _rotate(_proj(h, attn["k"], lora_scale).reshape(B, T, -1, hd), cos, sin)
    v = _proj(h, attn["v"], lora_scale).reshape(B, T, -1, hd)
    x = x + _proj(_attention(q, k, v), attn["o"], lora_scale)
    h = _rms_norm(x, bp["mlp_norm"]["scale"], spec.norm_eps)
    gate = _proj(h, mlp["gate"], lora_scale)
    gated = gate * mx.sigmoid(gate) * _proj(h, mlp["up"], lora_scale)
    return x + _proj(gated, mlp["down"], lora_scale)


def llama_logits(spec: LlamaSpec, p: Tree, idx: mx.array, lora_scale: float = 1.0
                 ) -> mx.array:
    T = idx.shape[1]
    cos, sin = (mx.array(t[:T, None, :]) for t in rope_tables(spec))
    x = p["wte"][idx]
    for bp in p["blocks"]:
        x = llama_block(spec, bp, x, cos, sin, lora_scale)
    x = _rms_norm(x, p["norm_f"]["scale"], spec.norm_eps)
    return x @ (p["wte"].T if spec.tie_embeddings else p["head"]["weight"])


def model_logits(spec: ModelSpec, p: Tree, x: mx.array, lora_scale: float = 1.0
                 ) -> mx.array:
    """The model's logits: (B, classes) for the MLP, (B, T, V) for the decoders
    (`lora_scale`: LoRA's alpha / rank, where the tree holds adapters)."""
    if isinstance(spec, MLPSpec):
        return mlp_logits(spec, p, x)
    if isinstance(spec, LlamaSpec):
        return llama_logits(spec, p, x, lora_scale)
    return gpt_logits(spec, p, x, lora_scale)


def loss_fn(spec: ModelSpec, p: Tree, x: mx.array, y: mx.array, lora_scale: float = 1.0
            ) -> mx.array:
    """Mean softmax cross-entropy over every target in the batch."""
    logits = model_logits(spec, p, x, lora_scale)
    logits = logits.reshape(-1, logits.shape[-1]).astype(mx.float32)
    logz = mx.logsumexp(logits, axis=-1)
    if y.ndim == 1:  # the MLP's class labels: nothing is ever left out
        picked = mx.take_along_axis(logits, y.reshape(-1, 1), axis=-1)[:, 0]
        return mx.mean(logz - picked)
    # Tokens: the mean over the targets that are not IGNORE_TARGET (instruction data's prompt
    # and padding), as torch's cross_entropy computes it.
    y = y.reshape(-1)
    kept = y != IGNORE_TARGET
    picked = mx.take_along_axis(logits, mx.where(kept, y, 0).reshape(-1, 1), axis=-1)[:, 0]
    return mx.sum(mx.where(kept, logz - picked, 0.0)) / mx.sum(kept.astype(mx.float32))
