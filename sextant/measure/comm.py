"""Bytes each rank sends per optimizer step, from the strategy (ring algorithms).

For a payload of S bytes over n ranks, a ring all-reduce sends 2(n-1)/n * S per rank, a
reduce-scatter or all-gather (n-1)/n * S (the nccl-tests bus-bandwidth factors). The payload
is the gradient (or parameter) bytes: 4 per fp32 parameter, 2 with 16-bit compression.
"""

from __future__ import annotations

from typing import Any


def bytes_per_step(strategy: Any, params: int, powersgd_payload: int | None = None
                   ) -> dict[str, float] | None:
    """{'all_reduce': ..., 'reduce_scatter': ..., 'all_gather': ..., 'total': ...} sent per
    rank per step, or None for strategies without gradient collectives."""
    n = strategy.replicas
    if strategy.parallel in ("single", "ps") or n < 2:
        return None
    full = 4.0 * params
    grad = {"none": full, "bf16": full / 2, "fp16": full / 2}.get(strategy.compress)
    if strategy.compress == "powersgd":
        grad = float(powersgd_payload) if powersgd_payload is not None else None
    ring, shard = 2 * (n - 1) / n, (n - 1) / n
    out = {"all_reduce": 0.0, "reduce_scatter": 0.0, "all_gather": 0.0}
    if strategy.parallel in ("dp", "dp-manual"):
        out["all_reduce"] = ring * grad if grad is not None else float("nan")
    elif strategy.parallel == "zero1":
        out["all_reduce"] = ring * grad if grad is not None else float("nan")
        out["all_gather"] = shard * full  # updated parameter shards, back to every rank
    elif strategy.parallel == "zero2":
        out["reduce_scatter"] = shard * full
        out["all_gather"] = shard * full * strategy.grad_accum  # once per forward
    elif strategy.parallel == "fsdp":
        out["reduce_scatter"] = shard * full
        out["all_gather"] = 2 * shard * full * strategy.grad_accum  # forward and backward
    out["total"] = sum(out.values())
    return out
