"""Bytes each rank sends per step, from the strategy (ring algorithms).

The collectives each strategy issues and their ring factors live in one place,
sextant.measure.collective_table (`dp_collectives` / `dp_bytes_sent`; the planner reads the
same table); this module only maps a run's strategy onto it. The payload is the gradient (or parameter)
bytes: 4 per fp32 parameter, 2 with 16-bit compression of the gradients.
"""

from __future__ import annotations

import math
from typing import Any

from sextant.measure.collective_table import dp_bytes_sent, dp_collectives
from sextant.strategy import Strategy

# The backends reduce once per step under accumulation (no_sync /
# set_requires_gradient_sync(False)): the "torch-no-sync" schedule.
SCHEDULE = "torch-no-sync"


def bytes_per_step(strategy: Strategy, params: int, powersgd_payload: int | None = None
                   ) -> dict[str, float] | None:
    """{'all_reduce': ..., 'reduce_scatter': ..., 'all_gather': ..., 'total': ...} sent per
    rank per step, or None for strategies without gradient collectives."""
    dims = strategy.dims()
    n, zero, accum = dims.dp, dims.zero, dims.grad_accum
    if zero is None or n < 2:  # one replica, or no ZeRO-style data parallelism (ps, tp, pp)
        return None
    full = 4.0 * params
    grad = {"none": full, "bf16": full / 2, "fp16": full / 2}.get(strategy.compress)
    if strategy.compress == "powersgd":
        grad = float(powersgd_payload) if powersgd_payload is not None else None
    payload = math.nan if grad is None else grad  # PowerSGD without a measured payload
    sent = dp_bytes_sent(zero, n, payload, full, microbatches=accum, schedule=SCHEDULE)
    counts = dp_collectives(zero, accum, SCHEDULE)
    out = {k: float(sent[k]) if float(counts[k]) else 0.0 for k in counts}
    out["total"] = sum(out.values())
    return out


def megatron_tp_payload(workload: Any, strategy: Strategy) -> dict[str, float] | None:
    """The planner's tensor-parallel term as bytes: per transformer layer and micro-batch,
    four all-reduces (two forward, two backward: after the row-parallel attention output
    and down projection, and their conjugates) of one activation, tokens x d_model x 4 bytes
    in fp32 (sextant.planner.estimate, `m_tp`; Megatron-LM, Shoeybi et al. 2019, Fig. 3).
    The all-reduce payload of one data-parallel replica's step; None without tp.
    It leaves out the vocabulary-parallel embedding and head, which sextant's runs also
    split (their collectives show in the measured figure beside it)."""
    if strategy.tp < 2:
        return None
    model = workload.model
    tokens = workload.global_batch // strategy.replicas * model.seq_len
    return {"all_reduce": 4.0 * model.n_layers * tokens * model.d_model * 4}
