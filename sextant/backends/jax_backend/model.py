"""The canonical models as pure JAX functions of the canonical parameter dict.

The canonical layout is already JAX's (dense weights (in, out)), so parameters are used as
they are: no mapping at all.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp

from sextant.workload import GPTSpec, MLPSpec, ModelSpec

LAYER_NORM_EPS = 1e-5
Params = dict[str, jax.Array]


def _layer_norm(x: jax.Array, scale: jax.Array, bias: jax.Array) -> jax.Array:
    mean = x.mean(-1, keepdims=True)
    var = jnp.square(x - mean).mean(-1, keepdims=True)  # biased, as torch.nn.LayerNorm
    return (x - mean) * jax.lax.rsqrt(var + LAYER_NORM_EPS) * scale + bias


def mlp_logits(spec: MLPSpec, p: Params, x: jax.Array) -> jax.Array:  # (B, in) -> (B, classes)
    n = len(spec.hidden) + 1
    for i in range(n):
        x = x @ p[f"layers.{i}.weight"] + p[f"layers.{i}.bias"]
        if i < n - 1:
            x = jax.nn.relu(x)
    return x


def gpt_logits(spec: GPTSpec, p: Params, idx: jax.Array) -> jax.Array:  # (B, T) -> (B, T, V)
    B, T = idx.shape
    C, H = spec.d_model, spec.n_heads
    x = p["wte"][idx] + p["wpe"][:T]
    for i in range(spec.n_layers):
        b = f"blocks.{i}."
        h = _layer_norm(x, p[b + "ln1.scale"], p[b + "ln1.bias"])
        qkv = h @ p[b + "attn.qkv.weight"] + p[b + "attn.qkv.bias"]  # (B, T, 3C)
        q, k, v = (t.reshape(B, T, H, C // H) for t in jnp.split(qkv, 3, axis=-1))
        y = jax.nn.dot_product_attention(q, k, v, is_causal=True,
                                         scale=1.0 / math.sqrt(C // H))  # (B, T, H, hs)
        x = x + y.reshape(B, T, C) @ p[b + "attn.proj.weight"] + p[b + "attn.proj.bias"]
        h = _layer_norm(x, p[b + "ln2.scale"], p[b + "ln2.bias"])
        h = jax.nn.gelu(h @ p[b + "mlp.fc.weight"] + p[b + "mlp.fc.bias"], approximate=True)
        x = x + h @ p[b + "mlp.proj.weight"] + p[b + "mlp.proj.bias"]
    return _layer_norm(x, p["ln_f.scale"], p["ln_f.bias"]) @ p["head.weight"]


def loss_fn(spec: ModelSpec, p: Params, x: jax.Array, y: jax.Array) -> jax.Array:
    """Mean softmax cross-entropy over every target in the batch."""
    logits = mlp_logits(spec, p, x) if isinstance(spec, MLPSpec) else gpt_logits(spec, p, x)
    logits = logits.reshape(-1, logits.shape[-1])
    logz = jax.nn.logsumexp(logits, axis=-1)
    picked = jnp.take_along_axis(logits, y.reshape(-1, 1), axis=-1)[:, 0]
    return jnp.mean(logz - picked)
