"""The canonical models as torch modules, and the mapping from canonical parameters.

Canonical dense weights are (in, out); nn.Linear stores (out, in), so they are transposed on
the way in and out. LayerNorm's canonical `scale` is torch's `weight`.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from sextant.workload import GPTSpec, MLPSpec, ModelSpec

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
        q, k, v = self.attn.qkv(self.ln1(x)).split(C, dim=-1)
        # (B, T, C) -> (B, nh, T, hs)
        q, k, v = (t.view(B, T, self.n_heads, C // self.n_heads).transpose(1, 2) for t in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.attn.proj(y.transpose(1, 2).reshape(B, T, C))
        h = F.gelu(self.mlp.fc(self.ln2(x)), approximate="tanh")
        return x + self.mlp.proj(h)


class GPT(nn.Module):
    def __init__(self, spec: GPTSpec) -> None:
        super().__init__()
        self.wte = nn.Embedding(spec.vocab_size, spec.d_model)
        self.wpe = nn.Embedding(spec.seq_len, spec.d_model)
        self.blocks = nn.ModuleList(Block(spec) for _ in range(spec.n_layers))
        self.ln_f = nn.LayerNorm(spec.d_model, eps=LAYER_NORM_EPS)
        self.head = nn.Linear(spec.d_model, spec.vocab_size, bias=False)
        self.register_buffer("positions", torch.arange(spec.seq_len), persistent=False)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:  # (B, T) -> (B, T, V)
        x = self.wte(idx) + self.wpe(self.positions[: idx.shape[1]])
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln_f(x))


class WithLoss(nn.Module):
    """Model + mean cross-entropy, so that compile and DDP see one module returning the loss."""

    def __init__(self, net: nn.Module) -> None:
        super().__init__()
        self.net = net

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        logits = self.net(x)
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1))


def build(spec: ModelSpec) -> nn.Module:
    return MLP(spec) if isinstance(spec, MLPSpec) else GPT(spec)


def _torch_name(canonical: str) -> tuple[str, bool]:
    """(torch state-dict key, whether the array is transposed)."""
    if canonical in ("wte", "wpe"):
        return canonical + ".weight", False
    if canonical.endswith(".scale"):
        return canonical[: -len(".scale")] + ".weight", False
    return canonical, canonical.endswith(".weight")


def load_canonical(net: nn.Module, params: dict[str, np.ndarray]) -> None:
    state = {}
    for name, value in params.items():
        key, transpose = _torch_name(name)
        state[key] = torch.from_numpy(np.ascontiguousarray(value.T if transpose else value))
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
