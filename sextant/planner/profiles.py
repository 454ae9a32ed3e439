"""What a training stack does by default, as one frozen record (`sextant plan --stack NAME`).

PlanOptions holds the user's own knobs (batch, precision, overlap, hardware overrides); a
StackProfile holds what the stack decides for them: how it allocates gradients and master
weights, how it buckets and schedules the data-parallel collectives, what one ZeRO-3 gather
carries, how it splits pipeline stages and how its context parallelism exchanges K and V. Each
profile is a stack at its current release; a dated variant exists only where a published
figure needs an older release, and says which.
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Any

from sextant.core.errors import UserError
from sextant.planner.catalogue import ATTENTION_KERNELS
from sextant.planner.comms import DP_SCHEDULES
from sextant.planner.layout import OFFLOAD, RECOMPUTE, ZERO_STAGES
from sextant.planner.memory import MEMORY_MODELS, model_of

CP_METHODS = ("ring", "allgather")
"""'ring' (ring attention, Liu et al. 2023; Megatron-Core's CP: each K/V block travels while
the attention of the block before it computes) or 'allgather' (Llama 3 §3.3.2: "we first
all-gather the key (K) and value (V) tensors, and then compute attention output for the local
query (Q) tensor chunk": only the local block's attention can run during the gather)."""
LOADS = ("full", "sharded")
ZERO3_GATHERS = ("layer", "tensor")
"""'layer' (one all-gather and one reduce-scatter per layer: FSDP's fully_shard per
transformer block, DeepSpeed's coalesced module gathers) or 'tensor' (one per parameter tensor
of ModelCost.layer_tensors, each paying the ring's latency over every rank and the host time
of its lists of one slice per rank, the small tensors kept gathered between steps: DeepSpeed's
ZeRO-3 before its coalesced gathers of v0.5.5, November 2021)."""


@dataclass(kw_only=True, slots=True, frozen=True)
class StackProfile:
    name: str
    """The name `--stack` takes."""
    release: str
    """The release the defaults are read from (and, for a dated variant, why it exists)."""
    memory_model: str
    """The stack's bytes per parameter under mixed precision (a memory model of
    profiles.toml's [memory_models], memory.MemoryModel): where
    its fp32 master weights live (a copy beside 16-bit parameters, or the parameters
    themselves) and its gradient buffers' dtype, as memory.py counts them."""
    dp_schedule: str
    """Data-parallel collectives per step (comms.DP_SCHEDULES)."""
    dp_bucket_bytes: float | None = None
    """Bytes per gradient bucket; None: the stack's own default for its memory model
    (MemoryModel.dp_bucket_bytes, comms.dp_bucket_bytes); 0: one call over the whole buffer."""
    zero3_gather: str
    """What one ZeRO-3 / FSDP collective carries: 'layer' or 'tensor' (ZERO3_GATHERS)."""
    balanced_stages: bool
    """Pipeline stages balanced so that the last stage's layers plus the output projection
    match the others (True), or ceil(L/p) layers a stage with the projection on top."""
    cp_method: str
    """How context-parallel ranks exchange K and V: 'ring' or 'allgather' (CP_METHODS)."""
    load: str
    """How a rank builds the model before training: 'full' (the whole model in fp32 host
    memory on every rank, then moved and sharded: a plain nn.Module or from_pretrained) or
    'sharded' (each rank creates only its own shard on the device: meta-device init, per-
    partition allocation, sharded jit init); LOADS."""
    fused_elementwise: bool = True
    """The stack runs norms, activations, rotary and residual adds in fused kernels
    (Transformer Engine, Apex, XLA, torch.compile); False: eagerly, one kernel per operator
    (efficiency.EAGER_ELEMENTWISE_PASSES)."""
    attention_kernels: tuple[str, ...] = ("flash2",)
    """The attention kernels the stack runs, preferred first (catalogue.ATTENTION_KERNELS):
    on an accelerator the first one with a published rate is used (efficiency.py)."""
    host_buffer_factor: float = 1.0
    """What host memory the stack asks for over the bytes it keeps there (offloaded states,
    the model while it is built): DeepSpeed's estimators multiply their CPU figure by their
    `additional_buffer_factor`, 1.5 by default (estimate_zero2_model_states_mem_needs in
    runtime/zero/stage_1_and_2.py and estimate_zero3_model_states_mem_needs in
    runtime/zero/stage3.py, DeepSpeed 0.19.8); its device figure has none."""
    zero_stages: tuple[int, ...] = ZERO_STAGES
    """The ZeRO stages the stack runs (0: plain data parallelism; 3: parameters sharded,
    FSDP's full shard): the search keeps to them, and a pinned stage outside them is
    refused. `runs_source` cites where each capability is read."""
    offloads: tuple[str, ...] = OFFLOAD
    """The CPU offloads the stack offers (layout.OFFLOAD)."""
    recomputes: tuple[str, ...] = RECOMPUTE
    """The activation recomputations the stack offers (layout.RECOMPUTE)."""
    runs_source: str = ""
    """Where the stack's options for the three fields above are read from."""
    async_collectives: bool = False
    """The compiler runs the tensor-parallel collectives asynchronously, overlapped with the
    layers' compute (XLA on TPU with async collective fusion, the LIBTPU_INIT_ARGS of
    MaxText's run scripts: --xla_tpu_enable_async_collective_fusion,
    --xla_tpu_overlap_compute_collective_tc; Wang et al. 2023, "Overlap communication with
    dependent computation via decomposition in large deep learning models", ASPLOS): the
    compute hides them as far as it lasts. False: they sit between the layer's GEMMs."""

    def __post_init__(self) -> None:
        for key, allowed in (
            ("memory_model", MEMORY_MODELS),
            ("dp_schedule", DP_SCHEDULES),
            ("zero3_gather", ZERO3_GATHERS),
            ("cp_method", CP_METHODS),
            ("load", LOADS),
        ):
            value = getattr(self, key)
            if value not in allowed:
                raise UserError(
                    f"{key} must be one of {', '.join(allowed)}. Received: {value!r}"
                )
        for kernel in self.attention_kernels:
            if kernel not in ATTENTION_KERNELS:
                raise UserError(f"attention_kernels must be among "
                                f"{', '.join(ATTENTION_KERNELS)}. Received: {kernel!r}")
        factor = self.host_buffer_factor
        if isinstance(factor, bool) or not isinstance(factor, (int, float)) or not (
                1.0 <= factor <= 16.0):
            raise UserError(f"host_buffer_factor must be in [1, 16]. Received: {factor!r}")
        checks: tuple[tuple[str, tuple[object, ...], tuple[object, ...]], ...] = (
            ("zero_stages", self.zero_stages, ZERO_STAGES),
            ("offloads", self.offloads, OFFLOAD),
            ("recomputes", self.recomputes, RECOMPUTE),
        )
        for key, values, choices in checks:
            unknown = [v for v in values if v not in choices]
            if not values or unknown or isinstance(values, (str, bytes)):
                raise UserError(f"{key} must be a non-empty list among "
                                f"{', '.join(map(str, choices))}. Received: {values!r}")
        if "none" not in self.offloads:
            raise UserError(f"offloads must include 'none'. Received: {self.offloads!r}")
        bucket = self.dp_bucket_bytes
        if bucket is not None and (
            isinstance(bucket, bool) or not isinstance(bucket, (int, float)) or bucket < 0
        ):
            raise UserError(f"dp_bucket_bytes must be >= 0. Received: {bucket!r}")

    def with_overrides(self, **changes: object) -> StackProfile:
        """The profile with some defaults overridden (`--memory-model`, `--zero3-gather`,
        `--cp-method`, `--stages`, `--elementwise`); unset (None) overrides keep the
        profile's."""
        kept = {k: v for k, v in changes.items() if v is not None}
        if not kept:
            return self
        if kept.get("memory_model") in MEMORY_MODELS and "dp_schedule" not in kept:
            kept["dp_schedule"] = model_of(str(kept["memory_model"])).dp_schedule
        return replace(self, name=f"{self.name} (overridden)", **kept)  # type: ignore[arg-type]


DATA = Path(__file__).with_name("profiles.toml")


def _load(path: Path = DATA) -> dict[str, StackProfile]:
    """The profiles of `path`, each checked by StackProfile, an unknown key refused by name."""
    allowed = {f.name for f in fields(StackProfile)} - {"name"}
    with path.open("rb") as fh:
        raw = tomllib.load(fh)
    if raw.get("schema") != 1 or not isinstance(raw.get("profiles"), dict):
        raise UserError(f"{path}: expected schema = 1 and [profiles.*]")
    out = {}
    for name, table in raw["profiles"].items():
        unknown = sorted(set(table) - allowed)
        if unknown:
            raise UserError(f"{path} [profiles.{name}]: unknown keys {unknown}; allowed: "
                            f"{', '.join(sorted(allowed))}")
        # The file's untyped values meet the typed record here, which checks each one.
        values: dict[str, Any] = {k: tuple(v) if isinstance(v, list) else v
                                  for k, v in table.items()}
        out[name] = StackProfile(name=name, **values)
    return out


PROFILES: dict[str, StackProfile] = _load()
"""Every stack profile (profiles.toml), loaded once."""
DEFAULT_STACK = "generic"
TORUS_STACK = "maxtext"
"""The stack a plan on a TPU assumes unless --stack says otherwise: TPUs run XLA stacks."""


def default_stack(accelerator: object) -> str:
    """The profile a plan assumes when --stack is not given: TORUS_STACK on a TPU (an
    accelerator with an ICI torus), else DEFAULT_STACK."""
    return TORUS_STACK if getattr(accelerator, "torus", None) is not None else DEFAULT_STACK


def profile(name: str) -> StackProfile:
    if name not in PROFILES:
        raise UserError(f"unknown stack {name!r}; allowed: {', '.join(PROFILES)}")
    return PROFILES[name]
