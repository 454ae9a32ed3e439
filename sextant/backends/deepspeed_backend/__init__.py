"""DeepSpeed backend: PyTorch underneath, driven by a generated DeepSpeed config: ZeRO stages
0-3 (parallel single/dp, zero1, zero2, zero3), bf16, gradient accumulation and checkpoints
through the engine (gloo on CPU, nccl on CUDA), launched by sextant's own launcher.

DeepSpeed (and torch) are imported only inside `run`, in the worker process.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from sextant.backends.base import BackendBase, Capabilities

if TYPE_CHECKING:
    from sextant.contracts import RankResult, WorkerContext
    from sextant.strategy import Strategy
    from sextant.workloads.spec import Workload

_INITIALIZE = "sextant.backends.deepspeed_backend.config:ds_config"
_TRAIN = "sextant.backends.deepspeed_backend.train:_train"


class DeepSpeedBackend(BackendBase):
    name = "deepspeed"
    package = "deepspeed"
    extra = "deepspeed"

    # A DeepSpeed strategy is one line of its config: the code is the generated config and
    # the engine set-up, the same for every stage.
    STRATEGY_CODE = {p: (_INITIALIZE, _TRAIN) for p in ("dp", "zero1", "zero2", "zero3")}

    def capabilities(self) -> Capabilities:
        return Capabilities(
            modes=("eager",),
            parallel=("single", "dp", "zero1", "zero2", "zero3"),
            precisions=("fp32", "tf32", "bf16"),
            model_features=("qkv_bias", "tied_gpt_head", "lora", "lora_gpt", "masked_loss"),
            devices=("cpu", "gpu"),
            grad_accum=True,
            checkpoint=("single", "dp", "zero1", "zero2", "zero3"),
            why_not=(
                ("fsdp", "DeepSpeed shards parameters as ZeRO stage 3: use --parallel zero3"),
                ("tp", "DeepSpeed's tensor parallelism (AutoTP) targets inference and "
                       "Hugging Face models; sextant does not wire it"),
                ("pp", "DeepSpeed's pipeline needs the model rewritten as a PipelineModule "
                       "of layers; sextant does not wire it"),
            ),
        )

    def check(self, strategy: Strategy) -> None:
        from sextant.core.errors import UserError

        if strategy.devices_per_worker != 1:
            raise UserError("deepspeed runs one device per worker process; use --workers")
        if strategy.precision == "bf16" and strategy.parallel in ("single", "dp"):
            # Measured: the first AdamW update is 0.735 x lr, Adam's bias correction at step 2.
            raise UserError(
                "deepspeed bf16 needs ZeRO stage 1-3 (--parallel zero1, zero2 or zero3): at "
                "stage 0 (single, dp) DeepSpeed wraps the optimizer in its fp16 unfused "
                "optimizer, which takes a zero-gradient AdamW step at start-up (a weight-decay "
                "update, and Adam's step count one ahead), so it does not train the same thing")

    def compare_matrix(self, workers: int) -> list[dict[str, Any]]:
        """One row by default: ZeRO-2, DeepSpeed's usual set-up (each run pays DeepSpeed's
        import and engine start, ~20 s on 2 cores); the other stages: `compare
        levers` or `sextant run`."""
        return [{"mode": "eager", "parallel": "zero2", "workers": workers}]

    def generated_config(self, workload: Workload, strategy: Strategy) -> dict[str, Any]:
        from sextant.backends.deepspeed_backend.config import ds_config

        return ds_config(workload, strategy)

    def run(self, ctx: WorkerContext) -> RankResult:
        from sextant.backends.deepspeed_backend.train import run

        return run(ctx)
