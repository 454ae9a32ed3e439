"""The DeepSpeed configuration sextant generates for a run (no framework import: the parent
process prints it for `sextant run --framework deepspeed --print-config`).

One DeepSpeed JSON config per strategy, the way DeepSpeed's own examples write it:

    parallel   single and dp are ZeRO stage 0 (DeepSpeed's data parallelism: gradients
               all-reduced in flat buckets), zero1/zero2/zero3 are stages 1-3
    precision  fp32, or DeepSpeed's `bf16` section (bf16 weights and gradients, fp32 master
               weights and optimizer state), not torch's autocast
    grad_accum DeepSpeed's `gradient_accumulation_steps` (the engine divides each
               micro-batch's loss by it and reduces at the boundary)
    clipping   off (`gradient_clipping` 0): sextant does not clip on any backend
    optimizer  not in the config: torch.optim.AdamW is handed to `deepspeed.initialize` as
               the client optimizer (`zero_allow_untested_optimizer`), so fp32 runs are the
               same arithmetic as the torch backend's
"""

from __future__ import annotations

from typing import Any

from sextant.core.errors import UserError
from sextant.strategy import Strategy

NEVER_PRINT = 2**31 - 1
"""steps_per_print: DeepSpeed's own progress lines are off (sextant reports the steps)."""


def ds_config(workload: Any, strategy: Strategy) -> dict[str, Any]:
    """The config dict handed to deepspeed.initialize for this workload and strategy."""
    dims = strategy.dims()
    replicas, accum = dims.dp, dims.grad_accum
    if workload.global_batch % (replicas * accum):
        raise UserError(f"deepspeed: the global batch ({workload.global_batch}) must divide "
                        f"into {replicas} ranks x {accum} micro-batches")
    zero: dict[str, Any] = {"stage": dims.zero}
    if zero["stage"] == 3:
        # DeepSpeed keeps parameters under 1e5 elements whole on every rank by default;
        # sextant's models are small, so without this ZeRO-3 would partition nothing.
        zero["stage3_param_persistence_threshold"] = 0
    return {
        "train_batch_size": workload.global_batch,
        "train_micro_batch_size_per_gpu": workload.global_batch // (replicas * accum),
        "gradient_accumulation_steps": accum,
        "gradient_clipping": 0.0,
        "zero_optimization": zero,
        "zero_allow_untested_optimizer": True,
        "bf16": {"enabled": strategy.precision == "bf16"},
        "steps_per_print": NEVER_PRINT,
        "wall_clock_breakdown": False,
    }
