"""What a training stack does by default, as one frozen record (`sextant plan --stack NAME`).

PlanOptions holds the user's own knobs (batch, precision, overlap, hardware overrides); a
StackProfile holds what the stack decides for them: how it allocates gradients and master
weights, how it buckets and schedules the data-parallel collectives, what one ZeRO-3 gather
carries, how it splits pipeline stages and how its context parallelism exchanges K and V. Each
profile is a stack at its current release; a dated variant exists only where a published
figure needs an older release, and says which.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from sextant.errors import UserError
from sextant.planner.catalogue import ATTENTION_KERNELS
from sextant.planner.comms import DP_SCHEDULES
from sextant.planner.memory import MEMORY_MODELS

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
    """The stack's bytes per parameter under mixed precision (memory.MEMORY_MODELS): where
    its fp32 master weights live (a copy beside 16-bit parameters, or the parameters
    themselves) and its gradient buffers' dtype, as memory.py counts them."""
    dp_schedule: str
    """Data-parallel collectives per step (comms.DP_SCHEDULES)."""
    dp_bucket_bytes: float | None
    """Bytes per gradient bucket; None: the stack's own default for its memory model
    (comms.DP_BUCKET_DEFAULTS); 0: one call over the whole buffer."""
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
        if "memory_model" in kept and "dp_schedule" not in kept:
            kept["dp_schedule"] = "torch" if kept["memory_model"] == "torch" else "zero"
        return replace(self, name=f"{self.name} (overridden)", **kept)  # type: ignore[arg-type]


_GENERIC = StackProfile(
    name="generic",
    release="the ZeRO paper's accounting (Rajbhandari et al. 2020 §3.1): no stack's "
    "own defaults",
    memory_model="zero",
    dp_schedule="zero",
    dp_bucket_bytes=None,
    zero3_gather="layer",
    balanced_stages=True,
    load="sharded",
    cp_method="ring",
)
"""No stack's own defaults. A dated profile that departs from it in a field or two is written
as it with those fields."""


PROFILES: dict[str, StackProfile] = {
    p.name: p
    for p in (
        _GENERIC,
        StackProfile(
            name="megatron-core",
            release="Megatron-Core 0.x (Megatron-Bridge 25.11): distributed optimizer with fp32 "
            "main gradients (developer guide, Distributed Optimizer), one reduction over the "
            "contiguous gradient buffer, uneven first/last pipeline stages, ring CP; Transformer "
            "Engine's attention: cuDNN's fused flash attention on Hopper, FlashAttention-2 "
            "before it",
            memory_model="megatron",
            dp_schedule="zero",
            dp_bucket_bytes=None,
            zero3_gather="layer",
            balanced_stages=True,
            load="sharded",
            cp_method="ring",
            attention_kernels=("flash3", "flash2"),
        ),
        StackProfile(
            name="deepspeed",
            release="DeepSpeed >= 0.5.5: its estimators' allocation "
            "(estimate_zero2/3_model_states_mem_needs), reduce_bucket_size 5e8 elements, "
            "ZeRO-3 gathers coalesced per module; the model built whole on every rank before "
            "deepspeed.initialize (zero.Init, which partitions at construction, is opt-in); the "
            "user's module run eagerly (its compile is opt-in)",
            memory_model="deepspeed",
            dp_schedule="zero",
            dp_bucket_bytes=None,
            zero3_gather="layer",
            balanced_stages=True,
            load="full",
            cp_method="ring",
            host_buffer_factor=1.5,
            fused_elementwise=False,
        ),
        StackProfile(
            name="torchtitan",
            release="torchtitan with FSDP2 (fully_shard per block, MixedPrecisionPolicy bf16 "
            "params / fp32 reduce), DDP's 25 MiB buckets, context parallel rotate method "
            "'allgather' (its JobConfig default); attention through PyTorch SDPA, whose default "
            "order tries the flash backend (FlashAttention-2) before cuDNN's (opt-in since "
            "pytorch#138522); eager unless torch.compile is enabled (job_config Compile.enable, "
            "default False)",
            memory_model="torch",
            dp_schedule="torch",
            dp_bucket_bytes=None,
            zero3_gather="layer",
            balanced_stages=True,
            load="sharded",
            cp_method="allgather",
            fused_elementwise=False,
        ),
        StackProfile(
            name="maxtext",
            release="MaxText (base.yml: weight_dtype float32, bf16 compute; FSDP over the "
            "scanned layers gathered per layer by XLA; all-gather context parallelism; on "
            "GPUs attention cudnn_flash_te, Transformer Engine's cuDNN flash attention)",
            memory_model="torch",
            dp_schedule="zero",
            dp_bucket_bytes=0,
            zero3_gather="layer",
            balanced_stages=True,
            load="sharded",
            cp_method="allgather",
            async_collectives=True,
            attention_kernels=("flash3", "flash2"),
        ),
        StackProfile(
            name="megatron-lm-2021",
            release="dated: Megatron-LM 2021-22 and its Megatron-DeepSpeed fork, for the "
            "figures of Narayanan et al. 2021, Korthikanti et al. 2022, MT-NLG and BLOOM: "
            "every stage ceil(L/p) layers, the output projection on top of the last",
            memory_model="zero",
            dp_schedule="zero",
            dp_bucket_bytes=None,
            zero3_gather="layer",
            balanced_stages=False,
            load="sharded",
            cp_method="ring",
        ),
        StackProfile(
            name="deepspeed-0.3",
            release="dated: DeepSpeed v0.3.13 (March 2021), for Narayanan et al. 2021's ZeRO-3 "
            "rows: one all-gather per parameter tensor, before its coalesced gathers of "
            "v0.5.5; run under Megatron-LM 2021's even stage split",
            memory_model="zero",
            dp_schedule="zero",
            dp_bucket_bytes=None,
            zero3_gather="tensor",
            balanced_stages=False,
            load="full",
            cp_method="ring",
        ),
        replace(
            _GENERIC,
            name="llm-foundry-2023",
            release="dated: MosaicML llm-foundry with Composer (2023), for its MPT benchmark "
            "tables: FSDP through Composer, attn_impl triton (FlashAttention in Triton, the "
            "triton-pre-mlir build it pinned), eager PyTorch; otherwise generic",
            attention_kernels=("triton-2023",),
            fused_elementwise=False,
        ),
        replace(
            _GENERIC,
            name="llama3-2024",
            release="dated: Meta's Llama 3 training stack, for Llama 3's 131,072-token MFU "
            "(Table 4), as Llama Team 2024 §3.3.2 describes its context parallelism (\"we "
            "first all-gather the key (K) and value (V) tensors\"); otherwise generic",
            cp_method="allgather",
        ),
    )
}
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
