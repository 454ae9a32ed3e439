"""Memory per device: model states under data parallelism / ZeRO / FSDP, and activations.

Every function takes numbers or numpy arrays (broadcasting), so that the same formula serves
one plan and a million-layout search.

Model states (Rajbhandari et al. 2020, "ZeRO: Memory Optimizations Toward Training Trillion
Parameter Models", §3.1 and §5): mixed-precision Adam keeps 2 bytes of fp16/bf16 parameters,
2 bytes of gradients and K = 12 bytes of optimizer state (fp32 master copy, momentum and
variance) per parameter: 16 bytes. Plain fp32 Adam keeps 4 + 4 + 8 = 16 bytes as well.
ZeRO stage 1 partitions the optimizer state over the N_d data-parallel ranks, stage 2 also the
gradients, stage 3 also the parameters (FSDP FULL_SHARD is stage 3; SHARD_GRAD_OP is stage 2):

    stage 0 (DDP): (2 + 2 + K) * Psi
    stage 1:       (2 + 2) * Psi + K * Psi / N_d
    stage 2:        2 * Psi + (2 + K) * Psi / N_d
    stage 3:       (2 + 2 + K) * Psi / N_d
"""

from __future__ import annotations

import numpy as np

from sextant.errors import UserError

# Bytes per parameter: (parameters, gradients, optimizer state).
STATE_BYTES: dict[tuple[str, str], tuple[int, int, int]] = {
    ("mixed", "adam"): (2, 2, 12),  # fp32 master + m + v (ZeRO §3.1, K = 12)
    ("fp32", "adam"): (4, 4, 8),  # m + v
    ("mixed", "sgd"): (2, 2, 8),  # fp32 master + momentum
    ("fp32", "sgd"): (4, 4, 4),  # momentum
}
OPTIMIZERS = ("adam", "sgd")


def state_bytes(precision: str, optimizer: str = "adam") -> tuple[int, int, int]:
    """(param, grad, optimizer) bytes per parameter; 'bf16' and 'fp16' are mixed precision."""
    kind = "fp32" if precision == "fp32" else "mixed"
    if precision not in ("bf16", "fp16", "fp32", "mixed"):
        raise UserError(f"unknown precision {precision!r}; allowed: bf16, fp16, fp32")
    if optimizer not in OPTIMIZERS:
        raise UserError(f"unknown optimizer {optimizer!r}; allowed: {', '.join(OPTIMIZERS)}")
    return STATE_BYTES[(kind, optimizer)]


def model_state_bytes(
    params, dp=1, zero=0, *, precision: str = "bf16", optimizer: str = "adam", offload=0
) -> dict[str, np.ndarray]:
    """Per-device bytes of parameters, gradients and optimizer state (ZeRO §5).

    `params` is the parameter count this device holds before data-parallel sharding (the
    whole model, or its tensor/pipeline shard). `offload` 1 moves the optimizer state to host
    memory (ZeRO-Offload, Ren et al. 2021), 2 the parameters as well (ZeRO-Infinity,
    Rajbhandari et al. 2021). Returns device bytes per component plus `host`.
    """
    pb, gb, ob = state_bytes(precision, optimizer)
    psi = np.asarray(params, dtype=np.float64)
    dp = np.asarray(dp, dtype=np.float64)
    zero = np.asarray(zero)
    offload = np.asarray(offload)
    p = pb * psi / np.where(zero >= 3, dp, 1.0)
    g = gb * psi / np.where(zero >= 2, dp, 1.0)
    o = ob * psi / np.where(zero >= 1, dp, 1.0)
    host = np.where(offload >= 1, o, 0.0) + np.where(offload >= 2, p, 0.0)
    o_dev = np.where(offload >= 1, 0.0, o)
    p_dev = np.where(offload >= 2, 0.0, p)
    return {
        "params": p_dev,
        "grads": g,
        "optimizer": o_dev,
        "host": host,
        "total": p_dev + g + o_dev,
    }


def activation_bytes_per_layer(cost, tokens, tp=1, sp=0, recompute=0, act_scale=1.0):
    """Activation bytes one transformer layer keeps for one micro-batch of `tokens` tokens.

    Korthikanti et al. 2022, Table 2 (16-bit activations, `act_scale` 2 for fp32), written
    per term (see ModelCost): with t = tp,
        no recomputation:        tokens * (R / (t if SP else 1) + S / t + A / t)
        selective recomputation: tokens * (R / (t if SP else 1) + S / t)
        full recomputation:      tokens * 2h / (t if SP else 1)   (the layer input only)
    For a GPT layer R = 10h, S = 24h, A = 5as, which gives the paper's sbh(34 + 5as/h),
    sbh(10 + 24/t + 5as/ht), sbh(34/t + 5as/ht), sbh(10 + 24/t), sbh(34/t) and 2sbh.
    """
    tokens = np.asarray(tokens, dtype=np.float64)
    t = np.asarray(tp, dtype=np.float64)
    sp_div = np.where(np.asarray(sp) > 0, t, 1.0)
    recompute = np.asarray(recompute)
    rep = cost.act_replicated / sp_div
    full = tokens * (rep + cost.act_split / t + cost.act_scores / t)
    selective = tokens * (rep + cost.act_split / t)
    checkpoint = tokens * cost.act_checkpoint / sp_div
    out = np.where(recompute == 0, full, np.where(recompute == 1, selective, checkpoint))
    return out * act_scale


def pipeline_inflight(pp, microbatches, interleave=1):
    """Micro-batches whose activations the first pipeline stage holds at once.

    1F1B (PipeDream-Flush, Narayanan et al. 2021 §2.2.1): the first stage keeps min(p, m)
    micro-batches in flight, so it stores the activations of about L layers whatever p is
    (Korthikanti et al. 2022 §4.2.3). The interleaved schedule with v chunks per device needs
    (1 + (p - 1) / (p v)) times that (Korthikanti §4.2.3).
    """
    pp = np.asarray(pp, dtype=np.float64)
    v = np.asarray(interleave, dtype=np.float64)
    base = np.minimum(pp, np.asarray(microbatches, dtype=np.float64))
    return base * np.where(v > 1, 1.0 + (pp - 1.0) / (pp * v), 1.0)
