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
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from sextant.planner import efficiency
from sextant.planner.context import layout_context, links
from sextant.planner.hardware import (
    Hardware,
    attention_kernel,
    head_flops_per_token,
    kernel_seconds,
    per_device_peak,
    resolve_hardware,
)
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
    optimizer_term,
    pp_term,
    tp_hidden_term,
    tp_term,
)

__all__ = [
    "COMPONENTS", "KNOBS", "OFFLOAD", "RECOMPUTE", "Hardware", "Layout", "PlanOptions",
    "attention_kernel", "check_layout", "evaluate", "evaluate_one", "head_flops_per_token",
    "kernel_seconds", "overhead_cause", "per_device_peak", "resolve_hardware", "solve_mfu",
    "with_options",
]

COMPONENTS = (
    "compute", "optimizer", "tp_comm", "cp_comm", "ep_comm", "pp_comm", "bubble", "dp_exposed"
)

CHUNK = 16384  # rows per pass: keeps numpy temporaries in cache (about 1.5x faster)


def evaluate(
    cost: ModelCost,
    hw: Hardware,
    opts: PlanOptions,
    lay: dict[str, np.ndarray],
    keys: tuple[str, ...] | None = None,
) -> dict[str, np.ndarray]:
    """Memory and time of every layout in `lay` (arrays of equal length; see KNOBS).
    `keys` limits the figures returned (the search keeps three for a million rows)."""
    rows = len(lay["dp"])
    if rows <= CHUNK:
        res = _evaluate(cost, hw, opts, lay)
        return res if keys is None else {k: res[k] for k in keys}
    parts = []
    for i in range(0, rows, CHUNK):
        res = _evaluate(cost, hw, opts, {k: v[i : i + CHUNK] for k, v in lay.items()})
        parts.append(res if keys is None else {k: res[k] for k in keys})
    return {k: np.concatenate([part[k] for part in parts]) for k in parts[0]}


def _evaluate(
    cost: ModelCost, hw: Hardware, opts: PlanOptions, lay: dict[str, np.ndarray]
) -> dict[str, np.ndarray]:
    c = layout_context(cost, hw, opts, lay)
    lk = links(c)
    mem = memory_term(c)
    load = host_load_term(c, mem.host_per_node)
    comp = compute_term(c)
    t_opt = optimizer_term(c)
    t_tp, t_cp, t_ep, t_pp = tp_term(c, lk), cp_term(c, lk, comp.peak), ep_term(c, lk), pp_term(c, lk)
    tp_hidden = tp_hidden_term(c, t_tp, comp.seconds)
    t_tp = t_tp - tp_hidden
    t_bubble = bubble_term(c, comp.seconds + t_tp + t_cp + t_ep + t_pp)
    dp = dp_term(c, lk, comp.seconds - tp_hidden)
    step = comp.seconds + t_opt + t_tp + t_cp + t_ep + t_pp + t_bubble + dp.exposed
    tokens_per_s = c.tokens_step / step
    per_peak = tokens_per_s / (c.n * hw.accelerator.peak(opts.precision))
    psi = mem.psi_worst
    return {
        "devices": c.n,
        "microbatches": c.m,
        "fits": mem.fits & load.fits,
        "memory": mem.memory,
        "capacity": mem.capacity,
        "mem_params": psi * mem.coef["params"],
        "mem_grads": psi * mem.coef["grads"],
        "mem_optimizer": psi * mem.coef["optimizer"],
        "mem_host": psi * mem.coef["host"],
        "host_per_node": mem.host_per_node,
        "host_load_per_rank": load.per_rank,
        "host_load_per_node": load.per_node,
        "mem_gather": mem.gather,
        "mem_activations": mem.activations,
        "mem_overhead": mem.memory - mem.raw,
        "params_per_device": c.psi_stage,
        "compute": comp.seconds,
        "compute_flops_bound": comp.flops_bound,
        "compute_scaled_bound": comp.scaled_bound,
        "compute_memory_ops": comp.memory_ops,
        "compute_memory_bound": comp.weights_bound,
        "optimizer": t_opt,
        "tp_comm": t_tp,
        "cp_comm": t_cp,
        "ep_comm": t_ep,
        "pp_comm": t_pp,
        "bubble": t_bubble,
        "dp_comm": dp.seconds,
        "dp_exposed": dp.exposed,
        "step": step,
        "step_no_overlap": step + dp.hidden,
        "tokens_per_s": tokens_per_s,
        "mfu": cost.model_flops_per_token * per_peak,
        "hfu": comp.hw_flops_per_token * per_peak,
        "hw_flops_per_token": comp.hw_flops_per_token * np.ones_like(c.n),
        "tp_inter": c.tp_out > 1,
        "dp_inter": c.dp_out > 1,
        "pp_inter": (c.n > c.g) & c.multi,
        "offload": c.off >= 1,
        "weights_bound": comp.weights_bound > comp.flops_bound + comp.memory_ops,
    }


def overhead_cause(res: dict[str, np.ndarray], i: int, hw: Hardware) -> tuple[str, float]:
    """The largest non-compute part of row i's step, named with the link it runs on."""
    parts = {
        "tp_comm": res["tp_comm"][i],
        "cp_comm": res["cp_comm"][i],
        "ep_comm": res["ep_comm"][i],
        "pp_comm": res["pp_comm"][i],
        "bubble": res["bubble"][i],
        "dp_exposed": res["dp_exposed"][i],
        "optimizer": res["optimizer"][i],
    }
    key = max(parts, key=lambda k: parts[k])
    share = float(parts[key] / res["step"][i])
    if key == "bubble":
        return "pipeline bubble", share
    if key == "optimizer":
        return (
            "CPU offload (host link and host optimizer step)"
            if bool(res["offload"][i])
            else "optimizer step"
        ), share
    if key in ("cp_comm", "ep_comm"):
        what = "context-parallel K/V exchange" if key == "cp_comm" else "expert all-to-alls"
        return what, share
    inter_flag = {"tp_comm": "tp_inter", "pp_comm": "pp_inter", "dp_exposed": "dp_inter"}[key]
    crosses = bool(res[inter_flag][i])
    link = hw.inter if crosses else hw.intra
    what = {
        "tp_comm": "TP all-reduces",
        "pp_comm": "pipeline sends",
        "dp_exposed": "exposed DP sync",
    }[key]
    bw = hw.inter_bw_per_device if crosses else hw.intra.bandwidth
    where = "inter-node" if crosses else "intra-node"
    if hw.torus is not None:
        # A slice's groups each have the bandwidth of the ICI axes they lie on (the plan's
        # slice line gives it); between slices, the data-centre network.
        where = "between slices" if crosses else "the slice's ICI axes"
        if not crosses:
            return f"{what} on {link.key} ({where})", share
    return f"{what} on {link.key} ({where}, {bw / 1e9:.3g} GB/s/device)", share


@dataclass(kw_only=True, slots=True)
class Evaluated:
    """One layout's figures as plain Python numbers."""

    layout: Layout
    figures: dict[str, Any] = field(default_factory=dict)


def evaluate_one(cost: ModelCost, hw: Hardware, opts: PlanOptions, layout: Layout) -> Evaluated:
    res = evaluate(cost, hw, opts, layout.arrays())
    figures = {k: (bool(v[0]) if v.dtype == bool else float(v[0])) for k, v in res.items()}
    cause, share = overhead_cause(res, 0, hw)
    figures["overhead_cause"] = cause
    figures["overhead_share"] = share
    return Evaluated(layout=layout, figures=figures)


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
    ceiling = float(evaluate_one(cost, hw, replace(given, compute_efficiency=1.0), layout)
                    .figures["mfu"])
    if opts.target_mfu is None:
        return MfuSolution(options=given, reachable=True, ceiling=ceiling)
    current = given
    for _ in range(iterations):
        f = evaluate_one(cost, hw, current, layout).figures
        bubble_share = f["bubble"] / max(f["compute"] + f["tp_comm"] + f["pp_comm"], 1e-300)
        flops_part = 0.0 if f["weights_bound"] else f["compute_scaled_bound"] * (1 + bubble_share)
        new = efficiency.solve_for_mfu(
            f["mfu"], opts.target_mfu, flops_part / f["step"], current.compute_efficiency
        )
        if not math.isfinite(new) or new > 1.0:
            return MfuSolution(options=given, reachable=False, ceiling=ceiling)
        current = replace(current, compute_efficiency=float(new))
    return MfuSolution(options=current, reachable=True, ceiling=ceiling)


