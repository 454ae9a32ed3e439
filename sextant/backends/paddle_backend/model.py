"""The canonical models as Paddle layers, and the mapping from canonical parameters.

Paddle's `nn.Linear` stores its weight as (in, out), the canonical layout, so nothing is
transposed; a norm's canonical `scale` is Paddle's `weight`, an embedding's matrix its
`weight`. With tied embeddings the head multiplies by `wte.weight` transposed (one parameter,
one gradient, one optimizer state).

Attention is written out (scores, causal mask, softmax, values): Paddle 3.3's
`F.scaled_dot_product_attention` dispatches to flash-attention kernels that its CPU build
does not have. RMSNorm too (Paddle 3.3 has no `nn.RMSNorm`).
"""

from __future__ import annotations

import math

import numpy as np
import paddle
import paddle.nn.functional as F
from paddle import nn

from sextant.workloads.init import rope_tables
from sextant.workloads.spec import GPTSpec, LlamaSpec, MLPSpec, ModelSpec

LAYER_NORM_EPS = 1e-5


class MLP(nn.Layer):
    def __init__(self, spec: MLPSpec) -> None:
        super().__init__()
        widths = [spec.input_dim, *spec.hidden, spec.num_classes]
        self.layers = nn.LayerList([nn.Linear(a, b) for a, b in zip(widths[:-1], widths[1:])])

    def forward(self, x: paddle.Tensor) -> paddle.Tensor:  # (B, in) -> (B, classes)
        for layer in self.layers[:-1]:
            x = F.relu(layer(x))
        return self.layers[-1](x)


def _causal_mask(seq_len: int) -> paddle.Tensor:
    """(T, T) additive mask: 0 on and below the diagonal, -inf above."""
    upper = np.triu(np.full((seq_len, seq_len), -np.inf, np.float32), k=1)
    return paddle.to_tensor(upper)


def attention(q: paddle.Tensor, k: paddle.Tensor, v: paddle.Tensor, mask: paddle.Tensor
              ) -> paddle.Tensor:
    """Causal attention: q (B, heads, T, hd), k/v (B, kv_heads, T, hd) -> (B, heads, T, hd).
    Query head h reads K/V head h // (heads / kv_heads), as torch's enable_gqa."""
    groups = q.shape[1] // k.shape[1]
    if groups > 1:
        k = paddle.repeat_interleave(k, groups, axis=1)
        v = paddle.repeat_interleave(v, groups, axis=1)
    T = q.shape[2]
    scores = paddle.matmul(q, k, transpose_y=True) * (1.0 / math.sqrt(q.shape[-1]))
    return paddle.matmul(F.softmax(scores + mask[:T, :T], axis=-1), v)


class Block(nn.Layer):
    def __init__(self, spec: GPTSpec) -> None:
        super().__init__()
        d = spec.d_model
        self.n_heads = spec.n_heads
        self.ln1 = nn.LayerNorm(d, epsilon=LAYER_NORM_EPS)
        self.attn = nn.Layer()
        self.attn.qkv = nn.Linear(d, 3 * d)
        self.attn.proj = nn.Linear(d, d)
        self.ln2 = nn.LayerNorm(d, epsilon=LAYER_NORM_EPS)
        self.mlp = nn.Layer()
        self.mlp.fc = nn.Linear(d, spec.d_ff)
        self.mlp.proj = nn.Linear(spec.d_ff, d)

    def forward(self, x: paddle.Tensor, mask: paddle.Tensor) -> paddle.Tensor:
        B, T, C = x.shape
        H = self.n_heads
        q, k, v = paddle.split(self.attn.qkv(self.ln1(x)), 3, axis=-1)
        # (B, T, C) -> (B, nh, T, hs)
        q, k, v = (t.reshape([B, T, H, C // H]).transpose([0, 2, 1, 3]) for t in (q, k, v))
        y = attention(q, k, v, mask).transpose([0, 2, 1, 3]).reshape([B, T, C])
        x = x + self.attn.proj(y)
        h = F.gelu(self.mlp.fc(self.ln2(x)), approximate=True)
        return x + self.mlp.proj(h)


class GPT(nn.Layer):
    def __init__(self, spec: GPTSpec) -> None:
        super().__init__()
        self.wte = nn.Embedding(spec.vocab_size, spec.d_model)
        self.wpe = nn.Embedding(spec.seq_len, spec.d_model)
        self.blocks = nn.LayerList([Block(spec) for _ in range(spec.n_layers)])
        self.ln_f = nn.LayerNorm(spec.d_model, epsilon=LAYER_NORM_EPS)
        self.head = nn.Linear(spec.d_model, spec.vocab_size, bias_attr=False)
        self.register_buffer("positions", paddle.arange(spec.seq_len), persistable=False)
        self.register_buffer("mask", _causal_mask(spec.seq_len), persistable=False)

    def forward(self, idx: paddle.Tensor) -> paddle.Tensor:  # (B, T) -> (B, T, V)
        x = self.wte(idx) + self.wpe(self.positions[: idx.shape[1]])
        for block in self.blocks:
            x = block(x, self.mask)
        return self.head(self.ln_f(x))


class RMSNorm(nn.Layer):
    """x / sqrt(mean(x^2) + eps) * weight, as torch.nn.RMSNorm."""

    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.weight = self.create_parameter([dim], default_initializer=nn.initializer.Constant(1.0))

    def forward(self, x: paddle.Tensor) -> paddle.Tensor:
        return x * paddle.rsqrt(paddle.mean(x * x, axis=-1, keepdim=True) + self.eps) * self.weight


def rotate(x: paddle.Tensor, cos: paddle.Tensor, sin: paddle.Tensor) -> paddle.Tensor:
    """Rotary embedding, rotate-half form: x (B, T, heads, hd), cos/sin (T, 1, hd)."""
    x1, x2 = paddle.chunk(x, 2, axis=-1)
    return x * cos + paddle.concat([-x2, x1], axis=-1) * sin


class Attention(nn.Layer):
    """Grouped-query causal attention with rotary embeddings, no biases."""

    def __init__(self, spec: LlamaSpec) -> None:
        super().__init__()
        d, hd = spec.d_model, spec.head_dim
        self.head_dim = hd
        self.q = nn.Linear(d, spec.n_heads * hd, bias_attr=False)
        self.k = nn.Linear(d, spec.n_kv_heads * hd, bias_attr=False)
        self.v = nn.Linear(d, spec.n_kv_heads * hd, bias_attr=False)
        self.o = nn.Linear(spec.n_heads * hd, d, bias_attr=False)

    def forward(self, h: paddle.Tensor, cos: paddle.Tensor, sin: paddle.Tensor,
                mask: paddle.Tensor) -> paddle.Tensor:
        B, T, hd = h.shape[0], h.shape[1], self.head_dim
        q = rotate(self.q(h).reshape([B, T, -1, hd]), cos, sin).transpose([0, 2, 1, 3])
        k = rotate(self.k(h).reshape([B, T, -1, hd]), cos, sin).transpose([0, 2, 1, 3])
        v = self.v(h).reshape([B, T, -1, hd]).transpose([0, 2, 1, 3])
        y = attention(q, k, v, mask)
        return self.o(y.transpose([0, 2, 1, 3]).reshape([B, T, -1]))


class SwiGLU(nn.Layer):
    def __init__(self, spec: LlamaSpec) -> None:
        super().__init__()
        self.gate = nn.Linear(spec.d_model, spec.d_ff, bias_attr=False)
        self.up = nn.Linear(spec.d_model, spec.d_ff, bias_attr=False)
        self.down = nn.Linear(spec.d_ff, spec.d_model, bias_attr=False)

    def forward(self, h: paddle.Tensor) -> paddle.Tensor:
        return self.down(F.silu(self.gate(h)) * self.up(h))


class LlamaBlock(nn.Layer):
    """Pre-RMSNorm block: attention, then SwiGLU, each added to the residual stream."""

    def __init__(self, spec: LlamaSpec) -> None:
        super().__init__()
        self.attn_norm = RMSNorm(spec.d_model, spec.norm_eps)
        self.attn = Attention(spec)
        self.mlp_norm = RMSNorm(spec.d_model, spec.norm_eps)
        self.mlp = SwiGLU(spec)

    def forward(self, x: paddle.Tensor, cos: paddle.Tensor, sin: paddle.Tensor,
                mask: paddle.Tensor) -> paddle.Tensor:
        x = x + self.attn(self.attn_norm(x), cos, sin, mask)
        return x + self.mlp(self.mlp_norm(x))


class Llama(nn.Layer):
    def __init__(self, spec: LlamaSpec) -> None:
        super().__init__()
        self.tied = spec.tie_embeddings
        self.wte = nn.Embedding(spec.vocab_size, spec.d_model)
        self.blocks = nn.LayerList([LlamaBlock(spec) for _ in range(spec.n_layers)])
        self.norm_f = RMSNorm(spec.d_model, spec.norm_eps)
        if not self.tied:
            self.head = nn.Linear(spec.d_model, spec.vocab_size, bias_attr=False)
        cos, sin = (paddle.to_tensor(t[:, None, :]) for t in rope_tables(spec))
        self.register_buffer("cos", cos, persistable=False)  # (T, 1, hd)
        self.register_buffer("sin", sin, persistable=False)
        self.register_buffer("mask", _causal_mask(spec.seq_len), persistable=False)

    def forward(self, idx: paddle.Tensor) -> paddle.Tensor:  # (B, T) -> (B, T, V)
        T = idx.shape[1]
        cos, sin = self.cos[:T], self.sin[:T]
        x = self.wte(idx)
        for block in self.blocks:
            x = block(x, cos, sin, self.mask)
        x = self.norm_f(x)
        if self.tied:
            return paddle.matmul(x, self.wte.weight, transpose_y=True)
        return self.head(x)


class WithLoss(nn.Layer):
    """Model + mean cross-entropy: the layer `paddle.jit.to_static` and `DataParallel` see."""

    def __init__(self, net: nn.Layer) -> None:
        super().__init__()
        self.net = net

    def forward(self, x: paddle.Tensor, y: paddle.Tensor) -> paddle.Tensor:
        logits = self.net(x)
        return F.cross_entropy(logits.reshape([-1, logits.shape[-1]]), y.reshape([-1]))


def build(spec: ModelSpec) -> nn.Layer:
    if isinstance(spec, MLPSpec):
        return MLP(spec)
    return Llama(spec) if isinstance(spec, LlamaSpec) else GPT(spec)


def paddle_name(canonical: str) -> str:
    """The structured parameter name (`named_parameters`) of a canonical parameter."""
    if canonical in ("wte", "wpe"):
        return canonical + ".weight"
    if canonical.endswith(".scale"):
        return canonical[: -len(".scale")] + ".weight"
    return canonical


def parameters_by_name(net: nn.Layer, names: list[str]) -> dict[str, paddle.Tensor]:
    """canonical name -> the Paddle parameter that holds it, in canonical order (every one,
    none left over)."""
    own = dict(net.named_parameters())
    wanted = [paddle_name(n) for n in names]
    if set(own) != set(wanted):
        raise RuntimeError(f"paddle parameters {sorted(set(own) ^ set(wanted))} do not map "
                           "to the canonical ones")
    return {name: own[key] for name, key in zip(names, wanted)}


def load_canonical(params: dict[str, paddle.Tensor], values: dict[str, np.ndarray]) -> None:
    for name, p in params.items():
        p.set_value(np.ascontiguousarray(values[name]))


def export_canonical(params: dict[str, paddle.Tensor]) -> dict[str, np.ndarray]:
    return {name: np.ascontiguousarray(p.numpy().astype(np.float32))
            for name, p in params.items()}
