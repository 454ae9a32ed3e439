"""The canonical models written once in Keras 3 layers and ops, for all three Keras backends.

The layers are Keras' own where Keras has one with the canonical math (Embedding, Dense,
LayerNormalization with eps 1e-5, `keras.ops.dot_product_attention` with a causal mask, the
tanh GELU); the rest is `keras.ops`. A Dense kernel is (in, out), the canonical layout, so
the canonical arrays of `sextant.workloads.init` are assigned as they are (`canonical_variables` maps
every canonical name to its Keras variable; the Keras initialisers' values are overwritten
before training). The fused qkv projection keeps the canonical column order [q | k | v].

`Trainable` is the one Keras-specific piece: `fit` calls `train_step`, which Keras 3 lets a
model override per backend (the stateless JAX signature differs from the stateful torch and
TensorFlow ones). Each of the three returns this step's loss and global gradient norm as its
logs (not the running mean Keras' loss tracker keeps), so that a callback sees them per step.

Imported only inside the worker, after KERAS_BACKEND is set.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import keras
import numpy as np
from keras import layers, ops

from sextant.workloads.init import rope_tables
from sextant.workloads.spec import IGNORE_TARGET, GPTSpec, LlamaSpec, MLPSpec, ModelSpec

LAYER_NORM_EPS = 1e-5


def loss_of(y: Any, logits: Any) -> Any:
    """Mean softmax cross-entropy over every sample (MLP) or every token (GPT), in fp32."""
    logits = ops.cast(logits, "float32")
    if len(y.shape) == 1:  # the MLP's class labels: nothing is ever left out
        return ops.mean(ops.sparse_categorical_crossentropy(y, logits, from_logits=True))
    # Tokens: the mean over the targets that are not IGNORE_TARGET (instruction data's prompt
    # and padding), as torch's cross_entropy computes it.
    kept = ops.not_equal(y, IGNORE_TARGET)
    nll = ops.sparse_categorical_crossentropy(ops.where(kept, y, 0), logits, from_logits=True)
    return (ops.sum(ops.where(kept, nll, 0.0))
            / ops.sum(ops.cast(kept, "float32")))


def global_norm(grads: list[Any]) -> Any:
    return ops.sqrt(sum(ops.sum(ops.square(g)) for g in grads))


class Trainable(keras.Model):
    """A model whose `fit` step reports (loss, grad_norm) per step: Keras' customising-fit
    pattern, one `train_step` per backend (KERAS_BACKEND is fixed for the process)."""

    def train_step(self, *args: Any) -> Any:
        return _TRAIN_STEPS[keras.backend.backend()](self, *args)


def _jax_train_step(model: Trainable, state: Any, data: Any) -> Any:
    import jax

    trainable, non_trainable, optimizer_vars, metrics_vars = state
    x, y = data

    def loss_fn(tv: Any) -> Any:
        logits, ntv = model.stateless_call(tv, non_trainable, x, training=True)
        return loss_of(y, logits), ntv

    (loss, non_trainable), grads = jax.value_and_grad(loss_fn, has_aux=True)(trainable)
    norm = global_norm(grads)
    trainable, optimizer_vars = model.optimizer.stateless_apply(optimizer_vars, grads, trainable)
    return ({"loss": loss, "grad_norm": norm},
            (trainable, non_trainable, optimizer_vars, metrics_vars))


def _torch_train_step(model: Trainable, data: Any) -> Any:
    import torch

    x, y = data
    model.zero_grad()
    loss = loss_of(y, model(x, training=True))
    loss.backward()
    weights = model.trainable_weights
    grads = [v.value.grad for v in weights]
    with torch.no_grad():
        norm = global_norm(grads)
        model.optimizer.apply(grads, weights)
    return {"loss": loss.detach(), "grad_norm": norm}


def _tensorflow_train_step(model: Trainable, data: Any) -> Any:
    import tensorflow as tf

    x, y = data
    with tf.GradientTape() as tape:
        loss = loss_of(y, model(x, training=True))
    weights = model.trainable_weights
    # The embedding's gradient is IndexedSlices: dense, as on the other backends.
    grads = [tf.convert_to_tensor(g) for g in tape.gradient(loss, weights)]
    norm = global_norm(grads)
    model.optimizer.apply(grads, weights)
    return {"loss": loss, "grad_norm": norm}


_TRAIN_STEPS: dict[str, Callable[..., Any]] = {"jax": _jax_train_step, "torch": _torch_train_step,
                "tensorflow": _tensorflow_train_step}


class MLP(Trainable):
    def __init__(self, spec: MLPSpec) -> None:
        super().__init__()
        widths = [*spec.hidden, spec.num_classes]
        self.dense = [layers.Dense(w, activation="relu" if i < len(widths) - 1 else None,
                                   name=f"layers_{i}") for i, w in enumerate(widths)]
        self.input_dim = spec.input_dim

    def call(self, x: Any, training: bool = False) -> Any:
        for dense in self.dense:
            x = dense(x)
        return x

    def canonical(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for i, dense in enumerate(self.dense):
            out[f"layers.{i}.weight"], out[f"layers.{i}.bias"] = dense.kernel, dense.bias
        return out

    def dummy_input(self) -> np.ndarray:
        return np.zeros((1, self.input_dim), np.float32)


class PositionEmbedding(layers.Layer):
    """Learned absolute positions (canonical `wpe`, (seq_len, C)), added to the tokens'."""

    def __init__(self, seq_len: int, dim: int, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.embeddings = self.add_weight(shape=(seq_len, dim), name="embeddings")

    def call(self, x: Any) -> Any:  # (B, T, C)
        return x + self.embeddings[: x.shape[1]]


class CausalSelfAttention(layers.Layer):
    def __init__(self, spec: GPTSpec, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.n_heads, self.head_dim, self.d_model = spec.n_heads, spec.head_dim, spec.d_model
        self.qkv = layers.Dense(3 * spec.d_model, name="qkv")
        self.proj = layers.Dense(spec.d_model, name="proj")

    def call(self, x: Any) -> Any:  # (B, T, C)
        T = x.shape[1]
        q, k, v = ops.split(self.qkv(x), 3, axis=-1)
        # dot_product_attention takes (B, T, heads, head_dim)
        q, k, v = (ops.reshape(t, (-1, T, self.n_heads, self.head_dim)) for t in (q, k, v))
        y = ops.dot_product_attention(q, k, v, is_causal=True)
        return self.proj(ops.reshape(y, (-1, T, self.d_model)))


class Block(layers.Layer):
    def __init__(self, spec: GPTSpec, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.ln1 = layers.LayerNormalization(epsilon=LAYER_NORM_EPS, name="ln1")
        self.attn = CausalSelfAttention(spec, name="attn")
        self.ln2 = layers.LayerNormalization(epsilon=LAYER_NORM_EPS, name="ln2")
        self.fc = layers.Dense(spec.d_ff, name="fc")
        self.mlp_proj = layers.Dense(spec.d_model, name="mlp_proj")

    def call(self, x: Any) -> Any:
        x = x + self.attn(self.ln1(x))
        h = keras.activations.gelu(self.fc(self.ln2(x)), approximate=True)
        return x + self.mlp_proj(h)


class GPT(Trainable):
    def __init__(self, spec: GPTSpec) -> None:
        super().__init__()
        self.seq_len = spec.seq_len
        self.wte = layers.Embedding(spec.vocab_size, spec.d_model, name="wte")
        self.wpe = PositionEmbedding(spec.seq_len, spec.d_model, name="wpe")
        self.blocks = [Block(spec, name=f"blocks_{i}") for i in range(spec.n_layers)]
        self.ln_f = layers.LayerNormalization(epsilon=LAYER_NORM_EPS, name="ln_f")
        self.head = (None if spec.tie_embeddings
                     else layers.Dense(spec.vocab_size, use_bias=False, name="head"))

    def call(self, idx: Any, training: bool = False) -> Any:  # (B, T) token ids -> (B, T, V) logits
        x = self.wpe(self.wte(idx))
        for block in self.blocks:
            x = block(x)
        x = self.ln_f(x)
        if self.head is None:  # tied: the embedding, transposed
            return ops.matmul(x, ops.transpose(self.wte.embeddings))
        return self.head(x)

    def canonical(self) -> dict[str, Any]:
        out: dict[str, Any] = {"wte": self.wte.embeddings, "wpe": self.wpe.embeddings}
        for i, b in enumerate(self.blocks):
            p = f"blocks.{i}."
            for name, layer in (("ln1", b.ln1), ("ln2", b.ln2)):
                out[p + name + ".scale"], out[p + name + ".bias"] = layer.gamma, layer.beta
            for name, dense in (("attn.qkv", b.attn.qkv), ("attn.proj", b.attn.proj),
                                ("mlp.fc", b.fc), ("mlp.proj", b.mlp_proj)):
                out[p + name + ".weight"], out[p + name + ".bias"] = dense.kernel, dense.bias
        out["ln_f.scale"], out["ln_f.bias"] = self.ln_f.gamma, self.ln_f.beta
        if self.head is not None:
            out["head.weight"] = self.head.kernel
        return out

    def dummy_input(self) -> np.ndarray:
        return np.zeros((1, self.seq_len), np.int32)


Lora = tuple[tuple[str, ...], int, float] | None
"""LoRA's (targets, rank, alpha / rank), or None: no adapters."""


class Adapted(layers.Layer):
    """A Dense projection with a LoRA adapter beside it: x W (+ b) + (x A) B * alpha / rank,
    computed low-rank. (Keras' own `enable_lora` merges W + A B on every call, so it forms
    the full weight's gradient; this does not.)"""

    def __init__(self, units: int, fan_in: int, use_bias: bool, rank: int, scale: float,
                 **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.dense = layers.Dense(units, use_bias=use_bias, name="dense")
        self.scale, self.shapes = scale, ((fan_in, rank), (rank, units))

    def build(self, input_shape: Any) -> None:
        # Made here, inside the model's name scopes: each block's adapters get their own
        # variable path (the torch backend keys its parameters by path).
        self.lora_a = self.add_weight(shape=self.shapes[0], initializer="zeros",
                                      name="lora_a")
        self.lora_b = self.add_weight(shape=self.shapes[1], initializer="zeros",
                                      name="lora_b")
        self.dense.build(input_shape)

    @property
    def kernel(self) -> Any:
        return self.dense.kernel

    @property
    def bias(self) -> Any:
        return self.dense.bias

    @property
    def use_bias(self) -> bool:
        return bool(self.dense.use_bias)

    def call(self, x: Any) -> Any:
        return self.dense(x) + ops.matmul(ops.matmul(x, self.lora_a), self.lora_b) * self.scale


def _projection(target: str, units: int, fan_in: int, use_bias: bool, lora: Lora) -> Any:
    if lora is None or target not in lora[0]:
        return layers.Dense(units, use_bias=use_bias, name=target)
    return Adapted(units, fan_in, use_bias, lora[1], lora[2], name=target)


class RotaryAttention(layers.Layer):
    """Grouped-query causal attention with rotary positions (rotate-half form, the tables of
    sextant.workloads.init.rope_tables); each key/value head repeated for its group of query heads."""

    def __init__(self, spec: LlamaSpec, lora: Lora = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.nh, self.nkv, self.hd = spec.n_heads, spec.n_kv_heads, spec.head_dim
        d, bias = spec.d_model, spec.qkv_bias
        self.q = _projection("q", self.nh * self.hd, d, bias, lora)
        self.k = _projection("k", self.nkv * self.hd, d, bias, lora)
        self.v = _projection("v", self.nkv * self.hd, d, bias, lora)
        self.o = _projection("o", d, self.nh * self.hd, False, lora)
        cos, sin = rope_tables(spec)  # (T, hd)
        self.cos, self.sin = cos[:, None, :], sin[:, None, :]  # (T, 1, hd): over the heads

    def call(self, x: Any) -> Any:  # (B, T, C)
        T = x.shape[1]
        # Backend tensors (a torch tensor times a numpy array is numpy's product).
        cos, sin = ops.convert_to_tensor(self.cos[:T]), ops.convert_to_tensor(self.sin[:T])

        def heads(t: Any, n: int, rotary: bool) -> Any:  # -> (B, T, n, hd)
            t = ops.reshape(t, (-1, T, n, self.hd))
            if rotary:
                t1, t2 = ops.split(t, 2, axis=-1)
                t = t * cos + ops.concatenate([-t2, t1], axis=-1) * sin
            if n != self.nh:
                t = ops.repeat(t, self.nh // n, axis=2)
            return t

        q = heads(self.q(x), self.nh, True)
        k = heads(self.k(x), self.nkv, True)
        v = heads(self.v(x), self.nkv, False)
        y = ops.dot_product_attention(q, k, v, is_causal=True)
        return self.o(ops.reshape(y, (-1, T, self.nh * self.hd)))


class LlamaBlock(layers.Layer):
    def __init__(self, spec: LlamaSpec, lora: Lora = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.attn_norm = layers.RMSNormalization(epsilon=spec.norm_eps, name="attn_norm")
        self.attn = RotaryAttention(spec, lora, name="attn")
        self.mlp_norm = layers.RMSNormalization(epsilon=spec.norm_eps, name="mlp_norm")
        d, f = spec.d_model, spec.d_ff
        self.gate = _projection("gate", f, d, False, lora)
        self.up = _projection("up", f, d, False, lora)
        self.down = _projection("down", d, f, False, lora)

    def call(self, x: Any) -> Any:
        x = x + self.attn(self.attn_norm(x))
        h = self.mlp_norm(x)
        return x + self.down(ops.silu(self.gate(h)) * self.up(h))


class Llama(Trainable):
    def __init__(self, spec: LlamaSpec, lora: Lora = None) -> None:
        super().__init__()
        self.seq_len, self.tied = spec.seq_len, spec.tie_embeddings
        self.wte = layers.Embedding(spec.vocab_size, spec.d_model, name="wte")
        self.blocks = [LlamaBlock(spec, lora, name=f"blocks_{i}")
                       for i in range(spec.n_layers)]
        self.norm_f = layers.RMSNormalization(epsilon=spec.norm_eps, name="norm_f")
        self.head = (None if spec.tie_embeddings
                     else layers.Dense(spec.vocab_size, use_bias=False, name="head"))

    def call(self, idx: Any, training: bool = False) -> Any:  # (B, T) -> (B, T, V)
        x = self.wte(idx)
        for block in self.blocks:
            x = block(x)
        x = self.norm_f(x)
        if self.head is None:  # tied: the embedding, transposed
            return ops.matmul(x, ops.transpose(self.wte.embeddings))
        return self.head(x)

    def canonical(self) -> dict[str, Any]:
        out: dict[str, Any] = {"wte": self.wte.embeddings}
        for i, b in enumerate(self.blocks):
            p = f"blocks.{i}."
            out[p + "attn_norm.scale"], out[p + "mlp_norm.scale"] = (b.attn_norm.scale,
                                                                   b.mlp_norm.scale)
            for name, dense in (("attn.q", b.attn.q), ("attn.k", b.attn.k),
                                ("attn.v", b.attn.v), ("attn.o", b.attn.o),
                                ("mlp.gate", b.gate), ("mlp.up", b.up), ("mlp.down", b.down)):
                out[p + name + ".weight"] = dense.kernel
                if dense.use_bias:
                    out[p + name + ".bias"] = dense.bias
                if isinstance(dense, Adapted):
                    out[p + name + ".lora_a"], out[p + name + ".lora_b"] = (dense.lora_a,
                                                                          dense.lora_b)
        out["norm_f.scale"] = self.norm_f.scale
        if self.head is not None:
            out["head.weight"] = self.head.kernel
        return out

    def dummy_input(self) -> np.ndarray:
        return np.zeros((1, self.seq_len), np.int32)


def build(spec: ModelSpec, params: dict[str, np.ndarray], lora: Lora = None
          ) -> tuple[Trainable, dict[str, Any]]:
    """The Keras model holding the canonical `params`, and its canonical-name -> variable map
    (in canonical order). `lora`: LoRA's adapters on the targets (their arrays in `params`)."""
    model: Any = (MLP(spec) if isinstance(spec, MLPSpec) else
                  Llama(spec, lora) if isinstance(spec, LlamaSpec) else GPT(spec))
    model(model.dummy_input())  # creates the variables
    found = model.canonical()
    if set(found) != set(params) or len(model.weights) != len(params):
        raise RuntimeError(f"keras model variables {list(found)} do not match the "
                           f"canonical parameters {list(params)}")
    variables = {name: found[name] for name in params}
    for name, var in variables.items():
        if tuple(var.shape) != params[name].shape:
            raise RuntimeError(f"{name}: Keras shape {tuple(var.shape)}, canonical "
                               f"{params[name].shape}")
        var.assign(params[name])
    return model, variables
