"""Named evaluators for the published reference figures (sextant/planner/references.toml).

A reference record names one evaluator and gives it a query (plain TOML values); the
evaluator returns the planner's figure for that query. Evaluators hold no published numbers
and no hardware figures: those live in the reference records and the catalogue. The settings
a source leaves unstated (micro-batch size, interleaving, cluster size) are stated in each
record, never tuned to reduce the error.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import replace
from functools import cache
from typing import Any

from sextant.core.errors import UserError
from sextant.planner import comms
from sextant.planner.catalogue import Catalogue, Link, Table, fit_ramp, load_catalogue
from sextant.planner.estimate import Layout, PlanOptions, evaluate_one, resolve_hardware
from sextant.planner.evaluation import Evaluation
from sextant.planner.finetune import FineTune, adapted
from sextant.planner.memory import model_state_bytes, transient_param_bytes
from sextant.planner.models import ModelCost, TransformerShape, megatron_gpt, preset
from sextant.planner.profiles import default_stack, profile
from sextant.planner.search import MAX_MICRO_BATCH, divisors, search

Evaluator = Callable[..., float]
EVALUATORS: dict[str, Evaluator] = {}


def evaluator(fn: Evaluator) -> Evaluator:
    EVALUATORS[fn.__name__] = fn
    return fn


@cache
def _cat() -> Catalogue:
    return load_catalogue(calibration=None)


def _fields(table: Table) -> dict[str, Any]:
    """A record's table as keyword arguments: where the file's untyped values meet the typed
    dataclasses, which check each one (Layout, TransformerShape, PlanOptions)."""
    return dict(table)


def _layout(spec: Table) -> Layout:
    return Layout(**_fields(spec))


def _shape(model: str | Table, batch: int | None = None) -> TransformerShape:
    """A preset by name, or a shape given field by field (a record's own `model` table)."""
    if isinstance(model, str):
        shape = preset(model)
    elif "preset" in model:
        shape = replace(preset(str(model["preset"])),
                        **{k: v for k, v in _fields(model).items() if k != "preset"})
    elif model.get("family") == "megatron-gpt":
        shape = megatron_gpt(**{k: v for k, v in _fields(model).items() if k != "family"})
    else:
        shape = TransformerShape(**_fields(model))
    if batch is not None:
        shape = replace(shape, global_batch=batch)
    return shape


def _megatron_eq3_flops(shape: TransformerShape, batch: int) -> float:
    """FLOPs of one step as Narayanan et al. 2021 count them (eq. 3, with the recomputation
    forward pass): 96 B s l h^2 (1 + s/6h + V/16lh)."""
    s, layers, h, v = shape.seq_len, shape.n_layers, shape.d_model, shape.vocab_size
    return 96 * batch * s * layers * h * h * (1 + s / (6 * h) + v / (16 * layers * h))


# --- formula-defined figures ------------------------------------------------------------------


@evaluator
def model_states_gb(*, params: float, dp: int = 1, zero: int = 0) -> float:
    """Model states per device (mixed-precision Adam, K = 12), GB."""
    return float(model_state_bytes(params, dp, zero)["total"]) / 1e9


@evaluator
def weights_gb(*, params: float) -> float:
    """16-bit weights, GB."""
    return float(model_state_bytes(params)["params"]) / 1e9


@evaluator
def parameters_b(
    *, model: str | Table, part: str = "total", unit: float = 1e9
) -> float:
    """Parameters of a model in `unit`s (billions by default): total, or active per token
    (MoE)."""
    shape = _shape(model)
    if part == "active":
        return shape.active_params() / unit
    return shape.total_params() / unit


@evaluator
def six_nd_flop(*, model: str, tokens: float, unit: float = 1.0) -> float:
    """Training compute as 6 N D, in `unit` FLOPs."""
    return 6.0 * _shape(model).total_params() * tokens / unit


@evaluator
def days_at_mfu(*, model: str, tokens: float, accelerator: str, devices: int, mfu: float) -> float:
    """Days to train on `tokens` at a given MFU (6 N D over the catalogue's bf16 peak)."""
    peak = _cat().accelerator(accelerator).peak_flops["bf16"]
    return 6.0 * _shape(model).total_params() * tokens / (devices * peak * mfu) / 86400


@evaluator
def state_bytes_per_param(*, stack: str, precision: str, zero: int, dp: int = 8) -> float:
    """Bytes per parameter of a stack's allocation at a ZeRO stage (1: Megatron-Core's
    distributed optimizer)."""
    mm = profile(stack).memory_model
    return float(model_state_bytes(1, dp, zero, precision=precision, memory_model=mm)["total"])


@evaluator
def model_states_on_device_gb(
    *, stack: str, model: str, zero: int, offload: int, devices: int
) -> float:
    """Device memory for model states under a stack's allocation, with the transient
    gathered parameters it counts (DeepSpeed's estimators: the largest layer)."""
    mm = profile(stack).memory_model
    cost = _shape(model).cost()
    states = model_state_bytes(cost.total_params, devices, zero, offload=offload, memory_model=mm)
    extra = transient_param_bytes(
        cost.layer_params, cost.n_layers, zero, memory_model=mm,
        largest_module_params=cost.largest_module_params,
    )
    return float(states["total"] + extra) / 1e9


@evaluator
def lora_states_gb(*, model: str | Table, rank: int, targets: list[str], base_dtype: str,
                   part: str = "states") -> float:
    """LoRA's model states over the whole job, GB: the frozen base's weights in its dtype
    plus the adapters' weights, gradients and optimizer state (mixed-precision Adam, K = 12;
    finetune.py). `part` "checkpoint": the adapters alone, saved in the base's dtype."""
    ft = FineTune(method="lora", rank=rank, targets=tuple(targets), base_dtype=base_dtype)
    cost = adapted(_shape(model).cost(), ft, "bf16")
    if part == "checkpoint":
        return cost.adapter_params * cost.frozen_bytes / 1e9
    return (cost.total_params * cost.frozen_bytes
            + float(model_state_bytes(cost.adapter_params)["total"])) / 1e9


# --- Megatron-LM on Selene ----------------------------------------------------------------------


def interleaves(n_layers: int, layout: Layout, batch: int) -> list[int]:
    """Model chunks per stage (v > 1: interleaved) Megatron-LM accepts for this layout: v
    divides the layers of a stage (--num-layers-per-virtual-pipeline-stage) and the
    micro-batches per step are a multiple of p (Narayanan et al. 2021 §2.2.2); [1] when no
    v > 1 does (no pipeline, one layer per stage)."""
    p = layout.pp
    m = batch // (layout.dp * layout.mbs)
    if p == 1 or n_layers % p or m % p:
        return [1]
    per_stage = n_layers // p
    return [v for v in range(2, per_stage + 1) if per_stage % v == 0] or [1]


def megatron_choice(
    shape: TransformerShape,
    layout: Layout,
    batch: int,
    *,
    recompute: str = "full",
    sp: bool = False,
    interleave: int | str = 1,
    overlap: float = 0.5,
    stack: str = "megatron-lm-2021",
    micro_batch: str = "layout",
    accelerator: str = "a100-80gb",
    network: str = "ib-hdr",
) -> tuple[float, int, int]:
    """(step time, micro-batch size, v): the planner's step time for a Megatron-LM run (2021-22
    stack: no FlashAttention, layers split evenly: profile megatron-lm-2021, or deepspeed-0.3
    for its ZeRO-3 runs), with the micro-batch size and v it ran.
    `interleave` "searched": the schedule was interleaved but the source does not state v, so
    the fastest valid v > 1 is taken. `micro_batch` "searched": the source does not state the
    micro-batch size either, so the fastest that fits of those the planner's own search tries
    (the divisors of the rank's share of the batch, up to MAX_MICRO_BATCH) is taken, with v
    searched for each; "layout" keeps the layout's."""
    opts = PlanOptions(
        global_batch=batch, flash_attention=False, overlap=overlap, stack=profile(stack),
        compute_efficiency=_cat().accelerator(accelerator).kernel_efficiency,
    )
    hw = resolve_hardware(_cat(), accelerator, network, options=opts)
    per_rank = batch // layout.dp
    sizes = (
        [b for b in divisors(per_rank) if b <= MAX_MICRO_BATCH]
        if micro_batch == "searched"
        else [layout.mbs]
    )
    cost = shape.cost(flash_attention=False)
    steps = []
    for mbs in sizes:
        sized = replace(layout, mbs=mbs)
        chunks = (
            interleaves(shape.n_layers, sized, batch) if interleave == "searched"
            else [interleave]
        )
        for v in chunks:
            f = evaluate_one(
                cost, hw, opts,
                replace(sized, recompute=recompute, sp=sp, interleave=int(v)),
            )
            if f.fits or micro_batch == "layout":
                steps.append((float(f.step), mbs, int(v)))
    if not steps:
        raise UserError(f"reference setting does not fit at any micro-batch size: {shape.name}")
    return min(steps)


@evaluator
def megatron_tflops(
    *, model: Table, layout: Table, batch: int, **options: Any
) -> float:
    """TFLOP/s per GPU of a Megatron-LM run as Narayanan et al. count it (eq. 3) over the
    planner's step time."""
    shape = _shape(model, batch)
    lay = _layout(layout)
    step = megatron_choice(shape, lay, batch, **options)[0]
    return _megatron_eq3_flops(shape, batch) / (step * lay.devices) / 1e12


@evaluator
def megatron_days(
    *, model: Table, layout: Table, batch: int, tokens: float, **options: Any
) -> float:
    """Days to train on `tokens` at the planner's step time for a Megatron-LM run."""
    shape = _shape(model, batch)
    step = megatron_choice(shape, _layout(layout), batch, **options)[0]
    return tokens / (batch * shape.seq_len / step) / 86400


@evaluator
def pinned_ratio(*, numerator: Table, denominator: Table) -> float:
    """The ratio of two pinned runs' figures (a published speed-up)."""
    return pinned(**numerator) / pinned(**denominator)


# --- searched and pinned layouts -----------------------------------------------------------


def _options(batch: int, options: Table, accelerator: str) -> PlanOptions:
    """PlanOptions from a record's `options` table; its `stack` names a profile, else the
    accelerator's default (default_stack: maxtext on a TPU), `elementwise` ("fused" or
    "eager") overrides its elementwise kernels; the kernel efficiency the
    accelerator's published GEMM rate where it has one (Accelerator.kernel_efficiency)."""
    rest = {k: v for k, v in _fields(options).items()
            if k not in ("stack", "elementwise", "finetune")}
    if "finetune" in options:
        rest["finetune"] = _finetune(options["finetune"])
    acc = _cat().accelerator(accelerator)
    rest.setdefault("compute_efficiency", acc.kernel_efficiency)
    name = str(options.get("stack") or default_stack(acc))
    elementwise = options.get("elementwise")
    stack = profile(name).with_overrides(
        fused_elementwise=None if elementwise is None else elementwise == "fused")
    return PlanOptions(global_batch=batch, stack=stack, **rest)


def _finetune(spec: Any) -> FineTune:
    """A record's `finetune` table (FineTune's fields, `targets` a list)."""
    values = _fields(spec)
    if "targets" in values:
        values["targets"] = tuple(values["targets"])
    return FineTune(**values)


def _hardware(accelerator: str, network: str, opts: PlanOptions, overrides: Table):
    hw = resolve_hardware(_cat(), accelerator, network, options=opts)
    if not overrides:
        return hw
    acc = hw.accelerator
    given = _fields(overrides)
    if "peak_of" in given:
        acc = replace(acc, peak_flops=dict(_cat().accelerator(str(given["peak_of"])).peak_flops))
    if "memory_gib" in given:
        acc = replace(acc, memory_bytes=float(given["memory_gib"]) * 2**30)
    if "memory_bw_gbs" in given:
        acc = replace(acc, memory_bw=float(given["memory_bw_gbs"]) * 1e9)
    return replace(hw, accelerator=acc)


FIGURES = ("step", "tokens_per_s", "mfu", "mfu_6n", "hfu", "memory")
"""Figures of an Evaluation a record may name, besides the per-device ones below."""

MFU_CONVENTIONS = {
    "mfu": "PaLM's (Chowdhery et al. 2022, appendix B): 6 x the parameters a token passes "
    "through but the input embedding, + 12 L H Q T for the attention (no causal half)",
    "mfu_6n": "6N: 6 x those parameters, the attention left out",
    "mfu_maxtext_2023": "MaxText's train.py calculate_training_tflops at commit ebb226da8 "
    "(2023-10-24, the v5e table's commit): 6 x every parameter (the input embedding "
    "included) + 12 L H Q T",
    "mfu_maxtext_2024": "MaxText's maxtext_utils.py calculate_tflops_training_per_device at "
    "commit 04262f3cf (2024-03-22, the v5p table's commit): 6 x every parameter + half of "
    "12 L H Q T ('due to causality in attention')",
}
"""How a source counts the model FLOPs of its MFU: the figure its records name."""


def _figure(f: Evaluation, figure: str, devices: int, cost: ModelCost | None = None
            ) -> float:
    """One figure of an evaluated layout, per device where the source counts per device;
    an MFU in the source's own convention (MFU_CONVENTIONS)."""
    if figure == "tokens_per_s_per_device":
        return float(f.tokens_per_s) / devices
    if figure == "memory_gib":
        return float(f.memory) / 2**30
    if figure == "memory_gb":
        return float(f.memory) / 1e9
    if figure in ("mfu_maxtext_2023", "mfu_maxtext_2024") and cost is not None:
        attention = cost.attention_flops_per_token
        if figure == "mfu_maxtext_2024":
            attention = attention / 2.0
        flops = 6.0 * cost.total_params + attention
        return float(f.mfu) * flops / cost.model_flops_per_token
    if figure not in FIGURES:
        allowed = ", ".join(sorted([*FIGURES, *MFU_CONVENTIONS, "tokens_per_s_per_device",
                                    "memory_gib", "memory_gb"]))
        raise UserError(f"unknown figure {figure!r}; allowed: {allowed}")
    return float(getattr(f, figure))


@evaluator
def pinned(
    *,
    model: str | Table,
    layout: Table,
    accelerator: str,
    network: str,
    batch: int,
    figure: str,
    options: Table | None = None,
    hardware: Table | None = None,
    flops: str = "",
) -> float:
    """A figure of the planner for a published layout (nothing searched). `flops`
    "megatron-eq3" gives TFLOP/s per device as Narayanan et al. count them."""
    opts = _options(batch, options or {}, accelerator)
    hw = _hardware(accelerator, network, opts, hardware or {})
    shape = _shape(model, batch)
    lay = _layout(layout)
    cost = shape.cost(flash_attention=opts.flash_attention)
    f = evaluate_one(cost, hw, opts, lay)
    if flops == "megatron-eq3":
        return _megatron_eq3_flops(shape, batch) / (float(f.step) * lay.devices) / 1e12
    return _figure(f, figure, lay.devices, cost)


def best(
    model: str | Table,
    devices: int,
    accelerator: str,
    network: str,
    *,
    batch: int | None = None,
    fixed: dict[str, int] | None = None,
    options: Table | None = None,
) -> Evaluation:
    """The Evaluation of the fastest fitting layout the search finds."""
    shape = _shape(model, batch)
    opts = _options(shape.global_batch, options or {}, accelerator)
    hw = resolve_hardware(_cat(), accelerator, network, options=opts)
    res = search(shape.cost(flash_attention=opts.flash_attention), hw, opts, devices, fixed=fixed)
    found = res.best()
    if found is None:
        raise UserError(f"reference setting does not fit: {shape.name} on {devices} {accelerator}")
    return res.row(found)


@evaluator
def searched(
    *,
    model: str | Table,
    devices: int,
    accelerator: str,
    network: str,
    figure: str,
    batch: int | None = None,
    fixed: dict[str, int] | None = None,
    options: Table | None = None,
) -> float:
    """A figure of the best layout the planner's search finds (`fixed` pins knobs)."""
    f = best(model, devices, accelerator, network, batch=batch, fixed=fixed, options=options)
    return _figure(f, figure, devices, _shape(model, batch).cost())


@evaluator
def searched_tokens_days(
    *,
    model: str | Table,
    devices: int,
    accelerator: str,
    network: str,
    tokens: float,
    batch: int | None = None,
    fixed: dict[str, int] | None = None,
    options: Table | None = None,
) -> float:
    """Days to train on `tokens` with the best layout the search finds."""
    f = best(model, devices, accelerator, network, batch=batch, fixed=fixed, options=options)
    return tokens / f.tokens_per_s / 86400


@evaluator
def gpu_hours(
    *,
    model: str,
    devices: int,
    accelerator: str,
    network: str,
    tokens: float,
    goodput: float,
) -> float:
    """Device-hours to train on `tokens` with the best layout, at a stated goodput (published
    totals are wall time)."""
    f = best(model, devices, accelerator, network)
    return tokens / f.tokens_per_s * devices / 3600 / goodput


@evaluator
def megatron_eq3_tflops(
    *,
    model: Table,
    layout: Table,
    accelerator: str,
    network: str,
    batch: int,
    options: Table | None = None,
) -> float:
    """TFLOP/s per device as Narayanan et al. count them (eq. 3) for a pinned layout."""
    return pinned(
        model=model, layout=layout, accelerator=accelerator, network=network, batch=batch,
        figure="step", options=options, flops="megatron-eq3",
    )


# --- collectives ----------------------------------------------------------------------------


def _leave_one_out(link: Link, payload: float, intra: Link) -> Link:
    """The link with its ramp refitted without the sweep point at `payload`: the row then
    tests the interpolation between the neighbouring published points, not the point the
    ramp was fitted to."""
    kept = tuple(pt for pt in link.sweep if pt[0] != payload)
    if not link.sweep or len(kept) == len(link.sweep):
        return link
    trimmed = replace(link, sweep=kept)
    return replace(trimmed, ramp=fit_ramp(trimmed, intra))


@evaluator
def all_reduce_busbw_gbs(
    *,
    accelerator: str,
    network: str,
    ranks_per_node: int,
    nodes: int,
    payload_bytes: float,
    nics_per_node: int | None = None,
) -> float:
    """All-reduce bus bandwidth as nccl-tests reports it (2 (n-1)/n x size / time), GB/s,
    from the planner's collective cost on the catalogue's links, with the measured point
    itself left out of the fitted ramp. `nics_per_node`: the nodes' network ports where they
    have fewer than one per device (the catalogue's networks have one)."""
    opts = PlanOptions(nics_per_node=nics_per_node)
    hw = resolve_hardware(_cat(), accelerator, network, options=opts)
    a, b = hw.intra, hw.inter
    if nodes > 1:
        b = _leave_one_out(b, payload_bytes, _cat().link(b.sweep_intra_link or a.key))
    else:
        a = _leave_one_out(a, payload_bytes, a)
    intra = (a.collective_bandwidth, a.latency, a.call_latency, a.ramp)
    inter = (hw.inter_coll_bw_per_device, b.latency, b.call_latency, b.ramp)
    t = float(comms.hier_all_reduce(payload_bytes, ranks_per_node, nodes, intra, inter))
    n = ranks_per_node * nodes
    return 2.0 * (n - 1) / n * payload_bytes / t / 1e9


def evaluate(name: str, query: Table) -> float:
    """The planner's figure for one record: evaluator `name` applied to `query`."""
    fn = EVALUATORS.get(name)
    if fn is None:
        raise UserError(f"unknown evaluator {name!r}; allowed: {', '.join(sorted(EVALUATORS))}")
    value = float(fn(**query))
    if not math.isfinite(value):
        raise UserError(f"evaluator {name} gave a non-finite figure for {query!r}")
    return value
