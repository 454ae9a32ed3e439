"""What a plan assumes beyond its layout (PlanOptions): precision, optimizer, kernel and link
efficiencies, overlap, memory allowances and the training stack's profile. Every default is
stated in docs/planner.md."""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any

from sextant.errors import UserError
from sextant.planner import efficiency, memory
from sextant.planner.finetune import FineTune
from sextant.planner.profiles import DEFAULT_STACK, PROFILES, StackProfile
from sextant.fields import Check, int_at_least, one_of


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
    finetune: FineTune | None = None
    """What trains (`--finetune`, finetune.py): None or 'full', every parameter; 'lora',
    adapters beside a frozen base."""
    stack: StackProfile = PROFILES[DEFAULT_STACK]
    """What the training stack does by default (`--stack`, profiles.toml): gradient and
    master-weight dtypes, buckets, collective schedule, ZeRO-3 gathers, stage balancing,
    context-parallel exchange."""

    def __post_init__(self) -> None:
        for name, check in _OPTION_CHECKS:
            check(name, getattr(self, name))
        if not isinstance(self.stack, StackProfile):
            raise UserError(f"stack must be a StackProfile. Received: {self.stack!r}")
        if self.finetune is not None and not isinstance(self.finetune, FineTune):
            raise UserError(f"finetune must be a FineTune. Received: {self.finetune!r}")
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



def with_options(opts: PlanOptions, **changes: Any) -> PlanOptions:
    return replace(opts, **changes)
