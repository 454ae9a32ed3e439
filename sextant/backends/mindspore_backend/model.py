"""The canonical models as MindSpore Cells holding the canonical parameters.

The Cell tree mirrors the canonical names: MindSpore prefixes a Parameter's name with the
attribute path of the Cells above it, so `blocks.0.attn.qkv.weight` is the `weight` of the
`qkv` Cell in the `attn` Cell of block 0, and `Cell.parameters_and_names()` gives the
canonical names back (`build` checks that it does). Dense weights keep the canonical (in, out)
layout: `x @ w`. Every operation is written out from `mindspore.ops` (layer norm, GELU with
the tanh approximation, causal softmax attention, RMSNorm, rotary embedding), the same
formulas as the torch models, so that nothing depends on which fused kernels a MindSpore
build has for the CPU. The same Cells run op by op (PyNative) and under `mindspore.jit`.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
from mindspore import Parameter, Tensor, nn, ops

from sextant.workloads.init import rope_tables
from sextant.workloads.spec import GPTSpec, LlamaSpec, MLPSpec, ModelSpec

LAYER_NORM_EPS = 1e-5
# Attention's products through the BatchMatMul primitive, not the functional `ops.matmul`: on
# the CPU, ops.matmul of (16, 4, 64, 16) by (16, 4, 16, 64) took 5x BatchMatMul's time
# (12 ms against 2.2, median of 5 rounds, MindSpore 2.10 here); the forward and backward of
# gpt-tiny went from 100 to 80 ms under jit.
_BATCH_MATMUL = ops.BatchMatMul()
_SCORES = ops.BatchMatMul(transpose_b=True)


def _param(params: dict[str, np.ndarray], name: str) -> Parameter:
    # The name given here is the last part; the Cell tree adds the prefix.
    return Parameter(Tensor(np.ascontiguousarray(params[name])), name=name.rsplit(".", 1)[-1])


class Dense(nn.Cell):
    """y = x @ weight (+ bias), weight in the canonical (in, out) layout."""

    def __init__(self, params: dict[str, np.ndarray], prefix: str, bias: bool = True) -> None:
        super().__init__()
        self.weight = _param(params, prefix + ".weight")
        self.has_bias = bias
        if bias:
            self.bias = _param(params, prefix + ".bias")

    def construct(self, x: Any) -> Any:
        y = ops.matmul(x, self.weight)
        if self.has_bias:
            y = y + self.bias
        return y


class LayerNorm(nn.Cell):
    """torch.nn.LayerNorm's formula: biased variance, eps inside the root."""

    def __init__(self, params: dict[str, np.ndarray], prefix: str) -> None:
        super().__init__()
        self.scale = _param(params, prefix + ".scale")
        self.bias = _param(params, prefix + ".bias")

    def construct(self, x: Any) -> Any:
        mean = x.mean(-1, keep_dims=True)
        centred = x - mean
        var = (centred * centred).mean(-1, keep_dims=True)
        return centred * ops.rsqrt(var + LAYER_NORM_EPS) * self.scale + self.bias


class RMSNorm(nn.Cell):
    def __init__(self, params: dict[str, np.ndarray], prefix: str, eps: float) -> None:
        super().__init__()
        self.scale = _param(params, prefix + ".scale")
        self.eps = eps

    def construct(self, x: Any) -> Any:
        return x * ops.rsqrt((x * x).mean(-1, keep_dims=True) + self.eps) * self.scale


class Group(nn.Cell):
    """A named level of the parameter tree that computes nothing itself (`attn`, `mlp`).
    Its children are given at construction: MindSpore prefixes the Parameters' names when a
    Cell is assigned to its parent, so the tree is built from the leaves up."""

    def __init__(self, **children: nn.Cell) -> None:
        super().__init__()
        for name, child in children.items():
            setattr(self, name, child)


def _causal_mask(seq_len: int) -> Tensor:
    """(T, T) additive mask: 0 where key j <= query i, -inf above the diagonal."""
    upper = np.triu(np.ones((seq_len, seq_len), dtype=bool), k=1)
    return Tensor(np.where(upper, -np.inf, 0.0).astype(np.float32))


def attention(q: Any, k: Any, v: Any, mask: Any) -> Any:
    """Causal softmax attention on (B, heads, T, hd); returns (B, T, heads * hd)."""
    B, _, T, hd = q.shape
    scores = _SCORES(q, k) * (1.0 / math.sqrt(hd)) + mask[:T, :T]  # q @ k^T: (B, nh, T, T)
    y = _BATCH_MATMUL(ops.softmax(scores, axis=-1), v)  # (B, nh, T, hd)
    return y.swapaxes(1, 2).reshape(B, T, -1)


def gelu_tanh(x: Any) -> Any:
    return 0.5 * x * (1.0 + ops.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x * x * x)))


class MLP(nn.Cell):
    def __init__(self, spec: MLPSpec, params: dict[str, np.ndarray]) -> None:
        super().__init__()
        self.layers = nn.CellList([Dense(params, f"layers.{i}")
                                   for i in range(len(spec.hidden) + 1)])

    def construct(self, x: Any) -> Any:  # (B, in) -> (B, classes)
        last = len(self.layers) - 1
        for i, layer in enumerate(self.layers):
            x = layer(x)
            if i < last:
                x = ops.relu(x)
        return x


class GPTBlock(nn.Cell):
    def __init__(self, spec: GPTSpec, params: dict[str, np.ndarray], prefix: str) -> None:
        super().__init__()
        self.n_heads = spec.n_heads
        self.ln1 = LayerNorm(params, prefix + "ln1")
        self.attn = Group(qkv=Dense(params, prefix + "attn.qkv"),
                          proj=Dense(params, prefix + "attn.proj"))
        self.ln2 = LayerNorm(params, prefix + "ln2")
        self.mlp = Group(fc=Dense(params, prefix + "mlp.fc"),
                         proj=Dense(params, prefix + "mlp.proj"))

    def construct(self, x: Any, mask: Any) -> Any:  # (B, T, C) -> same
        B, T, C = x.shape
        qkv = self.attn.qkv(self.ln1(x))
        # (B, T, C) -> (B, nh, T, hs), columns [q | k | v]
        q, k, v = (qkv[:, :, i * C:(i + 1) * C].reshape(B, T, self.n_heads, -1).swapaxes(1, 2)
                   for i in range(3))
        x = x + self.attn.proj(attention(q, k, v, mask))
        return x + self.mlp.proj(gelu_tanh(self.mlp.fc(self.ln2(x))))


class GPT(nn.Cell):
    def __init__(self, spec: GPTSpec, params: dict[str, np.ndarray]) -> None:
        super().__init__()
        self.wte = _param(params, "wte")
        self.wpe = _param(params, "wpe")
        self.blocks = nn.CellList([GPTBlock(spec, params, f"blocks.{i}.")
                                   for i in range(spec.n_layers)])
        self.ln_f = LayerNorm(params, "ln_f")
        self.head = Dense(params, "head", bias=False)
        self.mask = _causal_mask(spec.seq_len)

    def construct(self, idx: Any) -> Any:  # (B, T) -> (B, T, V)
        T = idx.shape[1]
        x = ops.gather(self.wte, idx, 0) + self.wpe[:T]
        for block in self.blocks:
            x = block(x, self.mask)
        return self.head(self.ln_f(x))


def rotate(x: Any, cos: Any, sin: Any) -> Any:
    """Rotary embedding, rotate-half form: x (B, T, heads, hd), cos/sin (T, 1, hd)."""
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half], x[..., half:]
    return x * cos + ops.cat((-x2, x1), axis=-1) * sin


class LlamaBlock(nn.Cell):
    """Pre-RMSNorm block: grouped-query attention with rotary positions, then SwiGLU."""

    def __init__(self, spec: LlamaSpec, params: dict[str, np.ndarray], prefix: str) -> None:
        super().__init__()
        self.head_dim = spec.head_dim
        self.groups = spec.n_heads // spec.n_kv_heads
        self.attn_norm = RMSNorm(params, prefix + "attn_norm", spec.norm_eps)
        self.attn = Group(**{name: Dense(params, prefix + "attn." + name, bias=False)
                             for name in ("q", "k", "v", "o")})
        self.mlp_norm = RMSNorm(params, prefix + "mlp_norm", spec.norm_eps)
        self.mlp = Group(**{name: Dense(params, prefix + "mlp." + name, bias=False)
                            for name in ("gate", "up", "down")})

    def construct(self, x: Any, cos: Any, sin: Any, mask: Any) -> Any:
        B, T, _ = x.shape
        hd = self.head_dim
        h = self.attn_norm(x)
        q = rotate(self.attn.q(h).reshape(B, T, -1, hd), cos, sin).swapaxes(1, 2)
        k = rotate(self.attn.k(h).reshape(B, T, -1, hd), cos, sin).swapaxes(1, 2)
        v = self.attn.v(h).reshape(B, T, -1, hd).swapaxes(1, 2)
        if self.groups > 1:  # query head i reads key/value head i // groups
            k = ops.repeat_interleave(k, self.groups, 1)
            v = ops.repeat_interleave(v, self.groups, 1)
        x = x + self.attn.o(attention(q, k, v, mask))
        h = self.mlp_norm(x)
        gate = self.mlp.gate(h)
        return x + self.mlp.down(gate * ops.sigmoid(gate) * self.mlp.up(h))


class Llama(nn.Cell):
    def __init__(self, spec: LlamaSpec, params: dict[str, np.ndarray]) -> None:
        super().__init__()
        self.tied = spec.tie_embeddings
        self.wte = _param(params, "wte")
        self.blocks = nn.CellList([LlamaBlock(spec, params, f"blocks.{i}.")
                                   for i in range(spec.n_layers)])
        self.norm_f = RMSNorm(params, "norm_f", spec.norm_eps)
        if not self.tied:
            self.head = Dense(params, "head", bias=False)
        cos, sin = rope_tables(spec)
        self.cos = Tensor(cos[:, None, :])  # (T, 1, hd)
        self.sin = Tensor(sin[:, None, :])
        self.mask = _causal_mask(spec.seq_len)

    def construct(self, idx: Any) -> Any:
        T = idx.shape[1]
        cos, sin = self.cos[:T], self.sin[:T]
        x = ops.gather(self.wte, idx, 0)
        for block in self.blocks:
            x = block(x, cos, sin, self.mask)
        x = self.norm_f(x)
        return ops.matmul(x, self.wte.T) if self.tied else self.head(x)


class WithLoss(nn.Cell):
    """Model + mean softmax cross-entropy over every target in the batch."""

    def __init__(self, net: nn.Cell) -> None:
        super().__init__(auto_prefix=False)  # the model's parameters keep canonical names
        self.net = net

    def construct(self, x: Any, y: Any) -> Any:
        logits = self.net(x)
        logits = logits.reshape(-1, logits.shape[-1])
        picked = ops.gather_elements(logits, 1, y.reshape(-1, 1)).reshape(-1)
        return (ops.logsumexp(logits, -1) - picked).mean()


def build(spec: ModelSpec, params: dict[str, np.ndarray]) -> tuple[WithLoss, dict[str, Any]]:
    """(model with loss, canonical name -> its Parameter in canonical order)."""
    net: nn.Cell
    if isinstance(spec, MLPSpec):
        net = MLP(spec, params)
    elif isinstance(spec, LlamaSpec):
        net = Llama(spec, params)
    else:
        net = GPT(spec, params)
    found = {name: p for name, p in net.parameters_and_names()}
    if set(found) != set(params) or any(p.name != name for name, p in found.items()):
        raise RuntimeError(f"MindSpore model parameters {sorted(found)} are not the canonical "
                           f"{sorted(params)}")
    return WithLoss(net), {name: found[name] for name in params}


def to_canonical(by_name: dict[str, Any]) -> dict[str, np.ndarray]:
    return {name: np.asarray(p.asnumpy(), dtype=np.float32) for name, p in by_name.items()}


def tensor(value: np.ndarray) -> Tensor:
    """A batch array as a MindSpore tensor (token ids as int32, MindSpore's index type)."""
    if np.issubdtype(value.dtype, np.integer):
        return Tensor(value.astype(np.int32))
    return Tensor(value.astype(np.float32))

