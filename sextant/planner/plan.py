"""One plan: the layout (given or searched), its memory and time, the training time and cost,
the scaling curve and the warnings, gathered into a Plan (plan_doc.py) that the tables read
and `--json` prints."""

from __future__ import annotations

import time
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from sextant.core.errors import UserError
from sextant.planner import topology
from sextant.planner.calibration_doc import DeviceSection
from sextant.planner.catalogue import Catalogue
from sextant.planner.estimate import (
    OFFLOAD,
    RECOMPUTE,
    Hardware,
    Layout,
    PlanOptions,
    check_layout,
    evaluate_one,
    solve_mfu,
)
from sextant.planner.evaluation import Evaluation
from sextant.planner.finetune import adapted
from sextant.planner.memory import model_of
from sextant.planner.models import MLPShape, ModelCost, TransformerShape
from sextant.planner.plan_doc import (
    finetune_section,
    CurvePoint,
    MfuTarget,
    Part,
    Plan,
    ScalePoint,
    Scaling,
    Search,
    Slices,
    Training,
    Why,
    assumptions_section,
    hardware_section,
    layout_summary,
    memory_section,
    model_summary,
    search_row,
    throughput_section,
    time_section,
)
from sextant.planner.search import (
    SearchResult,
    divisors,
    knee,
    scaling_curve,
    search,
    starts_below,
)

SLOW_NETWORK_BPS = 10e9 / 8  # 10 Gb/s
Pin = int | str | bool
"""A pinned layout knob's value (a Layout field: degrees, the recompute and offload names,
sequence parallelism and hybrid sharding on or off)."""


@dataclass(kw_only=True, slots=True)
class PlanRequest:
    """What `sextant plan` was asked."""

    shape: TransformerShape | MLPShape
    devices: int
    accelerator: str
    network: str | None = None
    intra_link: str | None = None
    options: PlanOptions
    pinned: dict[str, Pin] = field(default_factory=dict)
    """Layout knobs the user fixed (Layout field names); the rest is searched."""
    tokens: float | None = None
    """Tokens to train, for time and cost."""
    price_per_hour: float | None = None
    goodput: float = 1.0
    """Share of wall-clock time spent training (failures, restarts, checkpoints excluded)."""
    threshold: float = 0.8
    """Scaling efficiency below which the curve's knee is reported."""
    top: int = 0
    """Rows of the ranked search to include (0: none)."""
    curve: bool = True
    batch_given: bool = True
    """False when the global batch is the model's default (no --global-batch): on a TPU the
    plan may then round it to what the chips split without a pipeline (_torus_batch)."""
    calibrated: DeviceSection | None = None
    """The calibration's device section whose kernel efficiency and bus bandwidth the plan
    uses (`sextant calibrate --device gpu` on this accelerator); None: the catalogue's."""


_PIN_TO_KNOB = {
    "dp": "dp",
    "tp": "tp",
    "pp": "pp",
    "zero": "zero",
    "mbs": "mbs",
    "recompute": "rc",
    "sp": "sp",
    "offload": "off",
    "interleave": "v",
    "hsdp": "hs",
    "cp": "cp",
    "ep": "ep",
}


def _pins_as_knobs(pinned: dict[str, Pin]) -> dict[str, int]:
    """The pins as the search's table columns (estimate.KNOBS), the named choices as their
    index."""
    out = {}
    for key, value in pinned.items():
        if key in ("recompute", "offload"):
            out[_PIN_TO_KNOB[key]] = (RECOMPUTE if key == "recompute" else OFFLOAD).index(
                str(value))
        else:
            out[_PIN_TO_KNOB[key]] = int(value)
    return out


def _best_or_smallest(result: Any) -> int:
    """The best fitting layout, or, when none fits, the one closest to fitting."""
    best = result.best()
    return int(np.argmin(result.figures.memory)) if best is None else best


def _solve_target(
    cost: ModelCost, hw: Hardware, opts: PlanOptions, devices: int, knobs: dict[str, int],
    layout: Layout, result: Any,
) -> tuple[Layout, PlanOptions, MfuTarget, SearchResult]:
    """--mfu: solve the kernel efficiency on the chosen layout, search again with it (the
    ranking can change), and solve once more on the new choice. An unreachable target is
    answered, not refused: the best layout at the given kernel efficiency, the MFU it
    reaches and what limits it. Returns the layout, the solved options, the goal's document
    and the last search (whose ranking the plan shows)."""
    target = opts.target_mfu
    given = replace(opts, target_mfu=None)
    first = layout  # the best at the given kernel efficiency
    for _ in range(2):
        solved = solve_mfu(cost, hw, replace(given, target_mfu=target), layout)
        if not solved.reachable:
            break
        result = search(cost, hw, solved.options, devices, fixed=knobs)
        layout = result.layout(_best_or_smallest(result))
        given = solved.options
    solved = solve_mfu(cost, hw, replace(given, target_mfu=target), layout)
    if not solved.reachable:
        layout = first
        solved = solve_mfu(cost, hw, replace(opts, target_mfu=target), layout)
    goal = MfuTarget(requested=float(target or 0.0), reachable=solved.reachable,
                     ceiling=solved.ceiling)
    return layout, solved.options, goal, result


TORUS_BATCH_SLACK = 1.25
"""How far above the model's global batch a TPU plan may round it (_torus_batch)."""


def _torus_batch(
    cost: Any, hw: Hardware, opts: PlanOptions, devices: int, knobs: dict[str, int],
    result: Any,
) -> tuple[Any, str | None]:
    """On a TPU the global batch is a per-chip batch times the chips (MaxText's
    per_device_batch_size, which may be a fraction when tensor parallelism shares a
    sequence among chips). When the model's batch does not split over the chips without a
    pipeline (2,048 sequences over 8,960 v5p chips), the plan takes, for each tensor-parallel
    degree, the next batch that the data-parallel chips split evenly, keeps those within
    TORUS_BATCH_SLACK of the model's, and answers with the fastest; the note says so.
    Returns the search to use and the note (None: the model's batch stays)."""
    base = opts.global_batch
    batches = set()
    for tp in divisors(devices):
        if cost.n_heads % tp == 0 and knobs.get("tp", tp) == tp:
            data = devices // tp
            batches.add(-(-base // data) * data)
    best: tuple[float, Any] | None = None
    for batch in sorted(b for b in batches if base < b <= TORUS_BATCH_SLACK * base):
        trial = search(cost, hw, replace(opts, global_batch=batch), devices, fixed=knobs)
        i = trial.best()
        if i is not None and (best is None or trial.figures.tokens_per_s[i] > best[0]):
            best = (float(trial.figures.tokens_per_s[i]), trial)
    if best is None:
        return result, None
    chosen = best[1]
    batch = chosen.opts.global_batch
    return chosen, (
        f"global batch {batch} sequences instead of the model's {base}: {base} does not "
        f"split over {devices} chips without a pipeline; a TPU job's batch is a per-chip "
        f"batch ({batch / devices:g}) times its chips (MaxText's per_device_batch_size)"
    )


def _slices(hw: Hardware, devices: int, layout: Layout) -> Slices | None:
    """On a TPU: the slices, the shape of one, and the ICI axes each group of the layout
    lies on (topology.describe); None elsewhere."""
    if hw.torus is None:
        return None
    chips = int(hw.node_size(devices))
    data_in = max(min(chips // (layout.tp * layout.cp), layout.dp), 1)
    groups = {"tp": layout.tp, "cp": layout.cp, "dp": data_in}
    return Slices(
        count=devices // chips,
        chips=chips,
        shape=tuple(topology.slice_shape(chips, hw.torus.pod, hw.torus.wrap_unit) or ()),
        ici=topology.describe(hw.torus, chips, groups),
        dcn_dp=max(layout.dp // data_in, 1),
    )


def make_plan(req: PlanRequest, cat: Catalogue, hw: Hardware) -> Plan:
    """The plan of `req` on `hw`: the layout (searched around the pins), its memory and step,
    the training time and cost, the scaling curve and the notes."""
    cost = _check_request(req, hw)
    knobs = _pins_as_knobs(req.pinned)
    started = time.perf_counter()
    result, req, batch_note = _searched(req, cost, hw, knobs)
    search_s = time.perf_counter() - started
    layout = result.layout(_best_or_smallest(result))
    check_layout(cost, layout, req.devices, req.options.global_batch)
    opts, goal = req.options, None
    if opts.target_mfu is not None:
        layout, opts, goal, result = _solve_target(
            cost, hw, opts, req.devices, knobs, layout, result
        )
        req = replace(req, options=replace(opts, target_mfu=goal.requested))
    ev = evaluate_one(cost, hw, opts, layout)
    tokens_step = opts.global_batch * cost.tokens_per_sample
    warnings = _warnings(req, cat, hw, ev, layout, 1.0 if goal is None else goal.ceiling)
    if batch_note:
        warnings.insert(0, batch_note)
    best = _best_or_smallest(result)
    plan = Plan(
        model=model_summary(req.shape, cost),
        hardware=hardware_section(hw, cat, req.devices, opts.precision, ev.capacity,
                                  _slices(hw, req.devices, layout)),
        assumptions=assumptions_section(
            opts, hw, None if req.calibrated is None else req.calibrated.device_name,
            req.options.target_mfu, tokens_step),
        mfu_target=None if goal is None else replace(
            goal, reached=ev.mfu, limit=_mfu_limit(ev, hw)[0], limit_share=_mfu_limit(ev, hw)[1]),
        layout=layout_summary(layout),
        layout_searched=tuple(sorted(set(_PIN_TO_KNOB) - set(req.pinned))),
        memory=memory_section(ev),
        time=time_section(ev, hw),
        throughput=throughput_section(ev, cost, req.devices, tokens_step),
        search=Search(
            layouts_evaluated=result.count, layouts_fitting=result.fitting, seconds=search_s,
            top=tuple(search_row(result.layout(int(i)).label(), result.row(int(i)))
                      for i in result.order[: req.top]),
            why=_why(result, best) if req.top else None,
        ),
        warnings=warnings,
        training=_training(req, cat, hw.accelerator.key, ev, tokens_step),
        finetune=finetune_section(opts.finetune, cost, opts.precision),
    )
    if req.curve:
        plan = replace(plan, scaling=_scaling(req, cost, hw, opts, knobs, result, warnings))
    return plan


def _check_request(req: PlanRequest, hw: Hardware) -> ModelCost:
    """The request's own checks; the model's cost."""
    if isinstance(req.devices, bool) or not isinstance(req.devices, int) or req.devices < 1:
        raise UserError(f"--gpus must be an integer >= 1. Received: {req.devices!r}")
    if req.pinned.get("offload", "none") != "none" and hw.host is None:
        raise UserError(
            f"{hw.accelerator.key} keeps tensors in host memory already: --offload does not "
            "apply (use --offload none)"
        )
    return adapted(req.shape.cost(flash_attention=req.options.flash_attention),
                   req.options.finetune, req.options.precision)


def _searched(req: PlanRequest, cost: ModelCost, hw: Hardware, knobs: dict[str, int]
              ) -> tuple[SearchResult, PlanRequest, str | None]:
    """The search around the pins (on a TPU, at a rounded batch when the model's does not
    split: _torus_batch); a clear error when no layout is valid. Returns the search, the
    request with the batch it used, and the note that says why the batch changed."""
    opts = req.options
    result = search(cost, hw, opts, req.devices, fixed=knobs)
    batch_note = None
    if result.best() is None and hw.torus is not None and not req.batch_given:
        result, batch_note = _torus_batch(cost, hw, opts, req.devices, knobs, result)
        opts = result.opts
        req = replace(req, options=opts)
    if result.count == 0 and hw.torus is not None and "pp" not in req.pinned:
        raise UserError(
            f"no layout of {cost.name} on {req.devices} {hw.accelerator.key} chips splits the "
            f"global batch {opts.global_batch} without a pipeline (tensor and context "
            "parallelism inside a slice, data parallelism across slices); give a "
            "--global-batch that the chips divide, or pin --pp"
        )
    if result.count == 0:
        # Nothing valid: let the layout checks say why, with the numbers.
        pins: dict[str, Any] = dict(req.pinned)  # Layout checks each value
        guess = replace(Layout(dp=_default_dp(req.devices, req.pinned)), **pins)
        check_layout(cost, guess, req.devices, opts.global_batch)
        raise UserError(
            f"no valid layout of {cost.name} on {req.devices} devices with global batch "
            f"{opts.global_batch} and {req.pinned or 'no pinned knobs'}; the data-parallel "
            "degree must divide the global batch (try --global-batch)"
        )
    return result, req, batch_note


def _scaling(req: PlanRequest, cost: ModelCost, hw: Hardware, opts: PlanOptions,
             knobs: dict[str, int], result: SearchResult, warnings: list[str]) -> Scaling:
    """The best layout at 1, 2, 4, ... devices; a note (into `warnings`) where more devices
    are slower than fewer."""
    started = time.perf_counter()
    same_pins = not any(k in knobs for k in ("dp", "pp", "tp", "cp"))
    points = scaling_curve(
        cost, hw, opts, req.devices, fixed=knobs, known=result if same_pins else None
    )

    def point(p: Any) -> CurvePoint | None:
        return None if p is None else CurvePoint(
            devices=p.devices, efficiency=p.efficiency, cause=p.cause, shortfall=p.shortfall,
            threshold=req.threshold)

    previous = None
    for p in points:
        if p.layout is None:
            continue
        if previous is not None and p.tokens_per_s < previous.tokens_per_s * 0.995:
            warnings.append(
                f"{p.devices} devices are slower than {previous.devices} "
                f"({p.tokens_per_s:,.0f} vs {previous.tokens_per_s:,.0f} tokens/s): "
                f"{p.cause}"
            )
            break
        previous = p
    return Scaling(
        points=tuple(
            ScalePoint(devices=p.devices, layout=p.layout.label() if p.layout else None,
                       tokens_per_s=p.tokens_per_s, speedup=p.speedup, efficiency=p.efficiency,
                       mfu=p.mfu, main_overhead=p.cause, overhead_share=p.cause_share)
            for p in points
        ),
        threshold=req.threshold,
        knee=point(knee(points, req.threshold)),
        starts_below=point(starts_below(points, req.threshold)),
        seconds=time.perf_counter() - started,
    )


def _default_dp(devices: int, pinned: dict[str, Pin]) -> int:
    tp, pp, cp = int(pinned.get("tp", 1)), int(pinned.get("pp", 1)), int(pinned.get("cp", 1))
    return max(devices // max(tp * pp * cp, 1), 1)


def _why(result: SearchResult, best: int) -> Why | None:
    """Why the chosen layout beats the runner-up: the per-part step-time differences, the
    part that decides, and the memory headroom of both."""
    fitting = [int(i) for i in result.order if bool(result.figures.fits[int(i)])]
    others = [i for i in fitting if i != best]
    if best not in fitting or not others:
        return None
    a, b = result.row(best), result.row(others[0])
    diffs = tuple(Part(name=pa.name, label=pa.label, value=float(pb.seconds - pa.seconds))
                  for pa, pb in zip(a.step_parts, b.step_parts, strict=True))
    decisive = max(diffs, key=lambda d: d.value)
    headroom = (float(a.capacity - a.memory), float(b.capacity - b.memory))
    step_a, step_b = float(a.step), float(b.step)
    gains = [d for d in sorted(diffs, key=lambda d: -d.value) if d.value > 0]
    costs = [d for d in sorted(diffs, key=lambda d: d.value) if d.value < 0]
    text = (
        f"{result.layout(best).label()} beats the runner-up {result.layout(others[0]).label()} "
        f"by {step_b / step_a - 1:.1%} of step time ({step_a:.3g} s vs {step_b:.3g} s): "
        + "; ".join(f"{d.label} {d.value:+.3g} s for the runner-up" for d in gains[:2])
        + ("" if not costs else "; it pays "
           + ", ".join(f"{d.label} {-d.value:.3g} s more" for d in costs[:2]))
        + f". Decisive term: {decisive.label}. Memory headroom {headroom[0] / 1e9:.1f} GB "
        f"vs {headroom[1] / 1e9:.1f} GB per device."
    )
    return Why(runner_up=result.layout(others[0]).label(), step=step_a, runner_up_step=step_b,
               differences=diffs, decisive=decisive.name, headroom_chosen=headroom[0],
               headroom_runner_up=headroom[1], text=text)


def _training(
    req: PlanRequest, cat: Catalogue, acc_key: str, ev: Evaluation, tokens_step: int
) -> Training | None:
    if not req.tokens:
        return None
    if req.tokens <= 0:
        raise UserError(f"--tokens must be > 0. Received: {req.tokens}")
    # Wall time = training time / goodput (the share of wall time that trains: failures,
    # restarts and checkpoints take the rest; Llama 3 reports > 90%, docs/planner.md).
    seconds = req.tokens / ev.tokens_per_s / req.goodput
    hours = seconds / 3600
    price = req.price_per_hour if req.price_per_hour is not None else cat.price(acc_key)
    return Training(
        tokens=req.tokens,
        steps=req.tokens / tokens_step,
        seconds=seconds,
        days=seconds / 86400,
        device_hours=hours * req.devices,
        days_no_overlap=req.tokens / (tokens_step / ev.step_no_overlap) / 86400 / req.goodput,
        goodput=req.goodput,
        price_per_device_hour=price,
        price_basis="given with --price-per-hour" if req.price_per_hour is not None
        else f"{cat.price_basis} ({cat.price_date})",
        cost_usd=None if price is None else hours * req.devices * price,
    )


def _mfu_limit(ev: Evaluation, hw: Hardware) -> tuple[str, float]:
    """What keeps a layout's MFU down beyond its kernels' rate: the largest part of the step
    that a faster kernel does not shorten (the largest overhead, or the memory-bound work of
    the compute: weight reads, GEMM operands and elementwise kernels)."""
    memory_bound = max(ev.compute.memory_ops, ev.seconds("compute") - ev.compute.flops_bound)
    share = memory_bound / ev.step
    cause, cause_share = ev.overhead(hw)
    if share > cause_share:
        return "memory-bound kernels (weight reads, GEMM operands, elementwise traffic)", share
    return cause, cause_share


def _warnings(
    req: PlanRequest, cat: Catalogue, hw: Hardware, ev: Evaluation, layout: Layout,
    ceiling_mfu: float = 1.0,
) -> list[str]:
    """The plan's notes: memory, the hardware's figures, the step's overheads, then how the
    kernel efficiency was chosen."""
    return (
        _memory_warnings(req, hw, ev, layout)
        + _hardware_warnings(req, hw, layout)
        + _step_warnings(ev, hw)
        + [_efficiency_note(req, hw, ev, layout, ceiling_mfu)]
    )


def _memory_warnings(
    req: PlanRequest, hw: Hardware, ev: Evaluation, layout: Layout
) -> list[str]:
    out: list[str] = []
    ram = req.options.host_memory_gb
    if not ev.fits and ev.memory <= ev.capacity and ram is not None:
        out.append(
            f"does not fit host memory: {ram:,.0f} GB per node (--host-memory-gb), "
            f"{ev.host.load_per_node / 1e9:,.1f} GB to build the model (stack "
            f"{req.options.stack.name} loads it in fp32 on every rank; a stack that builds "
            f"each rank's shard on the device needs none) and "
            f"{ev.host.per_node / 1e9:,.1f} GB offloaded (no valid layout fits; shown: "
            "the smallest)"
        )
    elif not ev.fits:
        out.append(
            f"does not fit: {ev.memory / 1e9:,.1f} GB needed per device, "
            f"{ev.capacity / 1e9:,.1f} GB available (no valid layout fits; shown: the "
            "smallest)"
        )
    if req.options.stack.zero3_gather == "tensor" and layout.zero < 3:
        out.append(
            f"--zero3-gather tensor changes nothing here: the layout uses ZeRO-{layout.zero} "
            "(pin --zero 3 to price per-tensor gathers)"
        )
    note = model_of(req.options.stack.memory_model).note
    if note:
        out.append(note)
    return out


def _hardware_warnings(req: PlanRequest, hw: Hardware, layout: Layout) -> list[str]:
    out: list[str] = []
    acc = hw.accelerator
    node = int(hw.node_size(req.devices))
    if req.devices > node and hw.inter_bw_per_device < SLOW_NETWORK_BPS:
        out.append(
            f"inter-node bandwidth {hw.inter_bw_per_device * 8 / 1e9:.3g} Gb/s per device is "
            "below 10 Gb/s: data-parallel synchronisation will dominate large models"
        )
    if layout.tp > node:
        out.append(
            f"tensor parallelism ({layout.tp}) spans nodes: its all-reduces run on {hw.inter.key}"
        )
    if not acc.verified:
        out.append(f"{acc.key}: catalogue figures are not vendor-published ({acc.source})")
    # On a TPU slice the collectives run at the torus' hop latency (the catalogue's `ici`
    # table), not at the ICI link entry's.
    used = [hw.inter] if hw.torus is not None else [hw.intra, hw.inter]
    for link in {lk.key: lk for lk in used}.values():
        if link.latency_assumed:
            out.append(f"{link.key}: latency not published, assumed")
        if not link.achievable_published and hw.torus is None and (
                link is hw.intra or req.devices > node):
            out.append(
                f"{link.key}: no published collective benchmark in the catalogue, so its "
                f"collectives are priced at the nominal {link.bandwidth / 1e9:.3g} GB/s, "
                "which nccl-tests runs do not reach: communication is optimistic (measure "
                "yours with sextant calibrate, or give --link-efficiency)")
    return out


def _step_warnings(ev: Evaluation, hw: Hardware) -> list[str]:
    out: list[str] = []
    step = ev.step
    exposed = ev.exposed_communication
    if exposed > 0.25 * step:
        out.append(
            f"exposed communication is {exposed / step:.0%} of the step ({ev.overhead(hw)[0]})"
        )
    if ev.seconds("bubble") > 0.2 * step:
        out.append(
            f"pipeline bubble is {ev.seconds('bubble') / step:.0%} of the step: more "
            "micro-batches (larger global batch or smaller micro-batch) or an interleaved "
            "schedule help"
        )
    if ev.weights_bound:
        out.append(
            "compute is bound by weight reads (micro-batch too small for the memory "
            "bandwidth): a larger micro-batch helps"
        )
    return out


def _efficiency_note(
    req: PlanRequest, hw: Hardware, ev: Evaluation, layout: Layout, ceiling_mfu: float
) -> str:
    """Where the kernel efficiency comes from: measured, solved for --mfu (reached or not),
    or the stated assumption."""
    opts = req.options
    if hw.accelerator.measured:
        return (
            "this machine's peak is a measured GEMM rate (sextant calibrate); "
            "compute efficiency is relative to it"
        )
    if opts.target_mfu is not None and ev.mfu < 0.999 * opts.target_mfu:
        limit, share = _mfu_limit(ev, hw)
        return (
            f"an end-to-end MFU of {opts.target_mfu:.0%} (--mfu) is out of reach: "
            f"the best layout, {layout.label()}, reaches {ev.mfu:.1%} at kernel "
            f"efficiency {opts.compute_efficiency:.2f} and at most "
            f"{ceiling_mfu:.1%} with kernels at 100% of peak; what limits it: "
            f"{limit} ({share:.0%} of the step)"
        )
    if opts.target_mfu is not None:
        return (
            f"kernel efficiency {opts.compute_efficiency:.2f} of peak was solved so "
            f"that this layout reaches the requested end-to-end MFU "
            f"{opts.target_mfu:.0%} (--mfu)"
        )
    cal = req.calibrated
    if cal and opts.compute_efficiency == min(cal.kernel_efficiency, 1.0):
        ar = cal.allreduce
        bus = (f"; intra-node all-reduce bus bandwidth "
               f"{ar.plateau_busbw_bytes_per_s / 1e9:.0f} GB/s measured "
               f"between {ar.world} devices" if ar else "")
        return (
            f"kernel efficiency {opts.compute_efficiency:.2f} of peak measured by sextant "
            f"calibrate on {cal.device_name} over the GEMMs of {cal.workload} at "
            f"{cal.tokens} tokens{bus}"
        )
    return (
        f"kernel efficiency {opts.compute_efficiency:.2f} of peak is an "
        "assumption (--kernel-efficiency; or --mfu for an end-to-end MFU); published "
        "reference points: docs/validation.md"
    )
