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

from sextant.errors import UserError
from sextant.planner import comms, efficiency, memory, topology
from sextant.planner.catalogue import Accelerator, Catalogue, Link
from sextant.planner.topology import Torus
from sextant.planner.models import ModelCost
from sextant.planner.profiles import DEFAULT_STACK, PROFILES, StackProfile
from sextant.strategy import Check, int_at_least, one_of

RECOMPUTE = ("none", "selective", "full", "op", "alternate")
"""Activation recomputation: none; selective (the attention core, Korthikanti et al. 2022);
full (every layer from its input); op (torchtitan's "selective op" AC: every other matmul and
every elementwise op recomputed); alternate (torchtitan's "selective layer" AC with its
default option 2: every second layer fully recomputed). The search tries the first three;
the last two are taken when pinned (--recompute)."""
OFFLOAD = ("none", "optimizer", "params")
HOST_OP_SECONDS = 2e-6
"""Host time of one PyTorch call on a tensor ("on the order of 2 us" from Python, PyTorch's
benchmarks/overrides_benchmark/README.md; a call from C++ that launches a copy is counted at
the same figure). What zero3_gather 'tensor' pays per rank of the sharding group for each
collective, built from and into lists of one slice per rank."""
GATHER_LIST_OPS = 2.0
"""Calls per rank of one per-tensor all-gather: DeepSpeed v0.3.13 `_allgather_param`'s
`flat_tensor.narrow` (Python), then ProcessGroupNCCL::allgather's copy of the flat result
into each rank's output tensor (`outputTensors[i][j].copy_(outputFlattened[i][j])`)."""
SCATTER_LIST_OPS = 3.0
"""The same for one per-tensor reduce-scatter: `_reduce_scatter_gradient`'s
`param.grad.view(-1).narrow` (two Python calls), then ProcessGroupNCCL::reduce_scatter's copy
of each rank's input into its flat buffer (flatten_for_scatter_gather)."""
PERSISTENT_LIST_OPS = 4.0
"""Calls per rank and persistent tensor of the once-per-step gather of the small tensors
(`_allgather_params`: `narrow`, `view`, `narrow`, `copy_` into each tensor's rank slice)."""
PERSISTENCE_THRESHOLD = 1e5
"""Tensors of fewer elements stay gathered between steps (DeepSpeed's
stage3_param_persistence_threshold default, zero/constants.py at v0.3.13)."""
MAX_REUSE_DISTANCE = 1e9
"""DeepSpeed's stage3_max_reuse_distance default (zero/constants.py at v0.3.13): a gathered
tensor is released after its module runs unless the parameters used before its next use
(its reuse distance, counted over the recorded module trace) are fewer elements."""
KNOBS = ("dp", "tp", "pp", "zero", "mbs", "rc", "sp", "off", "v", "hs", "cp", "ep")
COMPONENTS = (
    "compute", "optimizer", "tp_comm", "cp_comm", "ep_comm", "pp_comm", "bubble", "dp_exposed"
)


@dataclass(kw_only=True, slots=True, frozen=True)
class PlanOptions:
    """Assumptions that are not part of a layout. Every default is stated in docs/planner.md."""

    precision: str = "bf16"
    """'bf16' / 'fp16' (mixed precision: 16-bit compute, fp32 master weights) or 'fp32'."""
    optimizer: str = "adam"
    """'adam' (2 moments) or 'sgd' (momentum)."""
    global_batch: int = 1
    """Sequences (or samples) per optimizer step, over all data-parallel ranks."""
    compute_efficiency: float = efficiency.KERNEL_EFFICIENCY
    """Kernel efficiency (`--kernel-efficiency`): the fraction of dense peak FLOP/s the GEMM
    kernels reach (and the attention, where no rate of its kernel is published). The memory
    traffic of GEMM operands and elementwise kernels is added on top (efficiency.py), so the
    compute phase's own MFU depends on the shapes; the end-to-end MFU comes out lower again
    by the bubble and exposed communication."""
    target_mfu: float | None = None
    """`--mfu`: the end-to-end MFU the plan should reach (model FLOPs / peak / step time, as
    papers report it); the kernel efficiency is solved for it on the chosen layout."""
    overlap: float = 0.5
    """Fraction of data-parallel communication that may hide behind compute (bounded by the
    compute available to hide it). Not a measured figure: the neutral midpoint between the two
    bounds every plan also reports (1 = everything that fits is hidden, 0 = nothing)."""
    tp_overlap: float = 0.0
    """Fraction of tensor-parallel communication hidden (0: Megatron-LM 2021 does not)."""
    link_efficiency: float = 1.0
    """Fraction of the catalogue link bandwidth collectives achieve."""
    fragmentation: float = 0.10
    """Allocator fragmentation and framework buffers, as a fraction of the tensors."""
    fixed_overhead_gb: float = 1.0
    """Per-device memory the runtime takes before any tensor (context, workspaces), GB."""
    flash_attention: bool = True
    """Attention scores are never stored (FlashAttention); False for 2021-era stacks."""
    host_bw_gbs: float = 25.0
    """Host-memory bandwidth per device available to a CPU optimizer step (offload)."""
    devices_per_node: int | None = None
    """Override the accelerator's devices per node."""
    nics_per_node: int | None = None
    """Network ports per node (default: one per device, as in DGX systems)."""
    fp8: bool = False
    """GEMMs in FP8 (Transformer Engine / torchao float8): their FLOPs at the accelerator's
    fp8 peak, attention and the rest at the 16-bit one; MFU and HFU stay relative to the
    16-bit peak (as torchtitan reports them); model states unchanged."""
    oversubscription: float = 1.0
    """Fabric taper: inter-node bandwidth is divided by it for groups spanning more than
    `nodes_per_leaf` nodes (1 = non-blocking fat tree, as DGX SuperPODs are built)."""
    nodes_per_leaf: int | None = None
    """Nodes under one leaf switch (rail group); None: the whole cluster is non-blocking."""
    host_memory_gb: float | None = None
    """Host RAM per node; a layout whose offloaded bytes per node exceed it does not fit."""
    stack: StackProfile = PROFILES[DEFAULT_STACK]
    """What the training stack does by default (`--stack`, profiles.py): gradient and
    master-weight dtypes, buckets, collective schedule, ZeRO-3 gathers, stage balancing,
    context-parallel exchange."""

    def __post_init__(self) -> None:
        for name, check in _OPTION_CHECKS:
            check(name, getattr(self, name))
        if not isinstance(self.stack, StackProfile):
            raise UserError(f"stack must be a StackProfile. Received: {self.stack!r}")
        memory.state_bytes(self.precision, self.optimizer, self.stack.memory_model)


def _number_in(low: float, high: float, *, low_open: bool = False, high_open: bool = False,
               optional: bool = False) -> Check:
    """The value is a finite number (not a bool) in [low, high], either end open; with
    `optional`, None passes too. The message shows the interval as it is written."""
    shown = f"{'(' if low_open else '['}{low:g}, {high:g}{')' if high_open else ']'}"

    def check(name: str, value: Any) -> None:
        if optional and value is None:
            return
        ok = (not isinstance(value, bool) and isinstance(value, (int, float))
              and math.isfinite(value) and (value > low if low_open else value >= low)
              and (value < high if high_open else value <= high))
        if not ok:
            raise UserError(f"{name} must be in {shown}. Received: {value!r}")

    return check


def _at_least(low: float, *, above: bool = False, optional: bool = False) -> Check:
    """The value is a finite number (not a bool) >= low (> low with `above`)."""
    def check(name: str, value: Any) -> None:
        if optional and value is None:
            return
        ok = (not isinstance(value, bool) and isinstance(value, (int, float))
              and math.isfinite(value) and (value > low if above else value >= low))
        if not ok:
            raise UserError(f"{name} must be a number {'>' if above else '>='} {low:g}. "
                            f"Received: {value!r}")

    return check


_OPTION_CHECKS: tuple[tuple[str, Check], ...] = (
    ("precision", one_of(("bf16", "fp16", "fp32"), "precision")),
    ("global_batch", int_at_least(1)),
    ("compute_efficiency", _number_in(0.0, 1.0, low_open=True)),
    ("link_efficiency", _number_in(0.0, 1.0, low_open=True)),
    ("target_mfu", _number_in(0.0, 1.0, low_open=True, optional=True)),
    ("overlap", _number_in(0.0, 1.0)),
    ("tp_overlap", _number_in(0.0, 1.0)),
    ("fragmentation", _at_least(0.0)),
    ("fixed_overhead_gb", _at_least(0.0)),
    ("oversubscription", _at_least(1.0)),
    ("host_memory_gb", _at_least(0.0, above=True, optional=True)),
    ("host_bw_gbs", _at_least(0.0, above=True)),
    ("devices_per_node", int_at_least(1, optional=True)),
    ("nics_per_node", int_at_least(1, optional=True)),
    ("nodes_per_leaf", int_at_least(1, optional=True)),
)
"""What each PlanOptions field accepts (checked in this order by __post_init__)."""


@dataclass(kw_only=True, slots=True, frozen=True)
class Layout:
    """One way to lay a model over devices."""

    dp: int = 1
    """Data-parallel degree."""
    tp: int = 1
    """Tensor-parallel degree (Megatron-LM)."""
    pp: int = 1
    """Pipeline-parallel stages."""
    zero: int = 0
    """ZeRO stage over the data-parallel group: 0 (DDP), 1, 2, 3 (= FSDP full shard)."""
    mbs: int = 1
    """Micro-batch size in sequences."""
    recompute: str = "none"
    """Activation recomputation (RECOMPUTE): none, selective (attention core), full, op,
    alternate."""
    sp: bool = False
    """Sequence parallelism (needs tp > 1)."""
    offload: str = "none"
    """CPU offload: none, optimizer (ZeRO-Offload), params (ZeRO-Infinity, needs zero 3)."""
    interleave: int = 1
    """Model chunks per pipeline stage (interleaved 1F1B schedule)."""
    hsdp: bool = False
    """Hybrid sharding: ZeRO shards within the node's data-parallel ranks and replicates
    across nodes (FSDP HYBRID_SHARD / HSDP, DeepSpeed ZeRO++ hpZ); needs zero >= 1."""
    cp: int = 1
    """Context parallelism: the sequence split over cp ranks (ring attention exchanging K and
    V blocks); devices = dp x tp x pp x cp."""
    ep: int = 1
    """Expert parallelism (MoE): the experts split over ep ranks of the dp x cp group, tokens
    exchanged with all-to-alls."""

    def __post_init__(self) -> None:
        for key in ("dp", "tp", "pp", "mbs", "interleave", "cp", "ep"):
            value = getattr(self, key)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise UserError(f"{key} must be an integer >= 1. Received: {value!r}")
        if self.zero not in (0, 1, 2, 3):
            raise UserError(f"zero stage must be 0, 1, 2 or 3. Received: {self.zero!r}")
        if self.recompute not in RECOMPUTE:
            raise UserError(
                f"recompute must be one of {', '.join(RECOMPUTE)}. Received: {self.recompute!r}"
            )
        if self.offload not in OFFLOAD:
            raise UserError(
                f"offload must be one of {', '.join(OFFLOAD)}. Received: {self.offload!r}"
            )
        if self.sp and self.tp == 1:
            raise UserError("sequence parallelism needs tp > 1. Received: tp=1, sp=True")
        if self.offload == "params" and self.zero != 3:
            raise UserError(f"offload=params needs zero 3. Received: zero={self.zero}")
        if self.interleave > 1 and self.pp == 1:
            raise UserError("an interleaved schedule needs pp > 1. Received: pp=1")
        if self.hsdp and self.zero == 0:
            raise UserError("hybrid sharding (hsdp) needs a ZeRO stage >= 1. Received: zero=0")

    @property
    def devices(self) -> int:
        return self.dp * self.tp * self.pp * self.cp

    def label(self) -> str:
        parts = [f"dp{self.dp}", f"tp{self.tp}", f"pp{self.pp}"]
        if self.cp > 1:
            parts.append(f"cp{self.cp}")
        if self.ep > 1:
            parts.append(f"ep{self.ep}")
        if self.interleave > 1:
            parts.append(f"v{self.interleave}")
        parts.append(f"zero{self.zero}")
        parts.append(f"mbs{self.mbs}")
        if self.sp:
            parts.append("sp")
        if self.recompute != "none":
            parts.append(f"rc-{self.recompute}")
        if self.offload != "none":
            parts.append(f"offload-{self.offload}")
        if self.hsdp:
            parts.append("hsdp")
        return " ".join(parts)

    def arrays(self) -> dict[str, np.ndarray]:
        return {
            "dp": np.array([self.dp]),
            "tp": np.array([self.tp]),
            "pp": np.array([self.pp]),
            "zero": np.array([self.zero]),
            "mbs": np.array([self.mbs]),
            "rc": np.array([RECOMPUTE.index(self.recompute)]),
            "sp": np.array([int(self.sp)]),
            "off": np.array([OFFLOAD.index(self.offload)]),
            "v": np.array([self.interleave]),
            "hs": np.array([int(self.hsdp)]),
            "cp": np.array([self.cp]),
            "ep": np.array([self.ep]),
        }

    @staticmethod
    def from_row(arrays: dict[str, np.ndarray], i: int) -> Layout:
        return Layout(
            dp=int(arrays["dp"][i]),
            tp=int(arrays["tp"][i]),
            pp=int(arrays["pp"][i]),
            zero=int(arrays["zero"][i]),
            mbs=int(arrays["mbs"][i]),
            recompute=RECOMPUTE[int(arrays["rc"][i])],
            sp=bool(arrays["sp"][i]),
            offload=OFFLOAD[int(arrays["off"][i])],
            interleave=int(arrays["v"][i]),
            hsdp=bool(arrays["hs"][i]) if "hs" in arrays else False,
            cp=int(arrays["cp"][i]) if "cp" in arrays else 1,
            ep=int(arrays["ep"][i]) if "ep" in arrays else 1,
        )


def check_layout(cost: ModelCost, layout: Layout, devices: int, global_batch: int) -> None:
    """UserError unless the layout is a valid way to run this model on `devices` devices."""
    for key in ("tp", "pp", "cp"):
        value = getattr(layout, key)
        if devices % value:
            raise UserError(
                f"{key} must divide the device count. Received: {key}={value}, "
                f"devices={devices}"
            )
    if devices % (layout.tp * layout.pp * layout.cp):
        raise UserError(
            f"tp x pp x cp must divide the device count. Received: {layout.tp} x {layout.pp} "
            f"x {layout.cp} = {layout.tp * layout.pp * layout.cp}, devices={devices}"
        )
    if layout.devices != devices:
        raise UserError(
            f"dp x tp x pp x cp must equal the device count. Received: {layout.dp} x "
            f"{layout.tp} x {layout.pp} x {layout.cp} = {layout.devices}, devices={devices}"
        )
    if layout.cp > 1 and cost.tokens_per_sample % (2 * layout.cp):
        raise UserError(
            "context parallelism must divide the sequence into 2 x cp chunks (load-balanced "
            f"causal ring attention). Received: seq_len={cost.tokens_per_sample}, cp={layout.cp}"
        )
    if layout.ep > 1 and not cost.n_experts:
        raise UserError(f"expert parallelism needs an MoE model. Received: ep={layout.ep}, "
                        f"{cost.name} has no experts")
    if cost.n_experts and cost.n_experts % layout.ep:
        raise UserError(
            f"ep must divide the number of experts. Received: ep={layout.ep}, "
            f"experts={cost.n_experts}"
        )
    if (layout.dp * layout.cp) % layout.ep:
        raise UserError(
            f"ep must divide dp x cp (experts are split over the data-parallel ranks). "
            f"Received: ep={layout.ep}, dp={layout.dp}, cp={layout.cp}"
        )
    if not cost.supports_model_parallel and (layout.tp > 1 or layout.pp > 1 or layout.cp > 1):
        raise UserError(
            f"{cost.name} ({cost.family}) supports data parallelism only; "
            f"received tp={layout.tp}, pp={layout.pp}, cp={layout.cp}"
        )
    if cost.n_heads % layout.tp:
        raise UserError(
            f"tp must divide the number of attention heads. Received: tp={layout.tp}, "
            f"heads={cost.n_heads}"
        )
    if layout.pp * layout.interleave > cost.n_layers:
        raise UserError(
            f"pp x interleave must not exceed the layer count. Received: "
            f"{layout.pp} x {layout.interleave} > {cost.n_layers}"
        )
    if global_batch % (layout.dp * layout.mbs):
        raise UserError(
            f"global batch must be a multiple of dp x micro-batch. Received: batch={global_batch}, "
            f"dp={layout.dp}, mbs={layout.mbs}"
        )
    m = global_batch // (layout.dp * layout.mbs)
    if layout.interleave > 1 and m % layout.pp:
        raise UserError(
            f"the interleaved schedule needs micro-batches per step ({m}) to be a multiple of "
            f"pp ({layout.pp}) (Narayanan et al. 2021 §2.2.2)"
        )


@dataclass(kw_only=True, slots=True, frozen=True)
class Hardware:
    """The machine a plan runs on: accelerator, links, node size."""

    accelerator: Accelerator
    intra: Link
    """Intra-node link (the inter link when nodes have one device)."""
    inter: Link
    """Inter-node network."""
    host: Link | None
    """Device-host link for offload (None: unified memory)."""
    devices_per_node: int
    nics_per_node: int

    @property
    def inter_bw_per_device(self) -> float:
        """A device's share of its node's network ports."""
        return self.inter.bandwidth * self.nics_per_node / self.devices_per_node

    @property
    def inter_coll_bw_per_device(self) -> float:
        """The same share at the network's achievable collective bus bandwidth."""
        return self.inter.collective_bandwidth * self.nics_per_node / self.devices_per_node

    @property
    def torus(self) -> Torus | None:
        """The accelerator's ICI torus (TPUs): a node is then one slice of the pod."""
        return self.accelerator.torus

    def node_size(self, devices: Any) -> Any:
        """Devices per node for a job of `devices` devices: the catalogue's (or
        --gpus-per-node) figure, or on a TPU the chips of one slice (topology.slice_chips:
        the largest slice that divides the job and fits the pod)."""
        if self.torus is None:
            return float(self.devices_per_node)
        n = np.asarray(devices, dtype=np.int64)
        uniq, inv = np.unique(n, return_inverse=True)
        sizes = np.array(
            [topology.slice_chips(int(k), self.devices_per_node, self.torus) for k in uniq],
            dtype=np.float64,
        )
        return sizes[inv].reshape(n.shape)


def resolve_hardware(
    cat: Catalogue,
    accelerator: str,
    network: str | None = None,
    *,
    intra_link: str | None = None,
    options: PlanOptions | None = None,
) -> Hardware:
    acc = cat.accelerator(accelerator)
    inter = cat.link(network or acc.inter_link)
    intra_key = intra_link or acc.intra_link
    intra = cat.link(intra_key) if intra_key else inter
    host = cat.links.get(acc.host_link) if acc.host_link != "unified" else None
    opts = options or PlanOptions()
    g = opts.devices_per_node or acc.devices_per_node
    if not intra_key:
        g = opts.devices_per_node or 1
    nics = opts.nics_per_node or g
    return Hardware(
        accelerator=acc, intra=intra, inter=inter, host=host, devices_per_node=g, nics_per_node=nics
    )


def head_flops_per_token(cost: ModelCost) -> float:
    """FLOPs of a transformer's output projection per token, forward and backward (6 V h);
    0 for other families."""
    if cost.family != "transformer":
        return 0.0
    return 6.0 * (cost.logits_bytes_per_token / 4.0) * cost.hidden


def attention_kernel(acc: Accelerator, opts: PlanOptions) -> tuple[str, float] | None:
    """The attention kernel opts' stack runs on `acc`, with its published rate
    (efficiency.attention_kernel); None: a full-matrix kernel at the GEMM efficiency."""
    return efficiency.attention_kernel(acc.attention_rates, opts.stack.attention_kernels,
                                       opts.flash_attention)


def kernel_seconds(gemm_flops, head_flops, attention_flops, peak, acc: Accelerator,
                   opts: PlanOptions) -> tuple[Any, Any, Any]:
    """Seconds per token of the layers' GEMMs, of the output projection and of the attention
    core, at the kernel efficiency and the attention kernel's rate. FP8 GEMMs (Micikevicius et
    al. 2022) run the layers' matrix multiplies at the fp8 peak; the attention core and the
    output projection stay at the 16-bit `peak`: neither stack quantizes the projection
    (Megatron-Core's output_layer is outside Transformer Engine; torchtitan's float8
    converter skips "output")."""
    eff = opts.compute_efficiency
    gemm = gemm_flops / ((acc.peak("fp8") if opts.fp8 else peak) * eff)
    attention = efficiency.attention_seconds(attention_flops, peak,
                                             attention_kernel(acc, opts), eff)
    return gemm, head_flops / (peak * eff), attention


def per_device_peak(acc: Accelerator, precision: str, devices_on_node) -> np.ndarray:
    """Peak FLOP/s per device. On a shared node (cpu-local) the workers split the cores:
    with `cores / n` threads each, interpolate linearly between the measured one-thread and
    all-thread GEMM rates; with one core each, the one-thread rate (n single-threaded
    processes reach n x the one-thread rate, more than one process with n threads: that is
    the whole speed-up of data parallelism on one CPU); more workers than cores share the
    cores' one-thread rates."""
    peak = acc.peak(precision)
    n = np.asarray(devices_on_node, dtype=np.float64)
    if not acc.shared_node:
        return np.full_like(n, peak)
    (_, f1), (cores, fall) = acc.flops_by_threads
    threads = np.maximum(1.0, np.floor(cores / np.maximum(n, 1.0)))
    per = f1 + (fall - f1) * (threads - 1.0) / max(cores - 1.0, 1.0)
    return np.where(n > cores, f1 * cores / np.maximum(n, 1.0), per)


def gathered_again(weights, max_distance: float | None = None) -> np.ndarray:
    """Which of a recomputed layer's weights (elements, in forward order) DeepSpeed's ZeRO-3
    gathers again for their backward: those whose reuse distance, 2 x the elements of the
    weights after them (their recomputed forward, then their backward), is not under
    `max_distance` (stage3_max_reuse_distance; MAX_REUSE_DISTANCE by default)."""
    limit = MAX_REUSE_DISTANCE if max_distance is None else max_distance
    w = np.asarray(weights, dtype=np.float64)
    later = np.cumsum(w[::-1])[::-1] - w
    return 2.0 * later >= limit


def _per_tensor_zero3(cost: ModelCost, lps, grad_bytes, param_bytes, group, ranks):
    """ZeRO-3 issued one collective per parameter tensor, as DeepSpeed did before its
    coalesced gathers (v0.5.5; v0.3.13 partition_parameters.py and stage3.py). Returns the
    time of one reduce-scatter pass and of one all-gather pass over the layers of a stage,
    of the gathers a recomputed forward adds, and of what is paid once per step, each with
    its host work.

    * Tensors of fewer than PERSISTENCE_THRESHOLD elements (biases, norms) persist: gathered
      once per step after the optimizer, in one call (`_allgather_params`), never per pass.
    * Each other tensor is all-gathered on its own every pass (`_allgather_param`), its bytes
      at the ramp's efficiency for its share of the layer.
    * Every tensor's gradient is reduce-scattered on its own (`_reduce_scatter_gradient`):
      the large ones carry the bytes, each small one pays a collective's latency.
    * Each collective is built from lists of one slice per rank (GATHER_LIST_OPS,
      SCATTER_LIST_OPS, PERSISTENT_LIST_OPS calls per rank, HOST_OP_SECONDS each).
    * A recomputed layer (activation checkpointing) runs its forward again inside the
      backward: the module hooks gather each tensor for that forward and release it after
      (post_sub_module_forward_function), then gather it again for its backward, unless its
      reuse distance is under MAX_REUSE_DISTANCE (`_keep_for_later`). After the recomputed
      forward of the layer's i-th weight the modules that run before its backward are the
      later weights, forward and then backward: a distance of 2 x their elements. The last
      weight (distance 0) stays; the others of a wide layer are gathered a third time."""
    sizes = np.asarray(cost.layer_tensors or (1.0,), dtype=np.float64)
    large = sizes >= PERSISTENCE_THRESHOLD
    n_large, n_small = float(large.sum()), float((~large).sum())
    share = float(sizes[large].sum() / sizes.sum())
    weights = sizes[large]  # layer_tensors lists the weights in forward order, then the rest
    again = gathered_again(weights)
    n_again, share_again = float(again.sum()), float(weights[again].sum() / sizes.sum())
    s_in, s_out, intra, inter = group
    host = ranks * HOST_OP_SECONDS
    ag = 0.0
    ag_again = 0.0
    rs = lps * n_small * comms.hier_reduce_scatter(
        grad_bytes * (1.0 - share) / np.maximum(n_small * lps, 1.0), s_in, s_out, intra, inter
    )
    if n_large:
        units = lps * n_large
        ag = units * (
            comms.hier_all_gather(param_bytes * share / units, s_in, s_out, intra, inter)
            + GATHER_LIST_OPS * host
        )
        rs = rs + units * comms.hier_reduce_scatter(
            grad_bytes * share / units, s_in, s_out, intra, inter
        )
    if n_again:
        units = lps * n_again
        ag_again = units * (
            comms.hier_all_gather(param_bytes * share_again / units, s_in, s_out, intra, inter)
            + GATHER_LIST_OPS * host
        )
    rs = rs + lps * (n_large + n_small) * SCATTER_LIST_OPS * host
    once = 0.0
    if n_small:
        once = comms.hier_all_gather(param_bytes * (1.0 - share), s_in, s_out, intra, inter) + (
            GATHER_LIST_OPS + lps * n_small * PERSISTENT_LIST_OPS
        ) * host
    return rs, ag, ag_again, once


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


# --- the step as a sum of terms ------------------------------------------------------------
# _evaluate builds one LayoutContext for an array of layouts and sums small pure terms over
# it (optax's `chain`, in spirit): memory, compute, optimizer/offload, TP, CP, EP, PP, bubble
# and DP. Each term reads the context and returns a small dataclass of arrays.

F = np.float64


@dataclass(frozen=True, slots=True)
class LayoutContext:
    """What every term reads: the layouts, the job, and the parameters each device holds."""

    cost: ModelCost
    hw: Hardware
    opts: PlanOptions
    dp: np.ndarray
    tp: np.ndarray
    pp: np.ndarray
    cp: np.ndarray
    ep: np.ndarray
    zero: np.ndarray
    rc: np.ndarray
    off: np.ndarray
    mbs: np.ndarray
    v: np.ndarray
    sp: np.ndarray
    hs: np.ndarray
    n: np.ndarray
    """Devices of each layout (dp x tp x pp x cp)."""
    m: np.ndarray
    """Micro-batches per step per pipeline."""
    tok_dev: np.ndarray
    """Tokens of one micro-batch on one device (context parallelism splits them)."""
    fwd_rc: np.ndarray
    """Forward passes of the layers' GEMMs and collectives recomputed per micro-batch."""
    gemm_rc: np.ndarray
    """The same for the matmul FLOPs ('op' recomputes its share of them)."""
    lps: np.ndarray
    """Layers on the fullest pipeline stage."""
    layer_local: np.ndarray
    """Parameters of one layer on a rank before TP (1/ep of an MoE layer's experts)."""
    psi_first: np.ndarray
    psi_last: np.ndarray
    """Parameters per device on the first and the last pipeline stage."""
    tp_in: np.ndarray
    tp_out: np.ndarray
    dp_in: np.ndarray
    dp_out: np.ndarray
    cp_in: np.ndarray
    """Each group's ranks inside one node and the nodes it spans (tp, then dp x cp, then
    pp: Megatron-LM's order)."""
    shard: np.ndarray
    """Ranks ZeRO shards over: the dp x cp group, or its intra-node part with HSDP."""
    mem_bw: Any
    """Memory bandwidth per device (a device's share on a shared node)."""
    g: Any
    """Devices per node (a float), or on a TPU the chips of each layout's slice (an array)."""

    @property
    def multi(self) -> np.ndarray:
        return self.pp > 1

    @property
    def per_host(self) -> Any:
        """Devices that share one host's RAM: the node's, or a TPU host's chips."""
        torus = self.hw.torus
        return np.minimum(self.n, self.g if torus is None else float(torus.host_chips))

    @property
    def psi_stage(self) -> np.ndarray:
        return np.maximum(self.psi_first, self.psi_last)

    @property
    def act_bytes(self) -> float:
        return 4.0 if self.opts.precision == "fp32" else 2.0

    @property
    def tokens_step(self) -> float:
        return float(self.opts.global_batch) * float(self.cost.tokens_per_sample)

    @property
    def attention(self) -> tuple[str, float] | None:
        """The attention kernel the stack runs on this chip (attention_kernel)."""
        return attention_kernel(self.hw.accelerator, self.opts)


def layout_context(
    cost: ModelCost, hw: Hardware, opts: PlanOptions, lay: dict[str, np.ndarray]
) -> LayoutContext:
    dp, tp, pp = lay["dp"].astype(F), lay["tp"].astype(F), lay["pp"].astype(F)
    mbs, rc = lay["mbs"].astype(F), lay["rc"]
    sp = lay["sp"] > 0
    cp = lay["cp"].astype(F) if "cp" in lay else np.ones_like(dp)
    ep = lay["ep"].astype(F) if "ep" in lay else np.ones_like(dp)
    n = dp * tp * pp * cp
    dpc = dp * cp  # the ranks holding the same (non-expert) parameters
    g = hw.node_size(n)
    # 1 forward recomputed with full recomputation, 1/2 when every second layer is
    # checkpointed; "op" recomputes its share of the matmul FLOPs but keeps the collectives'
    # and attention's outputs.
    fwd_rc = (rc == 2) + 0.5 * (rc == 4)
    op_share = cost.op_recompute_flops_per_token / max(cost.full_recompute_flops_per_token, 1.0)
    L = float(cost.n_layers)
    lps = np.ceil(L / pp)
    # An MoE layer keeps its dense part (attention, router) whole and 1/ep of its experts.
    layer_local = cost.layer_params - cost.expert_params + cost.expert_params / ep
    single = (L * layer_local + cost.embed_params + cost.head_params + cost.other_params) / tp
    multi = pp > 1
    last_extra = cost.head_params + cost.tied_copy_params + cost.other_params
    # The data-parallel reduction group is dp x cp (Megatron shards the distributed
    # optimizer over DP x CP).
    dp_in = np.where(tp < g, np.minimum(np.maximum(np.floor(g / tp), 1.0), dpc), 1.0)
    acc = hw.accelerator
    return LayoutContext(
        cost=cost, hw=hw, opts=opts, dp=dp, tp=tp, pp=pp, cp=cp, ep=ep, zero=lay["zero"],
        rc=rc, off=lay["off"], mbs=mbs, v=lay["v"].astype(F), sp=sp,
        hs=lay["hs"] > 0 if "hs" in lay else np.zeros_like(sp), n=n,
        m=float(opts.global_batch) / (dp * mbs),
        tok_dev=mbs * float(cost.tokens_per_sample) / cp,
        fwd_rc=fwd_rc, gemm_rc=fwd_rc + (rc == 3) * op_share, lps=lps,
        layer_local=layer_local,
        psi_first=np.where(multi, lps * layer_local / tp + cost.embed_params / tp, single),
        psi_last=np.where(multi, lps * layer_local / tp + last_extra / tp, single),
        tp_in=np.minimum(tp, g), tp_out=np.ceil(tp / g), dp_in=dp_in,
        dp_out=np.ceil(dpc / dp_in), cp_in=np.minimum(cp, np.maximum(np.floor(g / tp), 1.0)),
        shard=np.where(lay["hs"] > 0, dp_in, dpc) if "hs" in lay else dpc,
        mem_bw=(
            (acc.memory_bw or np.inf) / np.minimum(n, g)
            if acc.shared_node
            else acc.memory_bw or np.inf
        ),
        g=g,
    )


@dataclass(frozen=True, slots=True)
class MemoryTerm:
    memory: np.ndarray
    capacity: np.ndarray
    fits: np.ndarray
    raw: np.ndarray
    psi_worst: np.ndarray
    coef: dict[str, np.ndarray]
    gather: np.ndarray
    activations: np.ndarray
    host_per_node: np.ndarray


def _state_coefficients(c: LayoutContext) -> dict[str, np.ndarray]:
    """Model-state bytes per parameter after ZeRO sharding and offload (memory.py); an MoE
    layer's expert states are sharded over the dp x cp / ep ranks holding the same experts,
    the coefficients averaged over the dense and expert parts."""
    opts, cost = c.opts, c.cost
    kw: dict[str, Any] = {"precision": opts.precision, "optimizer": opts.optimizer,
                          "offload": c.off, "memory_model": opts.stack.memory_model}
    coef = memory.state_coefficients(c.shard, c.zero, **kw)
    if not cost.n_experts:
        return coef
    coef_e = memory.state_coefficients(np.maximum(c.shard / c.ep, 1.0), c.zero, **kw)
    psi_e = np.where(c.multi, c.lps, float(cost.n_layers)) * cost.expert_params / (c.ep * c.tp)
    share_e = psi_e / np.maximum(c.psi_first, 1.0)
    return {k: coef[k] * (1.0 - share_e) + coef_e[k] * share_e for k in coef}


def _activations(c: LayoutContext) -> tuple[np.ndarray, np.ndarray]:
    """Activation bytes on the first and last stage (memory.py: Korthikanti et al. 2022
    Table 2, the 1F1B in-flight count), the loss's logits on the last."""
    cost, opts, tp = c.cost, c.opts, c.tp
    act_scale = c.act_bytes / 2.0
    per_layer = memory.activation_bytes_per_layer(
        cost, c.tok_dev, tp, c.sp, c.rc, act_scale, fp8_inputs=opts.fp8
    )
    full = memory.activation_bytes_per_layer(cost, c.tok_dev, tp, c.sp, 0, act_scale)
    working = ((c.rc == 2) | (c.rc == 4)) * full  # the layer being recomputed
    logits = c.tok_dev * cost.logits_bytes_per_token / tp * memory.loss_bytes_factor(
        opts.stack.memory_model, opts.precision, tp
    )
    inflight = memory.pipeline_inflight(c.pp, c.m, c.v)
    act_first = per_layer * c.lps * inflight + working + np.where(c.multi, 0.0, logits)
    act_last = np.where(c.multi, per_layer * c.lps + working + logits, act_first)
    return act_first, act_last


def _root_units(c: LayoutContext) -> tuple[np.ndarray, np.ndarray]:
    """FSDP2's root unit (embedding, final norm, output projection), whole at the backward's
    start: the first stage holds the embedding, the last the rest, one stage all of it."""
    cost, tp = c.cost, c.tp
    kw = {"precision": c.opts.precision, "memory_model": c.opts.stack.memory_model}
    root_all = (cost.embed_params + cost.head_params + cost.other_params) / tp
    first = memory.root_unit_bytes(
        np.where(c.multi, cost.embed_params / tp, root_all), c.zero, **kw
    )
    last = memory.root_unit_bytes(
        np.where(c.multi, (cost.head_params + cost.other_params) / tp, root_all), c.zero, **kw
    )
    return first, last


def memory_term(c: LayoutContext) -> MemoryTerm:
    """Bytes per device on the fuller of the first and last pipeline stage."""
    opts, cost, acc, mm = c.opts, c.cost, c.hw.accelerator, c.opts.stack.memory_model
    coef = _state_coefficients(c)
    c_states = coef["params"] + coef["grads"] + coef["optimizer"]
    # Parameters gathered whole for compute (ZeRO-3 / FSDP units) and DDP bucket copies.
    gather = memory.transient_param_bytes(
        c.layer_local / c.tp, c.lps, c.zero, precision=opts.precision, memory_model=mm,
        largest_module_params=cost.largest_module_params / c.tp,
    )
    act_first, act_last = _activations(c)
    root_first, root_last = _root_units(c)
    raw_first = (c.psi_first * c_states + gather + root_first
                 + memory.buffer_bytes(c.psi_first, c.zero, memory_model=mm) + act_first)
    raw_last = (c.psi_last * c_states + gather + root_last
                + memory.buffer_bytes(c.psi_last, c.zero, memory_model=mm) + act_last)
    worst_last = raw_last > raw_first
    raw = np.where(worst_last, raw_last, raw_first)
    psi_worst = np.where(worst_last, c.psi_last, c.psi_first)
    mem = raw * (1.0 + opts.fragmentation) + opts.fixed_overhead_gb * 1e9
    g = np.minimum(c.n, c.g)
    capacity = acc.memory_bytes / g if acc.shared_node else np.full_like(c.n, acc.memory_bytes)
    host_per_node = psi_worst * coef["host"] * c.per_host
    fits = mem <= capacity
    if opts.host_memory_gb is not None:
        fits = fits & (host_per_node <= opts.host_memory_gb * 1e9)
    return MemoryTerm(
        memory=mem, capacity=capacity, fits=fits, raw=raw, psi_worst=psi_worst, coef=coef,
        gather=gather + np.where(worst_last, root_last, root_first),
        activations=np.where(worst_last, act_last, act_first), host_per_node=host_per_node,
    )


@dataclass(frozen=True, slots=True)
class HostLoad:
    per_rank: np.ndarray
    per_node: np.ndarray
    fits: np.ndarray


def host_load_term(c: LayoutContext, offload_per_node: np.ndarray) -> HostLoad:
    """Host RAM while the model is built: a stack that loads the whole model on every rank
    (StackProfile.load 'full') holds its fp32 parameters in host memory per rank before
    moving and sharding them; one that creates each rank's shard on the device holds none.
    With --host-memory-gb, the larger of this and the offloaded states must fit a node."""
    params = float(c.cost.total_params) * np.ones_like(c.n)
    per_rank = 4.0 * params if c.opts.stack.load == "full" else np.zeros_like(c.n)
    per_node = per_rank * c.per_host
    ram = c.opts.host_memory_gb
    fits = (
        np.ones_like(c.n, dtype=bool)
        if ram is None
        else np.maximum(per_node, offload_per_node) <= ram * 1e9
    )
    return HostLoad(per_rank=per_rank, per_node=per_node, fits=fits)


@dataclass(frozen=True, slots=True)
class ComputeTerm:
    seconds: np.ndarray
    flops_bound: np.ndarray
    scaled_bound: np.ndarray
    """The part of flops_bound that scales with 1 / kernel efficiency (the GEMMs, and the
    attention core where no kernel rate is published)."""
    memory_ops: np.ndarray
    weights_bound: np.ndarray
    hw_flops_per_token: Any
    peak: Any


def _stage_share(c: LayoutContext, layers_t: Any, head_t: Any) -> Any:
    """The slowest stage's share of the model's time x pp. The last stage holds ceil(L/p)
    layers and the output projection (Narayanan et al. 2021 §2.2: every stage processes
    every micro-batch); with balanced stages (Megatron-Core's uneven first/last stage,
    torchtitan, Llama 3 §3.3.2) it gives up layers so that its layers plus the projection come
    closest to the others'."""
    if c.cost.family != "transformer":
        return 1.0
    L, pp, lps = float(c.cost.n_layers), c.pp, c.lps
    layer_t = layers_t / L
    slowest = lps * layer_t + head_t  # even split: ceil(L/p) layers everywhere
    if c.opts.stack.balanced_stages:
        for k in (lps - 1.0, lps - 2.0):  # layers left on the last stage
            others = np.ceil((L - np.maximum(k, 0.0)) / np.maximum(pp - 1.0, 1.0))
            cand = np.maximum(others * layer_t, np.maximum(k, 0.0) * layer_t + head_t)
            slowest = np.minimum(slowest, cand)
    return np.where(c.multi, slowest * pp / (layers_t + head_t), 1.0)


def _memory_ops(c: LayoutContext, full_act: Any) -> Any:
    """Memory traffic of the GEMM operands and of the elementwise kernels (efficiency.py):
    the part of the compute that depends on width, tokens per micro-batch and TP degree. On
    a shared CPU node (cpu-local) the fitted kernel efficiency already holds all of it."""
    cost, opts, acc = c.cost, c.opts, c.hw.accelerator
    if acc.shared_node or not acc.memory_bw:
        return np.zeros_like(c.n)
    routed = cost.top_k * cost.capacity_factor
    # FP8 GEMMs read 1-byte operands and write 16-bit results; casting their inputs and
    # output gradients to FP8 is traffic of its own (efficiency.fp8_quantize_bytes).
    operands = efficiency.gemm_operand_bytes(
        cost.gemms, c.tok_dev, c.tp, 1.0 if opts.fp8 else c.act_bytes,
        experts=cost.n_experts,
        local_experts=(cost.n_experts / c.ep if cost.n_experts else 1.0), routed=routed,
        output_bytes=c.act_bytes,
    )
    elementwise = efficiency.elementwise_bytes(full_act, c.fwd_rc + (c.rc == 3),
                                               opts.stack.fused_elementwise)
    if opts.fp8:
        elementwise = elementwise + efficiency.fp8_quantize_bytes(
            cost.gemms, c.tok_dev, c.tp, 1.0 + c.gemm_rc, experts=cost.n_experts, routed=routed
        )
    # forward, input gradient, weight gradient, recompute
    t = c.m * c.lps * ((3.0 + c.gemm_rc) * operands + elementwise) / c.mem_bw
    if opts.fp8:
        # The layers' weights are cast once per step (at the first micro-batch, then kept).
        layer_dev = c.lps * c.layer_local / c.tp
        t = t + layer_dev * efficiency.FP8_QUANTIZE_BYTES / c.mem_bw
    return t


def compute_term(c: LayoutContext) -> ComputeTerm:
    """GEMM and attention FLOPs at the kernel efficiency over the slowest stage, plus their
    memory traffic; or the weights' reads (roofline), whichever is longer."""
    cost, opts, acc = c.cost, c.opts, c.hw.accelerator
    sel = c.rc == 1
    flash_or_sel = np.where(
        sel, cost.selective_recompute_flops_per_token, cost.flash_recompute_flops_per_token
    )
    extra = (c.fwd_rc * cost.full_recompute_flops_per_token + flash_or_sel
             + (c.rc == 3) * cost.op_recompute_flops_per_token)
    hw_flops_tok = cost.model_flops_per_token + extra + cost.padding_flops_per_token
    if acc.shared_node:
        peak = per_device_peak(acc, opts.precision, np.minimum(c.n, c.g))
    else:
        peak = acc.peak(opts.precision)
    head_tok = head_flops_per_token(cost)
    # The attention core (with its recomputation) runs in its own kernel, at its rate.
    attn_tok = cost.attention_flops_per_token * (1.0 + c.fwd_rc / 3.0) + flash_or_sel
    gemm_t, head_t, attn_t = kernel_seconds(hw_flops_tok - head_tok - attn_tok, head_tok,
                                            attn_tok, peak, acc, opts)
    share = _stage_share(c, gemm_t + attn_t, head_t)
    t_gemm = c.tokens_step * share * (gemm_t + head_t) / c.n
    t_attn = c.tokens_step * share * attn_t / c.n
    t_flops = t_gemm + t_attn
    # Roofline (Williams et al. 2009): every micro-batch reads the device's weights forward
    # and twice backward (+1 forward with full recomputation).
    pb = memory.state_bytes(opts.precision, opts.optimizer, opts.stack.memory_model)[0]
    t_weights = (c.m * (3.0 + c.gemm_rc)) * c.psi_stage * (pb / c.mem_bw)
    full_act = memory.activation_bytes_per_layer(
        cost, c.tok_dev, c.tp, c.sp, 0, c.act_bytes / 2.0
    )
    t_memops = _memory_ops(c, full_act)
    return ComputeTerm(
        seconds=np.maximum(t_flops + t_memops, t_weights), flops_bound=t_flops,
        scaled_bound=t_gemm if c.attention is not None else t_flops, memory_ops=t_memops,
        weights_bound=t_weights, hw_flops_per_token=hw_flops_tok, peak=peak,
    )


def optimizer_term(c: LayoutContext) -> np.ndarray:
    """The optimizer step on the local shard: memory-bound, ~2 (param + optimizer) + grad
    bytes; with offload, over PCIe and host memory (ZeRO-Offload), and with parameters
    offloaded (ZeRO-Infinity) their fetch every micro-batch."""
    opts, hw = c.opts, c.hw
    pb, gb, ob = memory.state_bytes(opts.precision, opts.optimizer, opts.stack.memory_model)
    inv_dp = 1.0 / c.shard
    psi_opt = c.psi_stage * np.where(c.zero >= 1, inv_dp, 1.0)
    opt_traffic = psi_opt * (2.0 * (pb + ob) + gb)
    pcie = hw.host.bandwidth if hw.host is not None else np.inf
    t_offload = (
        psi_opt * ((gb + pb) / pcie)
        + opt_traffic / (opts.host_bw_gbs * 1e9)
        + (c.off >= 2) * (c.m * 2.0 * pb / pcie) * c.psi_stage * inv_dp
    )
    return np.where(c.off >= 1, t_offload, opt_traffic / c.mem_bw)


@dataclass(frozen=True, slots=True)
class Links:
    """(bandwidth, latency, call latency, ramp) of the intra-node and inter-node links for
    collectives (the catalogue's achievable bus bandwidth, the network tapered above a leaf
    switch) and for point-to-point sends (nominal bandwidth). `tp`, `cp`, `ep` and `dp` are
    the intra-node link as each group sees it: the same tuple on a switched node, on a TPU
    slice the ICI axes the group lies on (_torus_groups)."""

    intra: tuple
    inter: tuple
    intra_p2p: tuple
    inter_p2p: tuple
    tp: tuple
    cp: tuple
    ep: tuple
    dp: tuple


def links(c: LayoutContext) -> Links:
    hw, opts, le = c.hw, c.opts, c.opts.link_efficiency
    # Each link carries its bandwidth-versus-message-size ramp (comms.ramp_efficiency, fitted
    # to published sweeps); a network without one uses the intra-node link's.
    intra_ramp = hw.intra.ramp
    inter_ramp = hw.inter.ramp if hw.inter.ramp is not None else intra_ramp
    inter_bw: Any = hw.inter_coll_bw_per_device * le
    if opts.oversubscription > 1 and opts.nodes_per_leaf is not None:
        # A group spanning more nodes than one leaf switch crosses the tapered spine.
        nodes = np.ceil(c.n / c.g)
        inter_bw = inter_bw / np.where(nodes > opts.nodes_per_leaf, opts.oversubscription, 1.0)
    intra = (hw.intra.collective_bandwidth * le, hw.intra.latency, hw.intra.call_latency,
             intra_ramp)
    intra_p2p = (hw.intra.bandwidth * le, hw.intra.latency, hw.intra.call_latency, intra_ramp)
    groups = {k: intra for k in ("tp", "cp", "ep", "dp")}
    if hw.torus is not None:
        groups = _torus_groups(c, hw.torus, le, hw.intra.call_latency)
        # A pipeline send goes to the neighbouring chip: one link, one way.
        intra_p2p = (hw.torus.link_bandwidth * le, hw.torus.hop_latency,
                     hw.intra.call_latency, None)
    return Links(
        intra=intra,
        inter=(inter_bw, hw.inter.latency, hw.inter.call_latency, inter_ramp),
        intra_p2p=intra_p2p,
        inter_p2p=(hw.inter_bw_per_device * le, hw.inter.latency, hw.inter.call_latency,
                   inter_ramp),
        **groups,
    )


def _torus_groups(c: LayoutContext, torus: Torus, le: float, call: float) -> dict[str, tuple]:
    """Each group's link on a TPU slice: the tensor-parallel group innermost, then context
    parallelism, then the data-parallel (FSDP) ranks of the slice, the expert group being
    the first of those (topology.place; MaxText's mesh order). Evaluated once per distinct
    (slice, tp, cp, ep, dp) of the table."""
    chips = np.minimum(c.n, c.g)
    ep_in = np.minimum(c.ep, c.dp_in)
    keys = np.stack([chips, c.tp_in, c.cp_in, ep_in, c.dp_in]).T.astype(np.int64)
    uniq, inv = np.unique(keys, axis=0, return_inverse=True)
    inv = inv.reshape(-1)
    table = np.empty((len(uniq), 4, 2))
    fallback = topology.GroupLink(bandwidth=torus.link_bandwidth, latency=torus.hop_latency,
                                  axes=())
    for i, (s, tp, cp, ep, dp) in enumerate(uniq.tolist()):
        placed = [
            topology.groups_links(torus, s, (tp, cp))
            or (fallback, fallback),
            topology.groups_links(torus, s, (tp, ep)) or (fallback, fallback),
            topology.groups_links(torus, s, (tp, dp)) or (fallback, fallback),
        ]
        for j, link in enumerate((placed[0][0], placed[0][1], placed[1][1], placed[2][1])):
            table[i, j] = (link.bandwidth, link.latency)
    out = {}
    for j, name in enumerate(("tp", "cp", "ep", "dp")):
        out[name] = (table[inv, j, 0] * le, table[inv, j, 1], call, None)
    return out


def tp_term(c: LayoutContext, lk: Links) -> np.ndarray:
    """Tensor parallelism: per layer and micro-batch 4 all-reduces of tokens x h (2 more per
    recomputed forward); with a transformer, the vocabulary-parallel embedding and output
    layer (Megatron-LM's VocabParallelEmbedding and vocab_parallel_cross_entropy; Shoeybi
    et al. 2019 §3): one all-reduce of tokens x h each per micro-batch (the embedding on the
    first stage, the output layer on the last; both with one stage) and three all-reduces of
    one fp32 value per token for the cross-entropy over the split logits. Neither layer is
    recomputed."""
    cost, opts, m = c.cost, c.opts, c.m
    tp_multi = c.tp > 1
    ar_tp = np.where(
        tp_multi,
        comms.hier_all_reduce(c.tok_dev * (cost.hidden * c.act_bytes), c.tp_in, c.tp_out,
                              lk.tp, lk.inter),
        0.0,
    )
    t_tp = (m * c.lps * (4.0 + 2.0 * c.fwd_rc) * (1.0 - opts.tp_overlap)) * ar_tp
    if cost.family != "transformer":
        return t_tp
    ar_ce = np.where(
        tp_multi,
        comms.hier_all_reduce(c.tok_dev * 4.0, c.tp_in, c.tp_out, lk.tp, lk.inter),
        0.0,
    )
    vocab_ars = np.where(c.pp > 1, 1.0, 2.0)
    return t_tp + m * (vocab_ars * ar_tp + 3.0 * ar_ce) * (1.0 - opts.tp_overlap)


def pp_term(c: LayoutContext, lk: Links) -> np.ndarray:
    """Pipeline sends: one activation and one gradient per micro-batch and model chunk, over
    the network when the pipeline spans nodes."""
    msg = c.tok_dev * (c.cost.hidden * c.act_bytes) / c.tp
    send = np.where(c.n > c.g, comms.p2p(msg, *lk.inter_p2p), comms.p2p(msg, *lk.intra_p2p))
    return c.multi * (2.0 * c.m * c.v * send)


def cp_term(c: LayoutContext, lk: Links, peak: Any) -> np.ndarray:
    """Context parallelism (ring attention, Liu et al. 2023; Megatron-Core CP): per layer and
    micro-batch the K and V blocks go round the cp ranks forward, again backward with dK and
    dV: 3 passes (+1 with full recomputation) of (cp - 1) steps, hidden behind the attention
    core as far as it lasts; with all-gather CP only the local block's share (1 / cp) of the
    attention can compute during the gather."""
    cost, opts, cp = c.cost, c.opts, c.cp
    if not np.any(cp > 1):
        return np.zeros_like(c.n)
    # A rank circulates the K/V of its own tensor-parallel share of the heads: the
    # n_kv_heads split over tp, or one head (replicated) when tp exceeds n_kv_heads.
    kv_heads_rank = cost.n_kv_heads / np.minimum(c.tp, cost.n_kv_heads)
    kv_block = c.tok_dev * (2.0 * kv_heads_rank * cost.hidden / cost.n_heads) * c.act_bytes
    crosses = cp > c.cp_in
    cp_bw = np.where(
        crosses,
        lk.inter[0] * comms.ramp_efficiency(lk.inter[3], kv_block),
        lk.cp[0] * comms.ramp_efficiency(lk.cp[3], kv_block),
    )
    ring_pass = (cp - 1.0) * (kv_block / cp_bw + np.where(crosses, lk.inter[1], lk.cp[1]))
    t_all = c.m * c.lps * (3.0 + c.fwd_rc) * ring_pass
    attn_core_tok = cost.attention_flops_per_token * (1.0 + c.fwd_rc / 3.0)
    t_attention = c.tokens_step * efficiency.attention_seconds(
        attn_core_tok, peak, c.attention, opts.compute_efficiency) / c.n
    hidden = t_attention / cp if opts.stack.cp_method == "allgather" else t_attention
    return np.where(cp > 1, np.maximum(t_all - hidden, 0.0), 0.0)


def ep_term(c: LayoutContext, lk: Links) -> np.ndarray:
    """Expert parallelism: per MoE layer and micro-batch, dispatch and combine all-to-alls
    forward and backward (4; 6 with full recomputation) of the routed tokens, padded to the
    capacity (Lepikhin et al. 2020, GShard §2.2), inside the node while the ep ranks fit."""
    cost, ep = c.cost, c.ep
    if not cost.n_experts:
        return np.zeros_like(c.n)
    routed = c.tok_dev * cost.top_k * cost.capacity_factor * cost.hidden * c.act_bytes
    routed = routed / np.where(c.sp, c.tp, 1.0)
    crosses = ep > np.minimum(ep, c.dp_in)
    chunk = routed / ep  # to every peer, at the ramp's efficiency for that size
    a2a_bw = np.where(
        crosses,
        lk.inter[0] * comms.ramp_efficiency(lk.inter[3], chunk),
        lk.ep[0] * comms.ramp_efficiency(lk.ep[3], chunk),
    )
    a2a_lat = np.where(crosses, lk.inter[1], lk.ep[1])
    a2a = (ep - 1.0) / ep * routed / a2a_bw + (ep - 1.0) * a2a_lat + lk.ep[2]
    return np.where(ep > 1, c.m * c.lps * (4.0 + 2.0 * c.fwd_rc) * a2a, 0.0)


def tp_hidden_term(c: LayoutContext, t_tp: np.ndarray, t_compute: np.ndarray) -> Any:
    """What of the TP collectives a stack with asynchronous collectives hides behind the
    compute (StackProfile.async_collectives); the data-parallel ones then have what is left
    of the compute to hide behind. 0 for a stack whose TP collectives block."""
    return np.minimum(t_tp, t_compute) if c.opts.stack.async_collectives else 0.0


def bubble_term(c: LayoutContext, per_microbatch_work: np.ndarray) -> np.ndarray:
    """The pipeline bubble: (p - 1) / (v m) of the step's work per pipeline."""
    return (c.pp - 1.0) / (c.v * c.m) * per_microbatch_work


@dataclass(frozen=True, slots=True)
class DPTerm:
    seconds: np.ndarray
    hidden: np.ndarray
    exposed: np.ndarray


def _dp_collectives(c: LayoutContext, lk: Links) -> np.ndarray:
    """Seconds of the data-parallel collectives of comms.dp_collectives (one table with the
    measured runs' bytes), each over the rank's gradient or parameter payload."""
    opts, stack = c.opts, c.opts.stack
    grad_wire, param_wire = memory.comm_bytes(opts.precision, stack.memory_model)
    counts = comms.dp_collectives(c.zero, c.m, stack.dp_schedule)
    grad_b = c.psi_stage * grad_wire
    # Gradient buckets: one collective per bucket, each at the bandwidth of its own size.
    bucket = comms.dp_bucket_bytes(stack.memory_model, stack.dp_bucket_bytes, grad_wire)
    buckets = np.maximum(np.ceil(grad_b / bucket), 1.0) if bucket else np.ones_like(grad_b)
    ar = buckets * comms.hier_all_reduce(grad_b / buckets, c.dp_in, c.dp_out, lk.dp, lk.inter)
    # ZeRO-3 / FSDP gather and reduce one layer (unit) at a time (ZeRO §5.3; FSDP's
    # fully_shard per block). HSDP: the sharded collectives stay inside the node; each
    # gradient reduction adds an all-reduce of the 1/dp_in shard across the dp_out replicas.
    z3 = c.zero >= 3
    units = np.where(z3, c.lps, buckets)
    s_out = np.where(c.hs, 1.0, c.dp_out)
    group = (c.dp_in, s_out, lk.dp, lk.inter)
    rs = units * comms.hier_reduce_scatter(grad_b / units, *group)
    ag = units * comms.hier_all_gather(c.psi_stage * param_wire / units, *group)
    once: Any = 0.0
    if stack.zero3_gather == "tensor":
        # One collective per parameter tensor instead (_per_tensor_zero3); once a step the
        # persistent tensors' gather, per recomputed forward the tensors gathered again.
        rs_t, ag_t, again_t, once_t = _per_tensor_zero3(
            c.cost, c.lps, grad_b, c.psi_stage * param_wire, group, c.shard
        )
        rs, ag = np.where(z3, rs_t, rs), np.where(z3, ag_t, ag)
        once = np.where(z3, once_t + c.m * c.fwd_rc * again_t, 0.0)
    replicas = (
        np.where(c.hs, comms.all_reduce(grad_b / c.dp_in, c.dp_out, *lk.inter), 0.0)
        if np.any(c.hs) else 0.0
    )
    return (counts["all_reduce"] * ar + counts["reduce_scatter"] * (rs + replicas)
            + counts["all_gather"] * ag + once)


def dp_term(c: LayoutContext, lk: Links, t_compute: np.ndarray) -> DPTerm:
    """Data parallelism, hidden behind the backward as far as `overlap` and the window allow
    (one micro-batch's backward with ZeRO 0-1, every micro-batch's with ZeRO-2, the whole
    compute with ZeRO-3)."""
    t_dp = _dp_collectives(c, lk)
    bwd_mb = (2.0 / 3.0) * t_compute / c.m
    window = np.select([c.zero <= 1, c.zero == 2], [bwd_mb, c.m * bwd_mb], t_compute)
    hidden = np.minimum(c.opts.overlap * t_dp, window)
    return DPTerm(seconds=t_dp, hidden=hidden, exposed=t_dp - hidden)


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


def with_options(opts: PlanOptions, **changes: Any) -> PlanOptions:
    return replace(opts, **changes)
