"""The canonical models as pure TensorFlow functions of their parameters, and AdamW.

Parameters are raw tensors keyed by their canonical names, in the canonical layout: a dense
weight is (in, out) and is used as `x @ W + b`, which is TensorFlow's own convention, so the
canonical arrays are loaded as they are (no transposes, no re-initialisation, no Keras
layers whose initialisers would run first). The fused qkv projection keeps the canonical
column order [q | k | v], head h at columns h*hd:(h+1)*hd inside each.

`value_and_grad` is a pure function of (parameter tensors, batch), so the same code is
traced into a single-device step, into each replica of a distribution strategy, or into a
function scheduled on a parameter-server worker.

Mixed precision (`dtype=tf.bfloat16`) is sextant's one policy (torch autocast's): the
matmul weights get bf16 copies inside the gradient tape, every matmul casts its input to its
weight's dtype, so matmul and attention outputs are bf16; the embeddings, the residual
stream, the norms and the loss stay fp32. The gradients arrive in fp32 through the casts'
gradients and the optimizer updates the fp32 masters.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np
import tensorflow as tf

from sextant.workloads.init import decays, rope_tables
from sextant.workloads.spec import (
    IGNORE_TARGET,
    GPTSpec,
    LlamaSpec,
    MLPSpec,
    ModelSpec,
    OptimizerSpec,
)

LAYER_NORM_EPS = 1e-5


def _dense(x: tf.Tensor, w: tf.Tensor, b: tf.Tensor | None = None) -> tf.Tensor:
    y = tf.matmul(tf.cast(x, w.dtype), w)  # in the weight's (compute) dtype
    return y if b is None else y + tf.cast(b, y.dtype)


def _attention(q: tf.Tensor, k: tf.Tensor, v: tf.Tensor, causal: tf.Tensor, scale: float
               ) -> tf.Tensor:  # (B, nh, T, hd) -> same
    """Causal attention with the scores and softmax in fp32 and the probabilities cast back
    to the operands' dtype for the product with the values: what fused attention kernels
    (cuDNN, flash, torch's and JAX's) compute under mixed precision."""
    att = tf.matmul(tf.cast(q, tf.float32), tf.cast(k, tf.float32), transpose_b=True) * scale
    att = tf.nn.softmax(tf.where(causal, att, tf.constant(-np.inf, tf.float32)), axis=-1)
    return tf.matmul(tf.cast(att, v.dtype), v)


def _opmath(fn: Any, x: tf.Tensor) -> tf.Tensor:
    """An activation computed in fp32 and rounded once to x's dtype, as torch's kernels do
    for 16-bit inputs (a composite like tanh-GELU would otherwise round at every step)."""
    return tf.cast(fn(tf.cast(x, tf.float32)), x.dtype)


def _add(x: tf.Tensor, y: tf.Tensor) -> tf.Tensor:
    """The residual stream stays fp32 under mixed precision."""
    return x + tf.cast(y, x.dtype)


def _layer_norm(x: tf.Tensor, scale: tf.Tensor, bias: tf.Tensor) -> tf.Tensor:
    # Biased variance over the last axis, eps inside the root: torch.nn.LayerNorm. The
    # variance's gradient through the mean is zero (the deviations sum to zero), so it is
    # stopped, as tf.nn.moments does: the same values and gradients, without a backward path
    # that XLA otherwise builds and runs (9 % of a small GPT's step at one thread; see
    # docs/benchmarks.md, "JAX and TensorFlow at one thread").
    x = tf.cast(x, tf.float32)  # norms in fp32 under mixed precision
    mean = tf.reduce_mean(x, axis=-1, keepdims=True)
    var = tf.reduce_mean(tf.math.squared_difference(x, tf.stop_gradient(mean)), axis=-1,
                         keepdims=True)
    return (x - mean) * tf.math.rsqrt(var + LAYER_NORM_EPS) * scale + bias


def _seq(idx: tf.Tensor) -> tuple[Any, tf.Tensor]:
    """The sequence length (static where traced with one, as in training; a tensor in a
    serving signature of any length) and the causal mask of that length."""
    T = idx.shape[1]
    if T is not None:
        return T, tf.constant(np.tril(np.ones((T, T), dtype=bool)))
    T = tf.shape(idx)[1]
    return T, tf.cast(tf.linalg.band_part(tf.ones((T, T)), -1, 0), tf.bool)


def _mlp_logits(spec: MLPSpec, p: dict[str, tf.Tensor], x: tf.Tensor) -> tf.Tensor:
    n = len(spec.hidden) + 1
    for i in range(n):
        x = _dense(x, p[f"layers.{i}.weight"], p[f"layers.{i}.bias"])
        if i < n - 1:
            x = tf.nn.relu(x)
    return x


def _gpt_logits(spec: GPTSpec, p: dict[str, tf.Tensor], idx: tf.Tensor,
                lora_scale: float = 1.0) -> tf.Tensor:
    """(B, T) int token ids -> (B*T, V) logits. Dense layers work on (B*T, C) rows."""
    B, (T, causal) = tf.shape(idx)[0], _seq(idx)
    C, nh, hd = spec.d_model, spec.n_heads, spec.head_dim
    x = tf.gather(p["wte"], idx) + p["wpe"][:T]  # (B, T, C)
    x = tf.reshape(x, (-1, C))
    scale = 1.0 / math.sqrt(hd)

    def heads(t: tf.Tensor) -> tf.Tensor:  # (B*T, C) -> (B, nh, T, hd)
        return tf.transpose(tf.reshape(t, (B, T, nh, hd)), (0, 2, 1, 3))

    for i in range(spec.n_layers):
        b = f"blocks.{i}."
        h = _layer_norm(x, p[b + "ln1.scale"], p[b + "ln1.bias"])
        q, k, v = tf.split(_linear(h, p, b + "attn.qkv", lora_scale), 3, axis=-1)
        q, k, v = heads(q), heads(k), heads(v)
        y = tf.reshape(tf.transpose(_attention(q, k, v, causal, scale), (0, 2, 1, 3)), (-1, C))
        x = _add(x, _linear(y, p, b + "attn.proj", lora_scale))
        h = _layer_norm(x, p[b + "ln2.scale"], p[b + "ln2.bias"])
        h = _opmath(lambda a: tf.nn.gelu(a, approximate=True),
                    _linear(h, p, b + "mlp.fc", lora_scale))
        x = _add(x, _linear(h, p, b + "mlp.proj", lora_scale))
    x = _layer_norm(x, p["ln_f.scale"], p["ln_f.bias"])
    return _head(spec, p, x)


def _head(spec: GPTSpec | LlamaSpec, p: dict[str, tf.Tensor], x: tf.Tensor) -> tf.Tensor:
    """The output head, or with tied embeddings the embedding transposed (in the compute
    dtype of the matmul weights, as the untied head would be)."""
    if spec.tie_embeddings:
        compute = p["blocks.0.mlp.fc.weight" if isinstance(spec, GPTSpec)
                    else "blocks.0.attn.q.weight"].dtype if spec.n_layers else x.dtype
        return tf.matmul(tf.cast(x, compute), tf.cast(p["wte"], compute), transpose_b=True)
    return _dense(x, p["head.weight"])


def _rms_norm(x: tf.Tensor, scale: tf.Tensor, eps: float) -> tf.Tensor:
    x = tf.cast(x, tf.float32)
    return x * tf.math.rsqrt(tf.reduce_mean(tf.square(x), axis=-1, keepdims=True) + eps) * scale


def _linear(h: tf.Tensor, p: dict[str, tf.Tensor], name: str, lora_scale: float) -> tf.Tensor:
    """A projection: h W, plus its bias where the model has one (gpt's, Qwen2's q, k, v),
    plus its LoRA adapter where the parameters hold one: (h A) B * alpha / rank, computed
    low-rank, so the frozen W's gradient is never formed."""
    y = _dense(h, p[name + ".weight"], p.get(name + ".bias"))
    if name + ".lora_a" in p:
        y = y + _dense(_dense(h, p[name + ".lora_a"]), p[name + ".lora_b"]) * lora_scale
    return y


def _llama_logits(spec: LlamaSpec, p: dict[str, tf.Tensor], idx: tf.Tensor,
                  lora_scale: float = 1.0) -> tf.Tensor:
    """(B, T) int token ids -> (B*T, V) logits: RMSNorm, rotary, grouped-query attention
    (each key/value head repeated for its group of query heads), SwiGLU."""
    B, (T, causal) = tf.shape(idx)[0], _seq(idx)
    C, nh, nkv, hd = spec.d_model, spec.n_heads, spec.n_kv_heads, spec.head_dim
    x = tf.reshape(tf.gather(p["wte"], idx), (-1, C))  # (B*T, C)
    compute = p["blocks.0.attn.q.weight"].dtype if spec.n_layers else x.dtype
    cos, sin = (tf.constant(t[:, None, :], tf.float32)[:T] for t in rope_tables(spec))
    scale = 1.0 / math.sqrt(hd)

    def heads(t: tf.Tensor, n: int, rotary: bool) -> tf.Tensor:  # (B*T, n*hd) -> (B, nh, T, hd)
        t = tf.reshape(t, (B, T, n, hd))
        if rotary:  # against the fp32 tables, cast back for the attention (as autocast)
            t1, t2 = tf.split(tf.cast(t, tf.float32), 2, axis=-1)
            t = tf.cast(tf.cast(t, tf.float32) * cos + tf.concat([-t2, t1], axis=-1) * sin,
                        compute)
        if n != nh:
            t = tf.repeat(t, nh // n, axis=2)  # query head j reads key/value head j // group
        return tf.transpose(t, (0, 2, 1, 3))

    for i in range(spec.n_layers):
        b = f"blocks.{i}."
        h = _rms_norm(x, p[b + "attn_norm.scale"], spec.norm_eps)
        q = heads(_linear(h, p, b + "attn.q", lora_scale), nh, True)
        k = heads(_linear(h, p, b + "attn.k", lora_scale), nkv, True)
        v = heads(_linear(h, p, b + "attn.v", lora_scale), nkv, False)
        y = tf.reshape(tf.transpose(_attention(q, k, v, causal, scale), (0, 2, 1, 3)), (-1, C))
        x = _add(x, _linear(y, p, b + "attn.o", lora_scale))
        h = _rms_norm(x, p[b + "mlp_norm.scale"], spec.norm_eps)
        gated = _opmath(tf.nn.silu, _linear(h, p, b + "mlp.gate", lora_scale)) * _linear(
            h, p, b + "mlp.up", lora_scale)
        x = _add(x, _linear(gated, p, b + "mlp.down", lora_scale))
    x = _rms_norm(x, p["norm_f.scale"], spec.norm_eps)
    return _head(spec, p, x)


def logits(spec: ModelSpec, p: dict[str, tf.Tensor], x: tf.Tensor, lora_scale: float = 1.0
           ) -> tf.Tensor:
    """(B, classes) for the MLP; (B*T, V) rows for the decoders (`lora_scale`: LoRA's
    alpha / rank, where `p` holds adapters)."""
    if isinstance(spec, MLPSpec):
        return _mlp_logits(spec, p, x)
    if isinstance(spec, LlamaSpec):
        return _llama_logits(spec, p, x, lora_scale)
    return _gpt_logits(spec, p, x, lora_scale)


def loss_fn(spec: ModelSpec, p: dict[str, tf.Tensor], x: tf.Tensor, y: tf.Tensor,
            lora_scale: float = 1.0) -> tf.Tensor:
    """Mean softmax cross-entropy over every sample (MLP) or every token (GPT)."""
    logits_ = logits(spec, p, x, lora_scale)
    labels = tf.reshape(y, (-1,))
    logits_ = tf.cast(logits_, tf.float32)  # the loss in fp32 (a no-op in fp32)
    if y.shape.rank == 1:  # the MLP's class labels: nothing is ever left out
        return tf.reduce_mean(
            tf.nn.sparse_softmax_cross_entropy_with_logits(labels=labels, logits=logits_))
    # Tokens: the mean over the targets that are not IGNORE_TARGET (instruction data's prompt
    # and padding), as torch's cross_entropy computes it.
    kept = tf.not_equal(labels, IGNORE_TARGET)
    nll = tf.nn.sparse_softmax_cross_entropy_with_logits(
        labels=tf.where(kept, labels, tf.zeros_like(labels)), logits=logits_)
    return (tf.reduce_sum(tf.where(kept, nll, tf.zeros_like(nll)))
            / tf.reduce_sum(tf.cast(kept, tf.float32)))


def value_and_grad(spec: ModelSpec, names: Sequence[str], values: Sequence[tf.Tensor],
                   x: tf.Tensor, y: tf.Tensor, dtype: tf.DType = tf.float32,
                   trainable: Sequence[bool] | None = None, lora_scale: float = 1.0
                   ) -> tuple[tf.Tensor, list[tf.Tensor]]:
    """(fp32 loss, fp32 dense gradients in `names` order) of the loss at parameter tensors
    `values`, computed in `dtype` (bf16: on bf16 copies of the fp32 values). `trainable`:
    the gradients of those parameters only (LoRA's adapters; the frozen base is a constant
    of the tape)."""
    values = list(values)
    watched = [v for v, t in zip(values, trainable or [True] * len(values)) if t]
    with tf.GradientTape() as tape:
        tape.watch(watched)
        # bf16 copies of the matmul weights only (norms, biases, embeddings stay fp32).
        compute = values if dtype == tf.float32 else [
            tf.cast(v, dtype) if n.endswith(".weight") else v for n, v in zip(names, values)]
        loss = loss_fn(spec, dict(zip(names, compute)), x, y, lora_scale)
    grads = tape.gradient(loss, watched)
    # The embedding lookup's gradient is IndexedSlices; every reduction below wants dense.
    return loss, [tf.convert_to_tensor(g) for g in grads]


def global_norm(grads: Sequence[tf.Tensor]) -> tf.Tensor:
    return tf.sqrt(tf.add_n([tf.reduce_sum(tf.square(g)) for g in grads]))


class AdamW:
    """torch.optim.AdamW, written on tf.Variables.

    Keras' AdamW (keras/src/optimizers/adam.py) is not used: it folds both bias corrections
    into the step size and adds eps to the *uncorrected* root,
    `p -= lr*sqrt(1-b2^t)/(1-b1^t) * m / (sqrt(v) + eps)`, which is torch's update with eps
    replaced by eps / sqrt(1 - b2^t) (32x larger at step 1 with b2 = 0.999, 3.2x at step
    100). Its decoupled decay (`p -= p*wd*lr` before the step) matches torch's, but
    it excludes parameters by name, not by rank. Here, per update k (t = k + 1):

        m = b1 m + (1 - b1) g;  v = b2 v + (1 - b2) g^2
        p *= 1 - lr_k * wd                         (only parameters with ndim >= 2)
        p -= lr_k / (1 - b1^t) * m / (sqrt(v) / sqrt(1 - b2^t) + eps)

    The per-update scalars (lr from sextant.workloads.schedule.lr_table, the decay factor, the
    bias-corrected step size, sqrt(1 - b2^t)) are computed once on the host in float64 and
    indexed inside the step, so the schedule cannot drift from the other backends.
    """

    def __init__(self, spec: OptimizerSpec, lrs: np.ndarray, names: Sequence[str],
                 shapes: dict[str, tuple[int, ...]]) -> None:
        self.b1, self.b2, self.eps = spec.beta1, spec.beta2, spec.eps
        self.decay = [decays(n, shapes[n]) for n in names]
        lr = lrs.astype(np.float64)
        t = np.arange(1, lr.size + 1, dtype=np.float64)
        self.n = lr.size
        self.tables = {
            "decay_factor": (1.0 - lr * spec.weight_decay).astype(np.float32),
            "step_size": (lr / (1.0 - spec.beta1**t)).astype(np.float32),
            "bc2_sqrt": np.sqrt(1.0 - spec.beta2**t).astype(np.float32),
        }

    def scalars(self, k: Any) -> dict[str, tf.Tensor]:
        """The scalars of update `k` (a scalar int tensor), clamped to the table."""
        k = tf.minimum(tf.cast(k, tf.int32), self.n - 1)
        return {name: tf.gather(tf.constant(table), k) for name, table in self.tables.items()}

    def update(self, i: int, p: Any, g: tf.Tensor, m: Any, v: Any,
               s: dict[str, tf.Tensor]) -> None:
        """Update parameter `i` (variable p, moments m and v) with gradient g."""
        b1, b2 = self.b1, self.b2
        m_new = b1 * m + (1.0 - b1) * g
        v_new = b2 * v + (1.0 - b2) * tf.square(g)
        m.assign(m_new)
        v.assign(v_new)
        base = p * s["decay_factor"] if self.decay[i] else tf.convert_to_tensor(p)
        p.assign(base - s["step_size"] * m_new / (tf.sqrt(v_new) / s["bc2_sqrt"] + self.eps))
