"""The plan as typed data: `make_plan` returns a Plan, the tables read its fields and
`--json` prints `dataclasses.asdict(plan)`, one name per figure. Each section is built here
from the chosen layout's Evaluation (estimate.py); the step and memory tables are the
Evaluation's parts, each carrying the link it runs on."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from sextant.planner.catalogue import Catalogue
from sextant.planner.estimate import Hardware, Layout, PlanOptions, attention_kernel
from sextant.planner.evaluation import Evaluation, StepPart
from sextant.planner.finetune import FineTune
from sextant.planner.models import ModelCost


@dataclass(frozen=True, slots=True)
class ModelSummary:
    name: str
    family: str
    params: float
    shape: str
    """The shape in words (layers, widths, heads, vocabulary, sequence)."""
    source: str
    model_flops_per_token: float
    """With the attention core (PaLM appendix B): the numerator of `throughput.mfu`."""
    flops_per_token_6n: float
    """6 x the parameters a token passes through (no attention): of `throughput.mfu_6n`."""


@dataclass(frozen=True, slots=True)
class Slices:
    """On a TPU: the slices of the job and the ICI axes each group lies on."""

    count: int
    chips: int
    shape: tuple[int, ...]
    ici: str
    dcn_dp: int


@dataclass(frozen=True, slots=True)
class HardwareSummary:
    accelerator: str
    accelerator_name: str
    devices: int
    devices_per_node: int
    nodes: int
    slices: Slices | None
    intra_link: str
    network: str
    inter_bw_per_device: float
    """The network's nominal rate, a device's share of its node's ports (bytes/s)."""
    intra_bw: float
    """The intra-node link's nominal rate (bytes/s)."""
    inter_bus_bw_per_device: float
    """What collectives achieve over the network, a device's share (the catalogue's
    published bus bandwidth; the nominal rate where none is published)."""
    intra_bus_bw: float
    """What collectives achieve on the intra-node link."""
    peak_flops: float
    memory_bytes: float
    precision: str
    catalogue: str | None


@dataclass(frozen=True, slots=True)
class AttentionKernel:
    name: str
    rate: float
    """Fraction of the 16-bit peak its causal half runs at."""


@dataclass(frozen=True, slots=True)
class Assumptions:
    """The options and the stack profile the plan assumed."""

    kernel_efficiency: float
    attention_kernel: AttentionKernel | None
    fused_elementwise: bool
    calibrated_on: str | None
    target_mfu: float | None
    stack: str
    memory_model: str
    dp_schedule: str
    fp8: bool
    cp_method: str
    zero3_gather: str
    balanced_stages: bool
    oversubscription: float
    nodes_per_leaf: int | None
    host_memory_gb: float | None
    overlap: float
    tp_overlap: float
    link_efficiency: float
    fragmentation: float
    fixed_overhead_gb: float
    flash_attention: bool
    optimizer: str
    global_batch: int
    tokens_per_step: int


@dataclass(frozen=True, slots=True)
class MfuTarget:
    """--mfu: the end-to-end MFU asked for, and what the layout reaches."""

    requested: float
    reachable: bool
    ceiling: float
    """The layout's MFU with its kernels at 100 % of peak."""
    reached: float = 0.0
    limit: str = ""
    limit_share: float = 0.0


@dataclass(frozen=True, slots=True)
class LayoutSummary:
    dp: int
    tp: int
    pp: int
    zero: int
    mbs: int
    recompute: str
    sp: bool
    offload: str
    interleave: int
    hsdp: bool
    cp: int
    ep: int
    label: str


@dataclass(frozen=True, slots=True)
class Part:
    """One part of the step or of a device's memory."""

    name: str
    label: str
    value: float
    """Seconds per step, or bytes per device."""
    link: str | None = None
    """The catalogue link a communication part runs on (None: no link)."""


@dataclass(frozen=True, slots=True)
class Memory:
    parts: tuple[Part, ...]
    total: float
    capacity: float
    fits: bool
    host_offload: float
    host_per_node: float
    host_load_per_rank: float
    host_load_per_node: float


@dataclass(frozen=True, slots=True)
class StepTime:
    parts: tuple[Part, ...]
    """The step's parts; `step` is their sum."""
    step: float
    step_no_overlap: float
    dp_comm_total: float
    """Every data-parallel collective, the hidden share included."""
    main_overhead: str
    main_overhead_share: float

    def seconds(self, name: str) -> float:
        return next((p.value for p in self.parts if p.name == name), 0.0)


@dataclass(frozen=True, slots=True)
class Throughput:
    tokens_per_s: float
    samples_per_s: float
    mfu: float
    """Model FLOPs with the attention core / peak / step time (PaLM's convention)."""
    mfu_6n: float
    """6N FLOPs per token / peak / step time (the attention left out, as 6N counts)."""
    hfu: float
    model_tflops_per_device: float
    tokens_per_s_no_overlap: float


@dataclass(frozen=True, slots=True)
class SearchRow:
    layout: str
    tokens_per_s: float
    step: float
    mfu: float
    memory: float
    dp_exposed: float
    bubble: float
    tp_comm: float


@dataclass(frozen=True, slots=True)
class Why:
    """Why the chosen layout beats the runner-up."""

    runner_up: str
    step: float
    runner_up_step: float
    differences: tuple[Part, ...]
    """Per step part: the runner-up's seconds minus the chosen layout's."""
    decisive: str
    headroom_chosen: float
    headroom_runner_up: float
    text: str


@dataclass(frozen=True, slots=True)
class Search:
    layouts_evaluated: int
    layouts_fitting: int
    seconds: float
    top: tuple[SearchRow, ...] = ()
    why: Why | None = None


@dataclass(frozen=True, slots=True)
class Training:
    tokens: float
    steps: float
    seconds: float
    days: float
    device_hours: float
    days_no_overlap: float
    goodput: float
    price_per_device_hour: float | None
    price_basis: str
    cost_usd: float | None


@dataclass(frozen=True, slots=True)
class ScalePoint:
    devices: int
    layout: str | None
    tokens_per_s: float
    speedup: float
    efficiency: float
    mfu: float
    main_overhead: str
    overhead_share: float


@dataclass(frozen=True, slots=True)
class CurvePoint:
    """The knee of the scaling curve, or its first point when that is already below."""

    devices: int
    efficiency: float
    cause: str
    shortfall: str
    threshold: float


@dataclass(frozen=True, slots=True)
class Scaling:
    points: tuple[ScalePoint, ...]
    threshold: float
    knee: CurvePoint | None
    starts_below: CurvePoint | None
    seconds: float


@dataclass(frozen=True, slots=True)
class FineTuning:
    """What a fine-tuning plan trains (finetune.py)."""

    method: str
    """'full' or 'lora'."""
    rank: int | None
    targets: tuple[str, ...]
    base_dtype: str | None
    """The frozen base's dtype (None: nothing frozen)."""
    trainable_params: float
    trainable_share: float
    frozen_weights_bytes: float
    """The frozen base's weights, the whole model (before any sharding)."""
    adapter_checkpoint_bytes: float
    """The adapters saved in the base's dtype (what ships beside the base)."""


@dataclass(frozen=True, slots=True)
class Plan:
    """A plan: what was planned, on what, under which assumptions, and its figures."""

    model: ModelSummary
    hardware: HardwareSummary
    assumptions: Assumptions
    mfu_target: MfuTarget | None
    layout: LayoutSummary
    layout_searched: tuple[str, ...]
    memory: Memory
    time: StepTime
    throughput: Throughput
    search: Search
    warnings: list[str] = field(default_factory=list)
    training: Training | None = None
    scaling: Scaling | None = None
    finetune: FineTuning | None = None

    def to_json(self) -> dict[str, object]:
        return asdict(self)


# --- sections from an Evaluation -------------------------------------------------------------


def model_summary(shape: Any, cost: ModelCost) -> ModelSummary:
    return ModelSummary(
        name=shape.name, family=cost.family, params=cost.total_params, shape=cost.describe,
        source=shape.source, model_flops_per_token=cost.model_flops_per_token,
        flops_per_token_6n=cost.model_flops_per_token - cost.attention_flops_per_token,
    )


def finetune_section(ft: FineTune | None, cost: ModelCost, precision: str
                     ) -> FineTuning | None:
    """The plan's fine-tuning section; None when it plans pre-training."""
    if ft is None:
        return None
    if not ft.lora:
        return FineTuning(method="full", rank=None, targets=(), base_dtype=None,
                          trainable_params=cost.total_params, trainable_share=1.0,
                          frozen_weights_bytes=0.0, adapter_checkpoint_bytes=0.0)
    base = ft.base_bytes(precision)
    return FineTuning(
        method="lora", rank=ft.rank, targets=ft.targets,
        base_dtype=ft.base_dtype_in(precision),
        trainable_params=cost.adapter_params, trainable_share=cost.trainable_share,
        frozen_weights_bytes=cost.total_params * base,
        adapter_checkpoint_bytes=cost.adapter_params * base,
    )


def layout_summary(layout: Layout) -> LayoutSummary:
    return LayoutSummary(**asdict(layout), label=layout.label())


def part_link(part: StepPart, hw: Hardware) -> str | None:
    """The catalogue link a step part runs on (the network when it crosses nodes)."""
    if not part.names_link:
        return None
    return hw.inter.key if part.crosses else hw.intra.key


def memory_section(ev: Evaluation) -> Memory:
    return Memory(
        parts=tuple(Part(name=p.name, label=p.label, value=p.bytes) for p in ev.memory_parts),
        total=ev.memory, capacity=ev.capacity, fits=ev.fits, host_offload=ev.host.offload,
        host_per_node=ev.host.per_node, host_load_per_rank=ev.host.load_per_rank,
        host_load_per_node=ev.host.load_per_node,
    )


def time_section(ev: Evaluation, hw: Hardware) -> StepTime:
    cause, share = ev.overhead(hw)
    return StepTime(
        parts=tuple(Part(name=p.name, label=p.label, value=p.seconds, link=part_link(p, hw))
                    for p in ev.step_parts),
        step=ev.step, step_no_overlap=ev.step_no_overlap, dp_comm_total=ev.dp_comm,
        main_overhead=cause, main_overhead_share=share,
    )


def throughput_section(ev: Evaluation, cost: ModelCost, devices: int, tokens_step: float
                       ) -> Throughput:
    return Throughput(
        tokens_per_s=ev.tokens_per_s, samples_per_s=ev.tokens_per_s / cost.tokens_per_sample,
        mfu=ev.mfu, mfu_6n=ev.mfu_6n, hfu=ev.hfu,
        model_tflops_per_device=cost.model_flops_per_token * ev.tokens_per_s / devices / 1e12,
        tokens_per_s_no_overlap=tokens_step / ev.step_no_overlap,
    )


def assumptions_section(opts: PlanOptions, hw: Hardware, calibrated_on: str | None,
                        target_mfu: float | None, tokens_step: int) -> Assumptions:
    kernel = attention_kernel(hw.accelerator, opts)
    stack = opts.stack
    return Assumptions(
        kernel_efficiency=opts.compute_efficiency,
        attention_kernel=None if kernel is None else AttentionKernel(*kernel),
        fused_elementwise=stack.fused_elementwise, calibrated_on=calibrated_on,
        target_mfu=target_mfu, stack=stack.name, memory_model=stack.memory_model,
        dp_schedule=stack.dp_schedule, fp8=opts.fp8, cp_method=stack.cp_method,
        zero3_gather=stack.zero3_gather, balanced_stages=stack.balanced_stages,
        oversubscription=opts.oversubscription, nodes_per_leaf=opts.nodes_per_leaf,
        host_memory_gb=opts.host_memory_gb, overlap=opts.overlap, tp_overlap=opts.tp_overlap,
        link_efficiency=opts.link_efficiency, fragmentation=opts.fragmentation,
        fixed_overhead_gb=opts.fixed_overhead_gb, flash_attention=opts.flash_attention,
        optimizer=opts.optimizer, global_batch=opts.global_batch, tokens_per_step=tokens_step,
    )


def hardware_section(hw: Hardware, cat: Catalogue, devices: int, precision: str,
                     capacity: float, slices: Slices | None) -> HardwareSummary:
    acc = hw.accelerator
    node = int(hw.node_size(devices))
    return HardwareSummary(
        accelerator=acc.key, accelerator_name=acc.name, devices=devices, devices_per_node=node,
        nodes=-(-devices // node), slices=slices, intra_link=hw.intra.key,
        network=hw.inter.key, inter_bw_per_device=hw.inter_bw_per_device,
        intra_bw=hw.intra.bandwidth, inter_bus_bw_per_device=hw.inter_coll_bw_per_device,
        intra_bus_bw=hw.intra.collective_bandwidth, peak_flops=acc.peak(precision), memory_bytes=capacity,
        precision=precision, catalogue=cat.path,
    )


def search_row(label: str, ev: Evaluation) -> SearchRow:
    return SearchRow(
        layout=label, tokens_per_s=ev.tokens_per_s, step=ev.step, mfu=ev.mfu,
        memory=ev.memory, dp_exposed=ev.seconds("dp_exposed"), bubble=ev.seconds("bubble"),
        tp_comm=ev.seconds("tp_comm"),
    )
