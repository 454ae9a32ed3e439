"""What a plan assumes beyond its layout (PlanOptions): precision, optimizer, kernel and link
efficiencies, overlap, memory allowances and the training stack's profile. Every default is
stated in docs/planner.md."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from sextant.core.errors import UserError
from sextant.planner import efficiency, memory
from sextant.planner.finetune import FineTune
from sextant.planner.profiles import DEFAULT_STACK, PROFILES, StackProfile
from sextant.core.fields import check_fields, int_at_least, number_at_least, number_in, one_of, option


PRECISIONS = ("bf16", "fp16", "tf32", "fp32")
"""The precisions a plan is made in."""


def planner_precision(run_precision: str) -> str:
    """The plan's precision for a run recorded in `run_precision`: the same where the planner
    has it, else fp32 (the values every other precision stores)."""
    return run_precision if run_precision in PRECISIONS else "fp32"


@dataclass(kw_only=True, slots=True, frozen=True)
class PlanOptions:
    """Assumptions that are not part of a layout. Every default is stated in docs/planner.md."""

    precision: str = option("bf16", one_of(PRECISIONS, "precision"))
    """'bf16' / 'fp16' (mixed precision: 16-bit compute, fp32 master weights), 'tf32' (fp32
    values, the matmuls at the accelerator's TF32 peak) or 'fp32'."""
    optimizer: str = "adam"
    """'adam' (2 moments) or 'sgd' (momentum)."""
    global_batch: int = option(1, int_at_least(1))
    """Sequences (or samples) per optimizer step, over all data-parallel ranks."""
    compute_efficiency: float = option(efficiency.KERNEL_EFFICIENCY,
                                       number_in(0.0, 1.0, low_open=True))
    """Kernel efficiency (`--kernel-efficiency`): the fraction of dense peak FLOP/s the GEMM
    kernels reach (and the attention, where no rate of its kernel is published). The memory
    traffic of GEMM operands and elementwise kernels is added on top (efficiency.py), so the
    compute phase's own MFU depends on the shapes; the end-to-end MFU comes out lower again
    by the bubble and exposed communication."""
    target_mfu: float | None = option(None, number_in(0.0, 1.0, low_open=True, optional=True))
    """`--mfu`: the end-to-end MFU the plan should reach (model FLOPs / peak / step time, as
    papers report it); the kernel efficiency is solved for it on the chosen layout."""
    overlap: float = option(0.5, number_in(0.0, 1.0))
    """Fraction of data-parallel communication that may hide behind compute (bounded by the
    compute available to hide it). Not a measured figure: the neutral midpoint between the two
    bounds every plan also reports (1 = everything that fits is hidden, 0 = nothing)."""
    tp_overlap: float = option(0.0, number_in(0.0, 1.0))
    """Fraction of tensor-parallel communication hidden (0: Megatron-LM 2021 does not)."""
    link_efficiency: float = option(1.0, number_in(0.0, 1.0, low_open=True))
    """Fraction of the catalogue link bandwidth collectives achieve."""
    fragmentation: float = option(0.10, number_at_least(0.0))
    """Allocator fragmentation and framework buffers, as a fraction of the tensors."""
    fixed_overhead_gb: float = option(1.0, number_at_least(0.0))
    """Per-device memory the runtime takes before any tensor (context, workspaces), GB."""
    flash_attention: bool = True
    """Attention scores are never stored (FlashAttention); False for 2021-era stacks."""
    host_bw_gbs: float = option(25.0, number_at_least(0.0, above=True))
    """Host-memory bandwidth per device available to a CPU optimizer step (offload)."""
    devices_per_node: int | None = option(None, int_at_least(1, optional=True))
    """Override the accelerator's devices per node."""
    nics_per_node: int | None = option(None, int_at_least(1, optional=True))
    """Network ports per node (default: one per device, as in DGX systems)."""
    fp8: bool = False
    """GEMMs in FP8 (Transformer Engine / torchao float8): their FLOPs at the accelerator's
    fp8 peak, attention and the rest at the 16-bit one; MFU and HFU stay relative to the
    16-bit peak (as torchtitan reports them); model states unchanged."""
    oversubscription: float = option(1.0, number_at_least(1.0))
    """Fabric taper: inter-node bandwidth is divided by it for groups spanning more than
    `nodes_per_leaf` nodes (1 = non-blocking fat tree, as DGX SuperPODs are built)."""
    nodes_per_leaf: int | None = option(None, int_at_least(1, optional=True))
    """Nodes under one leaf switch (rail group); None: the whole cluster is non-blocking."""
    host_memory_gb: float | None = option(None, number_at_least(0.0, above=True,
                                                                optional=True))
    """Host RAM per node; a layout whose offloaded bytes per node exceed it does not fit."""
    finetune: FineTune | None = None
    """What trains (`--finetune`, finetune.py): None or 'full', every parameter; 'lora',
    adapters beside a frozen base."""
    stack: StackProfile = PROFILES[DEFAULT_STACK]
    """What the training stack does by default (`--stack`, profiles.toml): gradient and
    master-weight dtypes, buckets, collective schedule, ZeRO-3 gathers, stage balancing,
    context-parallel exchange."""

    def __post_init__(self) -> None:
        check_fields(self)
        if not isinstance(self.stack, StackProfile):
            raise UserError(f"stack must be a StackProfile. Received: {self.stack!r}")
        if self.finetune is not None and not isinstance(self.finetune, FineTune):
            raise UserError(f"finetune must be a FineTune. Received: {self.finetune!r}")
        memory.state_bytes(self.precision, self.optimizer, self.stack.memory_model)





def with_options(opts: PlanOptions, **changes: Any) -> PlanOptions:
    return replace(opts, **changes)
