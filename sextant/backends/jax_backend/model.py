"""The canonical models as pure JAX functions of the canonical parameter dict.

The canonical layout is already JAX's (dense weights (in, out)), so parameters are used as
they are: no mapping at all.

Mixed precision follows sextant's one policy (sextant.strategy.PRECISIONS), the one torch's
autocast applies: the parameters stay fp32 (master weights); every matmul and the attention
take `Numerics.compute` operands (bf16), so their outputs are bf16; the embeddings, the
residual stream, the norms and the loss stay fp32. In fp32 every cast below is the identity,
which XLA removes.
"""

from __future__ import annotations

import functools
import math
from typing import Any

from dataclasses import dataclass

import jax
import jax.numpy as jnp

from sextant.workloads.init import rope_tables
from sextant.workloads.spec import IGNORE_TARGET, GPTSpec, LlamaSpec, MLPSpec, ModelSpec

LAYER_NORM_EPS = 1e-5
Params = dict[str, jax.Array]


@dataclass(frozen=True, slots=True)
class Numerics:
    """How the model computes: the matmul/attention operand dtype, and which fused attention
    kernel jax.nn.dot_product_attention runs (None: XLA's own; 'cudnn': cuDNN's flash
    attention, on GPUs for bf16/fp16)."""

    compute: Any = jnp.float32
    attention: str | None = None
    lora_scale: float = 1.0
    """LoRA's alpha / rank, for the projections whose parameters hold an adapter."""


FP32 = Numerics()


def _mm(x: jax.Array, w: jax.Array, nx: Numerics) -> jax.Array:
    """x @ w with both operands in the compute dtype (the output is in it too)."""
    return x.astype(nx.compute) @ w.astype(nx.compute)


def _dense(x: jax.Array, w: jax.Array, b: jax.Array, nx: Numerics) -> jax.Array:
    return _mm(x, w, nx) + b.astype(nx.compute)


def _attention(q: jax.Array, k: jax.Array, v: jax.Array, scale: float, nx: Numerics
               ) -> jax.Array:  # (B, T, H, hs) -> same
    return jax.nn.dot_product_attention(q, k, v, is_causal=True, scale=scale,
                                        implementation=nx.attention)


def _layer_norm(x: jax.Array, scale: jax.Array, bias: jax.Array) -> jax.Array:
    x = x.astype(jnp.float32)  # norms run in fp32 under mixed precision (autocast's list)
    mean = x.mean(-1, keepdims=True)
    # Biased, as torch.nn.LayerNorm. The variance's gradient through the mean is zero (the
    # deviations sum to zero), so it is stopped: the same values and gradients without a
    # backward path XLA otherwise runs (8 % of a small GPT's step at one thread; see
    # docs/benchmarks.md, "JAX and TensorFlow at one thread").
    var = jnp.square(x - jax.lax.stop_gradient(mean)).mean(-1, keepdims=True)
    return (x - mean) * jax.lax.rsqrt(var + LAYER_NORM_EPS) * scale + bias


def mlp_logits(spec: MLPSpec, p: Params, x: jax.Array, nx: Numerics = FP32
               ) -> jax.Array:  # (B, in) -> (B, classes)
    n = len(spec.hidden) + 1
    for i in range(n):
        x = _dense(x, p[f"layers.{i}.weight"], p[f"layers.{i}.bias"], nx)
        if i < n - 1:
            x = jax.nn.relu(x)
    return x


def gpt_block(spec: GPTSpec, bp: Params, x: jax.Array, nx: Numerics = FP32
              ) -> jax.Array:  # (B, T, C) -> same
    """One transformer block; `bp` holds its parameters without the 'blocks.{i}.' prefix."""
    B, T, C = x.shape
    H = spec.n_heads
    h = _layer_norm(x, bp["ln1.scale"], bp["ln1.bias"])
    qkv = _linear(h, bp, "attn.qkv", nx)  # (B, T, 3C)
    q, k, v = (t.reshape(B, T, H, C // H) for t in jnp.split(qkv, 3, axis=-1))
    y = _attention(q, k, v, 1.0 / math.sqrt(C // H), nx)  # (B, T, H, hs)
    x = x + _linear(y.reshape(B, T, C), bp, "attn.proj", nx)
    h = _layer_norm(x, bp["ln2.scale"], bp["ln2.bias"])
    h = jax.nn.gelu(_linear(h, bp, "mlp.fc", nx), approximate=True)
    return x + _linear(h, bp, "mlp.proj", nx)


def gpt_logits(spec: GPTSpec, p: Params, idx: jax.Array, remat: bool = False,
               nx: Numerics = FP32) -> jax.Array:  # (B, T) -> (B, T, V)
    """`remat`: each block under jax.checkpoint (activation checkpointing: its activations
    are recomputed in the backward pass instead of kept)."""
    T = idx.shape[1]
    block = functools.partial(gpt_block, spec, nx=nx)
    if remat:
        block = jax.checkpoint(block)
    x = p["wte"][idx] + p["wpe"][:T]
    for i in range(spec.n_layers):
        x = block(block_params(p, i), x)
    head = p["wte"].T if spec.tie_embeddings else p["head.weight"]
    return _mm(_layer_norm(x, p["ln_f.scale"], p["ln_f.bias"]), head, nx)


def rms_norm(x: jax.Array, scale: jax.Array, eps: float) -> jax.Array:
    x = x.astype(jnp.float32)
    return x * jax.lax.rsqrt(jnp.mean(jnp.square(x), -1, keepdims=True) + eps) * scale


def rotate(x: jax.Array, cos: jax.Array, sin: jax.Array) -> jax.Array:
    """Rotary embedding, rotate-half form: x (B, T, heads, hd), cos/sin (T, 1, hd)."""
    x1, x2 = jnp.split(x, 2, axis=-1)
    return x * cos + jnp.concatenate([-x2, x1], axis=-1) * sin


@functools.lru_cache(maxsize=None)
def megatron_ops(axis: str) -> tuple[Any, Any]:
    """Megatron-LM's conjugate operators over mesh axis `axis` (inside shard_map):
    f = identity forward, all-reduce (psum) of the input gradient backward, placed before a
    column-parallel matmul; g = all-reduce forward, identity backward, after a row-parallel
    one. Two all-reduces per block in forward and two in backward, all written here."""

    @jax.custom_vjp
    def f(x: jax.Array) -> jax.Array:
        return x

    f.defvjp(lambda x: (x, None), lambda _, g: (psum(g, axis),))

    def reduce(x: jax.Array) -> jax.Array:
        # The test hook SEXTANT_TEST_FAULT=skip-tp-allreduce drops g's all-reduce: each shard
        # then keeps its partial sum, and the parity tests must fail.
        return x if "skip-tp-allreduce" in TEST_FAULTS else psum(x, axis)

    @jax.custom_vjp
    def g(x: jax.Array) -> jax.Array:
        return reduce(x)

    g.defvjp(lambda x: (reduce(x), None), lambda _, t: (t,))
    return f, g


TEST_FAULTS: set[str] = set()
"""SEXTANT_TEST_FAULT's entries, set by the worker before tracing (see megatron_ops), and
NO_COLLECTIVES while the timing-only step without tensor-parallel collectives is traced."""
NO_COLLECTIVES = "no-tp-collectives"


def psum(x: jax.Array, axis: str) -> jax.Array:
    return x if NO_COLLECTIVES in TEST_FAULTS else jax.lax.psum(x, axis)


def all_gather(x: jax.Array, axis: str) -> jax.Array:
    """Tiled all-gather along the last axis (or, untimed stand-in, the shard repeated)."""
    if NO_COLLECTIVES in TEST_FAULTS:
        return jnp.concatenate([x] * jax.lax.psum(1, axis), axis=-1)
    return jax.lax.all_gather(x, axis, axis=x.ndim - 1, tiled=True)


def llama_block(spec: LlamaSpec, bp: Params, x: jax.Array, cos: jax.Array, sin: jax.Array,
                tp_axis: str | None = None, nx: Numerics = FP32
                ) -> jax.Array:  # (B, T, C) -> same
    """One Llama block; head counts come from the weights' widths (`-1`), so a shard that
    holds a subset of the heads runs the same code. `tp_axis`: this is one tensor-parallel
    shard inside shard_map, with Megatron's f/g operators around its two halves."""
    f, g = megatron_ops(tp_axis) if tp_axis else (_identity, _identity)
    B, T, _ = x.shape
    hd = spec.head_dim
    h = f(rms_norm(x, bp["attn_norm.scale"], spec.norm_eps))
    # RoPE against the fp32 tables, its result cast for the attention (autocast does the
    # same: the product promotes to fp32, scaled_dot_product_attention casts it back).
    q = rotate(_linear(h, bp, "attn.q", nx).reshape(B, T, -1, hd), cos, sin).astype(nx.compute)
    k = rotate(_linear(h, bp, "attn.k", nx).reshape(B, T, -1, hd), cos, sin).astype(nx.compute)
    v = _linear(h, bp, "attn.v", nx).reshape(B, T, -1, hd)
    y = _attention(q, k, v, 1.0 / math.sqrt(hd), nx)  # GQA: K, V heads broadcast
    x = x + g(_linear(y.reshape(B, T, -1), bp, "attn.o", nx))
    h = f(rms_norm(x, bp["mlp_norm.scale"], spec.norm_eps))
    gated = jax.nn.silu(_linear(h, bp, "mlp.gate", nx)) * _linear(h, bp, "mlp.up", nx)
    return x + g(_linear(gated, bp, "mlp.down", nx))


def _linear(h: jax.Array, bp: Params, name: str, nx: Numerics) -> jax.Array:
    """A projection: h W, plus its bias where the model has one (gpt's, Qwen2's q, k, v),
    plus its LoRA adapter where the parameters hold one: (h A) B * alpha / rank, computed
    low-rank, so the frozen W's gradient is never formed."""
    bias = bp.get(f"{name}.bias")
    w = bp[f"{name}.weight"]
    y = _mm(h, w, nx) if bias is None else _dense(h, w, bias, nx)
    if f"{name}.lora_a" in bp:
        y = y + _mm(_mm(h, bp[f"{name}.lora_a"], nx), bp[f"{name}.lora_b"], nx) * nx.lora_scale
    return y


def _identity(x: jax.Array) -> jax.Array:
    return x


def block_params(p: Params, i: int) -> Params:
    prefix = f"blocks.{i}."
    return {k[len(prefix):]: v for k, v in p.items() if k.startswith(prefix)}


def llama_logits(spec: LlamaSpec, p: Params, idx: jax.Array, remat: bool = False,
                 tp_axis: str | None = None, nx: Numerics = FP32
                 ) -> jax.Array:  # (B, T) -> (B, T, V)
    T = idx.shape[1]
    cos, sin = (jnp.asarray(t)[:T, None, :] for t in rope_tables(spec))
    block = functools.partial(llama_block, spec, tp_axis=tp_axis, nx=nx)
    if remat:
        block = jax.checkpoint(block)
    if tp_axis:  # the embedding and the head split over the vocabulary, Megatron-style
        x = vocab_parallel_embed(p["wte"], idx, tp_axis)
    else:
        x = p["wte"][idx]
    for i in range(spec.n_layers):
        x = block(block_params(p, i), x, cos, sin)
    x = rms_norm(x, p["norm_f.scale"], spec.norm_eps)
    if tp_axis:
        f, _ = megatron_ops(tp_axis)
        head = p["wte"].T if spec.tie_embeddings else p["head.weight"]
        return gather_vocab(tp_axis)(_mm(f(x), head, nx))
    return _mm(x, p["wte"].T if spec.tie_embeddings else p["head.weight"], nx)


def vocab_parallel_embed(table: jax.Array, idx: jax.Array, axis: str) -> jax.Array:
    """Megatron's VocabParallelEmbedding: this shard holds rows [r*Vl, (r+1)*Vl) of the
    table; tokens outside them look up zeros, and g's all-reduce sums the shards' rows."""
    rows = table.shape[0]
    local = idx - jax.lax.axis_index(axis) * rows
    inside = (local >= 0) & (local < rows)
    x = jnp.where(inside[..., None], table[jnp.clip(local, 0, rows - 1)], 0.0)
    return megatron_ops(axis)[1](x)


@functools.lru_cache(maxsize=None)
def gather_vocab(axis: str) -> Any:
    """The column-parallel head's logits joined along the vocabulary: all-gather forward,
    this shard's slice of the gradient backward (every shard computes the same loss)."""

    @jax.custom_vjp
    def gather(x: jax.Array) -> jax.Array:
        return all_gather(x, axis)

    def backward(width: int, t: jax.Array) -> tuple[jax.Array]:
        start = jax.lax.axis_index(axis) * width
        return (jax.lax.dynamic_slice_in_dim(t, start, width, axis=t.ndim - 1),)

    gather.defvjp(lambda x: (gather(x), x.shape[-1]), backward)
    return gather


def model_logits(spec: ModelSpec, p: Params, x: jax.Array, remat: bool = False,
                 tp_axis: str | None = None, nx: Numerics = FP32) -> jax.Array:
    """The model's logits: (B, classes) for the MLP, (B, T, V) for the decoders."""
    if isinstance(spec, MLPSpec):
        return mlp_logits(spec, p, x, nx)
    if isinstance(spec, LlamaSpec):
        return llama_logits(spec, p, x, remat, tp_axis, nx)
    return gpt_logits(spec, p, x, remat, nx)


def loss_fn(spec: ModelSpec, p: Params, x: jax.Array, y: jax.Array,
            remat: bool = False, tp_axis: str | None = None, nx: Numerics = FP32
            ) -> jax.Array:
    """Mean softmax cross-entropy over every target in the batch, in fp32 whatever the
    compute dtype (`remat`: see gpt_logits; `tp_axis`: see llama_block)."""
    logits = model_logits(spec, p, x, remat, tp_axis, nx)
    logits = logits.reshape(-1, logits.shape[-1])
    if "loss-in-compute-dtype" not in TEST_FAULTS:  # the broken twin keeps bf16 logits
        logits = logits.astype(jnp.float32)
    logz = jax.nn.logsumexp(logits, axis=-1)
    if y.ndim == 1:  # the MLP's class labels: nothing is ever left out
        picked = jnp.take_along_axis(logits, y.reshape(-1, 1), axis=-1)[:, 0]
        return jnp.mean(logz - picked)
    # Tokens: the mean over the targets that are not IGNORE_TARGET (instruction data's prompt
    # and padding), as torch's cross_entropy computes it; with none left out it is the plain
    # mean, bit for bit (a sum divided by the count).
    y = y.reshape(-1)
    kept = y != IGNORE_TARGET
    picked = jnp.take_along_axis(logits, jnp.where(kept, y, 0)[:, None], axis=-1)[:, 0]
    return jnp.sum(jnp.where(kept, logz - picked, 0.0)) / jnp.sum(kept.astype(jnp.float32))
