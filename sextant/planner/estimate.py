"""The estimator: memory, step time and throughput of layouts, vectorised with numpy.

`evaluate` takes a table of layouts (one numpy array per knob) and returns one array per
figure; a single plan is a table of one row. The search, the scaling curve and `sextant plan`
therefore use the same arithmetic.

Step time (per optimizer step, on the slowest device):

    compute   = max(FLOPs / (peak * efficiency), weight bytes / memory bandwidth)   roofline
    tp        = per micro-batch and layer, 4 all-reduces of the layer's activations
                (2 forward, 2 backward; +2 with full recomputation): Shoeybi et al. 2019 §3;
                with sequence parallelism they become all-gather + reduce-scatter pairs of the
                same volume (Korthikanti et al. 2022 §4.2.2); plus, per micro-batch, the
                vocabulary-parallel embedding's and output layer's all-reduces of the
                activations and the cross-entropy's three per-token reductions
    pp        = 2 point-to-point sends per micro-batch and model chunk (forward activations,
                backward gradients), scattered over the TP ranks (Narayanan et al. 2021 §4.1)
    bubble    = (p - 1) / (v * m) * (compute + tp + pp)       Narayanan et al. 2021 §2.2
    dp        = gradient all-reduce (ZeRO-0), reduce-scatter + all-gather (ZeRO-1/2, the
                reduce-scatter once per micro-batch for ZeRO-2) or, per micro-batch, two
                parameter all-gathers and one gradient reduce-scatter (ZeRO-3/FSDP): ZeRO §7
    exposed dp = dp - min(overlap * dp, window), the window being the backward pass the
                communication can hide behind (last micro-batch for ZeRO-0/1, every backward
                for ZeRO-2, the whole forward and backward for ZeRO-3)
    optimizer = memory-bound update of the local optimizer shard; with CPU offload, PCIe
                traffic of gradients and parameters plus the update at host-memory speed
"""

from __future__ import annotations

import math
from typing import Any
from dataclasses import dataclass, replace

import numpy as np

from sextant.planner import efficiency
from sextant.planner.context import LayoutContext, layout_context, links
from sextant.planner.hardware import (
    Hardware,
    attention_kernel,
    head_flops_per_token,
    kernel_seconds,
    per_device_peak,
    resolve_hardware,
)
from sextant.planner.evaluation import (
    ComputeFigures,
    Evaluation,
    HostFigures,
    MemoryPart,
    Ranking,
    StepPart,
    concatenate,
    sum_parts,
    tree_map,
)
from sextant.planner.finetune import adapted
from sextant.planner.layout import KNOBS, OFFLOAD, RECOMPUTE, Layout, check_layout
from sextant.planner.models import ModelCost
from sextant.planner.options import PlanOptions, with_options
from sextant.planner.terms import (
    bubble_term,
    compute_term,
    cp_term,
    dp_term,
    ep_term,
    host_load_term,
    memory_term,
    MemoryTerm,
    optimizer_term,
    pp_term,
    tp_hidden_term,
    tp_term,
)

__all__ = [
    "KNOBS", "OFFLOAD", "RECOMPUTE", "Hardware", "Layout", "PlanOptions",
    "attention_kernel", "check_layout", "evaluate", "evaluate_one", "head_flops_per_token",
    "kernel_seconds", "overhead_cause", "per_device_peak", "rank", "resolve_hardware", "solve_mfu",
    "with_options",
]

CHUNK = 16384  # rows per pass: keeps numpy temporaries in cache (about 1.5x faster)


def evaluate(
    cost: ModelCost, hw: Hardware, opts: PlanOptions, lay: dict[str, np.ndarray]
) -> Evaluation:
    """Memory and time of every layout in `lay` (arrays of equal length; see KNOBS)."""
    rows = len(lay["dp"])
    if rows <= CHUNK:
        return _evaluate(cost, hw, opts, lay)
    return concatenate([
        _evaluate(cost, hw, opts, {k: v[i : i + CHUNK] for k, v in lay.items()})
        for i in range(0, rows, CHUNK)
    ])


def rank(cost: ModelCost, hw: Hardware, opts: PlanOptions, lay: dict[str, np.ndarray]
         ) -> Ranking:
    """What the search ranks by, for a table of any length (a million rows keep three
    figures, chunk by chunk)."""
    rows = len(lay["dp"])
    parts = [
        _evaluate(cost, hw, opts, {k: v[i : i + CHUNK] for k, v in lay.items()}).ranking()
        for i in range(0, rows, CHUNK)
    ]
    if len(parts) == 1:
        return parts[0]
    return tree_map(lambda *a: np.concatenate(a), *parts)


def _evaluate(
    cost: ModelCost, hw: Hardware, opts: PlanOptions, lay: dict[str, np.ndarray]
) -> Evaluation:
    """The fold: each term of terms.py over one LayoutContext, gathered into named parts.
    The step is the parts' sum in this order."""
    cost = adapted(cost, opts.finetune, opts.precision)
    c = layout_context(cost, hw, opts, lay)
    lk = links(c)
    mem = memory_term(c)
    load = host_load_term(c, mem.host_per_node)
    comp = compute_term(c)
    t_tp, t_cp, t_ep, t_pp = tp_term(c, lk), cp_term(c, lk, comp.peak), ep_term(c, lk), pp_term(c, lk)
    tp_hidden = tp_hidden_term(c, t_tp, comp.seconds)
    t_tp = t_tp - tp_hidden
    dp = dp_term(c, lk, comp.seconds - tp_hidden)
    parts = _step_parts(c, comp.seconds, optimizer_term(c), t_tp, t_cp, t_ep, t_pp, dp.exposed)
    step = sum_parts(parts)
    tokens_per_s = c.tokens_step / step
    per_peak = tokens_per_s / (c.n * hw.accelerator.peak(opts.precision))
    return Evaluation(
        devices=c.n,
        microbatches=c.m,
        params_per_device=c.psi_stage,
        memory_parts=_memory_parts(mem),
        memory=mem.memory,
        capacity=mem.capacity,
        fits=mem.fits & load.fits,
        host=HostFigures(offload=mem.psi_worst * mem.coef["host"], per_node=mem.host_per_node,
                         load_per_rank=load.per_rank, load_per_node=load.per_node),
        compute=ComputeFigures(
            flops_bound=comp.flops_bound, scaled_bound=comp.scaled_bound,
            memory_ops=comp.memory_ops, weights_bound=comp.weights_bound,
            hw_flops_per_token=comp.hw_flops_per_token * np.ones_like(c.n),
        ),
        step_parts=parts,
        step=step,
        dp_comm=dp.seconds,
        step_no_overlap=step + dp.hidden,
        tokens_per_s=tokens_per_s,
        mfu=cost.model_flops_per_token * per_peak,
        mfu_6n=(cost.model_flops_per_token - cost.attention_flops_per_token) * per_peak,
        hfu=comp.hw_flops_per_token * per_peak,
        offload=c.off >= 1,
        weights_bound=comp.weights_bound > comp.flops_bound + comp.memory_ops,
    )


def _step_parts(c: LayoutContext, t_compute: Any, t_opt: Any, t_tp: Any, t_cp: Any,
                t_ep: Any, t_pp: Any, t_dp: Any) -> tuple[StepPart, ...]:
    """The step's parts in the order they are added, each with the link it runs on; the
    pipeline bubble idles for (p - 1) / (v m) of the work of every part before it but the
    optimizer step."""
    parts = (
        StepPart(name="compute", label="compute", cause="compute", seconds=t_compute),
        StepPart(name="optimizer", label="optimizer step / offload", cause="optimizer step",
                 seconds=t_opt),
        StepPart(name="tp_comm", label="tensor-parallel communication", cause="TP all-reduces",
                 seconds=t_tp, crosses=c.tp_out > 1, names_link=True),
        StepPart(name="cp_comm", label="context-parallel K/V exchange (exposed)",
                 cause="context-parallel K/V exchange", seconds=t_cp),
        StepPart(name="ep_comm", label="expert all-to-alls", cause="expert all-to-alls",
                 seconds=t_ep),
        StepPart(name="pp_comm", label="pipeline sends", cause="pipeline sends", seconds=t_pp,
                 crosses=(c.n > c.g) & c.multi, names_link=True, point_to_point=True),
    )
    work = sum_parts(p for p in parts if p.name != "optimizer")
    return parts + (
        StepPart(name="bubble", label="pipeline bubble", cause="pipeline bubble",
                 seconds=bubble_term(c, work)),
        StepPart(name="dp_exposed", label="exposed data-parallel communication",
                 cause="exposed DP sync", seconds=t_dp, crosses=c.dp_out > 1, names_link=True),
    )


def _memory_parts(mem: MemoryTerm) -> tuple[MemoryPart, ...]:
    psi = mem.psi_worst
    return (
        MemoryPart(name="params", label="parameters", bytes=psi * mem.coef["params"]),
        MemoryPart(name="grads", label="gradients", bytes=psi * mem.coef["grads"]),
        MemoryPart(name="optimizer", label="optimizer state", bytes=psi * mem.coef["optimizer"]),
        MemoryPart(name="zero3_buffers", label="ZeRO-3 gathered layers", bytes=mem.gather),
        MemoryPart(name="ddp_buckets", label="DDP gradient buckets", bytes=mem.buckets),
        MemoryPart(name="activations", label="activations", bytes=mem.activations),
        MemoryPart(name="allowance", label="allowance (fragmentation + runtime)",
                   bytes=mem.memory - mem.raw),
    )


def overhead_cause(ev: Evaluation, i: int, hw: Hardware) -> tuple[str, float]:
    """The largest non-compute part of row i's step, named with the link it runs on."""
    return ev.row(i).overhead(hw)


def evaluate_one(cost: ModelCost, hw: Hardware, opts: PlanOptions, layout: Layout
                 ) -> Evaluation:
    """One layout's Evaluation, its figures Python numbers."""
    return evaluate(cost, hw, opts, layout.arrays()).row(0)


@dataclass(frozen=True, slots=True)
class MfuSolution:
    """The kernel efficiency that makes a layout reach a requested end-to-end MFU, or, when
    none <= 1 can, the options unchanged and the MFU the layout reaches at most."""

    options: PlanOptions
    """With the solved kernel efficiency and no target (unreachable: as given)."""
    reachable: bool
    ceiling: float
    """The layout's end-to-end MFU with its kernels at 100 % of peak."""


def solve_mfu(
    cost: ModelCost, hw: Hardware, opts: PlanOptions, layout: Layout, iterations: int = 6
) -> MfuSolution:
    """Solve the kernel efficiency for opts.target_mfu on `layout`. Never refuses: when no
    efficiency <= 1 reaches the target (the rest of the step, communication, bubble and
    memory-bound work, is too long), the options stay as given and `reachable` is False."""
    given = replace(opts, target_mfu=None)
    ceiling = float(evaluate_one(cost, hw, replace(given, compute_efficiency=1.0), layout).mfu)
    if opts.target_mfu is None:
        return MfuSolution(options=given, reachable=True, ceiling=ceiling)
    current = given
    for _ in range(iterations):
        f = evaluate_one(cost, hw, current, layout)
        bubble_share = f.seconds("bubble") / max(
            f.seconds("compute") + f.seconds("tp_comm") + f.seconds("pp_comm"), 1e-300)
        flops_part = 0.0 if f.weights_bound else f.compute.scaled_bound * (1 + bubble_share)
        new = efficiency.solve_for_mfu(
            f.mfu, opts.target_mfu, flops_part / f.step, current.compute_efficiency
        )
        if not math.isfinite(new) or new > 1.0:
            return MfuSolution(options=given, reachable=False, ceiling=ceiling)
        current = replace(current, compute_efficiency=float(new))
    return MfuSolution(options=current, reachable=True, ceiling=ceiling)


