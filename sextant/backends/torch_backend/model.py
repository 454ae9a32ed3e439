"""The canonical models as torch modules, and the mapping from canonical parameters.

Canonical dense weights are (in, out); nn.Linear stores (out, in), so they are transposed on
the way in and out. A norm's canonical `scale` is torch's `weight`. With tied embeddings the
head's weight *is* the embedding's Parameter (one tensor, one gradient, one optimizer state).
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from sextant.workloads.init import rope_tables
from sextant.workloads.spec import GPTSpec, LlamaSpec, MLPSpec, ModelSpec

LAYER_NORM_EPS = 1e-5


class MLP(nn.Module):
    def __init__(self, spec: MLPSpec) -> None:
        super().__init__()
        widths = [spec.input_dim, *spec.hidden, spec.num_classes]
        self.layers = nn.ModuleList(nn.Linear(a, b) for a, b in zip(widths[:-1], widths[1:]))

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (B, in) -> (B, classes)
        for layer in self.layers[:-1]:
            x = F.relu(layer(x))
        return self.layers[-1](x)


class Block(nn.Module):
    def __init__(self, spec: GPTSpec) -> None:
        super().__init__()
        d = spec.d_model
        self.n_heads = spec.n_heads
        self.ln1 = nn.LayerNorm(d, eps=LAYER_NORM_EPS)
        self.attn = nn.Module()
        self.attn.qkv = nn.Linear(d, 3 * d)
        self.attn.proj = nn.Linear(d, d)
        self.ln2 = nn.LayerNorm(d, eps=LAYER_NORM_EPS)
        self.mlp = nn.Module()
        self.mlp.fc = nn.Linear(d, spec.d_ff)
        self.mlp.proj = nn.Linear(spec.d_ff, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, C = x.shape
        q, k, v = project(self.attn.qkv, self.ln1(x)).split(C, dim=-1)
        # (B, T, C) -> (B, nh, T, hs)
        q, k, v = (t.view(B, T, self.n_heads, C // self.n_heads).transpose(1, 2) for t in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + project(self.attn.proj, y.transpose(1, 2).reshape(B, T, C))
        h = F.gelu(project(self.mlp.fc, self.ln2(x)), approximate="tanh")
        return x + project(self.mlp.proj, h)


class GPT(nn.Module):
    def __init__(self, spec: GPTSpec) -> None:
        super().__init__()
        self.wte = nn.Embedding(spec.vocab_size, spec.d_model)
        self.wpe = nn.Embedding(spec.seq_len, spec.d_model)
        self.blocks = nn.ModuleList(Block(spec) for _ in range(spec.n_layers))
        self.ln_f = nn.LayerNorm(spec.d_model, eps=LAYER_NORM_EPS)
        self.head = nn.Linear(spec.d_model, spec.vocab_size, bias=False)
        if spec.tie_embeddings:
            self.head.weight = self.wte.weight
        self.register_buffer("positions", torch.arange(spec.seq_len), persistent=False)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:  # (B, T) -> (B, T, V)
        x = self.wte(idx) + self.wpe(self.positions[: idx.shape[1]])
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln_f(x))


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotary embedding, rotate-half form: x (B, T, heads, hd), cos/sin (T, 1, hd)."""
    x1, x2 = x.chunk(2, dim=-1)
    return x * cos + torch.cat((-x2, x1), dim=-1) * sin


class Attention(nn.Module):
    """Grouped-query causal attention with rotary embeddings; biases on q, k and v only with
    `qkv_bias` (Qwen2).

    Head counts and the sequence length are read from the projections' outputs
    (`view(B, T, -1, hd)`), so the same code runs on a tensor-parallel shard that holds a
    subset of the heads, and on the sequence-parallel layout (whose input is gathered to the
    whole sequence before the projections)."""

    def __init__(self, spec: LlamaSpec) -> None:
        super().__init__()
        d, hd = spec.d_model, spec.head_dim
        self.head_dim = hd
        self.q = nn.Linear(d, spec.n_heads * hd, bias=spec.qkv_bias)
        self.k = nn.Linear(d, spec.n_kv_heads * hd, bias=spec.qkv_bias)
        self.v = nn.Linear(d, spec.n_kv_heads * hd, bias=spec.qkv_bias)
        self.o = nn.Linear(spec.n_heads * hd, d, bias=False)

    def forward(self, h: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        q, k, v = project(self.q, h), project(self.k, h), project(self.v, h)
        B, T, hd = q.shape[0], q.shape[1], self.head_dim
        q = rotate(q.view(B, T, -1, hd), cos, sin).transpose(1, 2)
        k = rotate(k.view(B, T, -1, hd), cos, sin).transpose(1, 2)
        v = v.view(B, T, -1, hd).transpose(1, 2)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True,
                                           enable_gqa=q.shape[1] != k.shape[1])
        return project(self.o, y.transpose(1, 2).reshape(B, T, -1))


class SwiGLU(nn.Module):
    def __init__(self, spec: LlamaSpec) -> None:
        super().__init__()
        self.gate = nn.Linear(spec.d_model, spec.d_ff, bias=False)
        self.up = nn.Linear(spec.d_model, spec.d_ff, bias=False)
        self.down = nn.Linear(spec.d_ff, spec.d_model, bias=False)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return project(self.down, F.silu(project(self.gate, h)) * project(self.up, h))


def project(linear: nn.Linear, h: torch.Tensor) -> torch.Tensor:
    """A projection (llama's or gpt's), plus its LoRA adapter where add_adapters gave it one:
    h W + (h A) B * alpha / rank, computed low-rank (the full weight's gradient is never
    formed, and none is kept for the frozen W)."""
    a = getattr(linear, "lora_a", None)
    if linear.weight.dtype == torch.bfloat16 and h.dtype == torch.float32 \
            and not linear.weight.requires_grad:  # a bf16 frozen base: upcast for this matmul
        base = F.linear(h, linear.weight.float(), linear.bias)
    else:
        base = linear(h)
    return base if a is None else base + (h @ a) @ linear.lora_b * linear.lora_scale


def add_adapters(net: nn.Module, shapes: dict[str, tuple[int, ...]], scale: float) -> None:
    """LoRA's A (in, rank) and B (rank, out) registered on their nn.Linear under the
    canonical names (`blocks.0.attn.q.lora_a`); load_canonical then fills them."""
    for name, shape in shapes.items():
        path, kind = name.rsplit(".", 1)
        linear = net.get_submodule(path)
        linear.register_parameter(kind, nn.Parameter(torch.zeros(shape)))
        linear.lora_scale = scale


class LlamaBlock(nn.Module):
    """Pre-RMSNorm block: attention, then SwiGLU, each added to the residual stream."""

    def __init__(self, spec: LlamaSpec) -> None:
        super().__init__()
        self.attn_norm = nn.RMSNorm(spec.d_model, eps=spec.norm_eps)
        self.attn = Attention(spec)
        self.mlp_norm = nn.RMSNorm(spec.d_model, eps=spec.norm_eps)
        self.mlp = SwiGLU(spec)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.attn_norm(x), cos, sin)
        return x + self.mlp(self.mlp_norm(x))


class Llama(nn.Module):
    def __init__(self, spec: LlamaSpec) -> None:
        super().__init__()
        self.wte = nn.Embedding(spec.vocab_size, spec.d_model)
        self.blocks = nn.ModuleList(LlamaBlock(spec) for _ in range(spec.n_layers))
        self.norm_f = nn.RMSNorm(spec.d_model, eps=spec.norm_eps)
        self.head = nn.Linear(spec.d_model, spec.vocab_size, bias=False)
        if spec.tie_embeddings:
            self.head.weight = self.wte.weight
        cos, sin = (torch.from_numpy(t)[:, None, :] for t in rope_tables(spec))
        self.register_buffer("cos", cos, persistent=False)  # (T, 1, hd)
        self.register_buffer("sin", sin, persistent=False)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:  # (B, T) -> (B, T, V)
        T = idx.shape[1]
        cos, sin = self.cos[:T], self.sin[:T]
        x = self.wte(idx)
        for block in self.blocks:
            x = block(x, cos, sin)
        return self.head(self.norm_f(x))


class WithLoss(nn.Module):
    """Model + mean cross-entropy, so that compile and DDP see one module returning the loss."""

    def __init__(self, net: nn.Module) -> None:
        super().__init__()
        self.net = net

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        logits = self.net(x)
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1))


def build(spec: ModelSpec) -> nn.Module:
    if isinstance(spec, MLPSpec):
        return MLP(spec)
    return Llama(spec) if isinstance(spec, LlamaSpec) else GPT(spec)


def _torch_name(canonical: str) -> tuple[str, bool]:
    """(torch state-dict key, whether the array is transposed)."""
    if canonical in ("wte", "wpe"):
        return canonical + ".weight", False
    if canonical.endswith(".scale"):
        return canonical[: -len(".scale")] + ".weight", False
    return canonical, canonical.endswith(".weight")


def canonical_from_state(state: dict[str, torch.Tensor], names: list[str], prefix: str = ""
                         ) -> dict[str, np.ndarray]:
    """The canonical float32 arrays of a full torch state (keys under `prefix`), the inverse
    of load_canonical's mapping."""
    out = {}
    for name in names:
        key, transpose = _torch_name(name)
        value = state[prefix + key].detach().cpu().float().numpy()
        out[name] = np.ascontiguousarray(value.T if transpose else value)
    return out


def load_canonical(net: nn.Module, params: dict[str, np.ndarray]) -> None:
    state = {}
    for name, value in params.items():
        key, transpose = _torch_name(name)
        state[key] = torch.from_numpy(np.ascontiguousarray(value.T if transpose else value))
    if "head.weight" not in state and "wte" in params:  # tied: the head is the embedding
        state["head.weight"] = state["wte.weight"]
    net.load_state_dict(state, strict=True)


def canonical_names(net: nn.Module, params: dict[str, np.ndarray]) -> dict[str, str]:
    """torch parameter name -> canonical name."""
    return {_torch_name(name)[0]: name for name in params}


def export_canonical(net: nn.Module, names: list[str]) -> dict[str, np.ndarray]:
    state = net.state_dict()
    out = {}
    for name in names:
        key, transpose = _torch_name(name)
        value = state[key].detach().cpu().numpy()
        out[name] = np.ascontiguousarray(value.T if transpose else value)
    return out
