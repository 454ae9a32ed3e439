"""PyTorch backend: eager or torch.compile; single process, DDP, ZeRO/FSDP2 (gloo on CPU, nccl
on CUDA), tensor parallel (DTensor) and pipeline parallel (torch.distributed.pipelining).

Torch is imported only inside `run`, in the worker process.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from sextant.backends.base import DEPLOY_INSTALL, BackendBase, Capabilities, ExportFormat

if TYPE_CHECKING:
    from sextant.contracts import RankResult, WorkerContext
    from sextant.strategy import Strategy


EXPORTS = (
    ExportFormat(name="torch-export", runtime="torch", needs=("torch",),
                 install="pip install 'sextant[torch]'", targets=("server",)),
    ExportFormat(name="onnx", runtime="onnxruntime",
                 needs=("torch", "onnx", "onnxscript", "onnxruntime"), install=DEPLOY_INSTALL,
                 targets=("server", "browser", "mobile")),
    ExportFormat(name="aoti", runtime="aoti", needs=("torch",),
                 install="a C++ compiler (g++ or clang++) on PATH", targets=("server",),
                 compiler=True),
    ExportFormat(name="executorch", runtime="executorch", needs=("torch", "executorch"),
                 install="pip install executorch", targets=("mobile", "edge")),
)


class TorchBackend(BackendBase):
    name = "torch"
    package = "torch"
    extra = "torch"

    STRATEGY_CODE = {
        "dp": ("sextant.backends.torch_backend.train:_apply_ddp",),
        "zero1": ("sextant.backends.torch_backend.train:_apply_ddp",),
        "zero2": ("sextant.backends.torch_backend.train:_apply_fsdp",),
        "fsdp": ("sextant.backends.torch_backend.train:_apply_fsdp",),
        "tp": tuple(f"sextant.backends.torch_backend.parallel:{name}" for name in (
            "rank_mesh", "apply_tp", "grad_norm", "average_over_dp")),
        "pp": tuple(f"sextant.backends.torch_backend.parallel:{name}" for name in (
            "rank_mesh", "Stage", "pipeline", "pipeline_loss", "grad_norm", "average_over_dp",
            "gather_stages")),
    }

    def capabilities(self) -> Capabilities:
        return Capabilities(
            modes=("eager", "compiled"),
            parallel=("single", "dp", "zero1", "zero2", "fsdp", "tp", "pp"),
            precisions=("fp32", "tf32", "bf16", "fp16"),
            model_features=("qkv_bias", "tied_gpt_head", "lora", "lora_gpt", "masked_loss",
                            "bf16_base"),
            devices=("cpu", "gpu"),
            compress=("none", "bf16", "fp16", "powersgd"),
            grad_accum=True,
            activation_checkpointing=True,
            # ZeroRedundancyOptimizer's state dict is consolidated on one rank, which
            # torch.distributed.checkpoint does not read back: zero1 is not checkpointed.
            checkpoint=("single", "dp", "zero2", "fsdp"),
            why_not=(("zero3", "PyTorch's ZeRO-3 is FSDP2: --parallel fsdp "
                               "(or --framework deepspeed for DeepSpeed's)"),
                     ("tp-manual", "PyTorch's tensor parallelism is DTensor's "
                                   "parallelize_module (parallel tp); Megatron's hand-written "
                                   "all-reduce autograd functions are what it replaces, so "
                                   "sextant runs the library's way"),),
            exports=EXPORTS,
        )

    def check(self, strategy: Strategy) -> None:
        from sextant.core.errors import UserError

        if strategy.compress != "none" and strategy.parallel not in ("dp", "zero1"):
            raise UserError(
                f"torch compresses gradients through DDP communication hooks: --compress "
                f"needs parallel dp or zero1. Received: parallel={strategy.parallel!r}"
            )
        if strategy.devices_per_worker != 1:
            raise UserError("torch runs one device per worker process; use --workers")
        if strategy.parallel in ("tp", "pp"):
            unsupported = [flag for flag, on in (
                ("--grad-accum", strategy.grad_accum > 1),
                (f"--precision {strategy.precision}",
                 strategy.precision not in ("fp32", "tf32")),
            ) if on]
            if unsupported:
                raise UserError(f"torch {strategy.parallel} runs fp32 or tf32 without gradient "
                                f"accumulation (the pipeline's micro-batches are its "
                                f"accumulation); received {', '.join(unsupported)}")
        if strategy.parallel == "pp" and strategy.mode == "compiled":
            raise UserError("torch pp runs eager: torch.distributed.pipelining stages are not "
                            "compiled by sextant yet; use --mode eager")

    def compare_matrix(self, workers: int) -> list[dict[str, Any]]:
        """The strategies `sextant compare` runs by default."""
        return [
            {"mode": "eager", "parallel": "single", "workers": 1},
            {"mode": "compiled", "parallel": "single", "workers": 1},
            {"mode": "eager", "parallel": "dp", "workers": workers},
        ]

    def run(self, ctx: WorkerContext) -> RankResult:
        from sextant.backends.torch_backend.train import run

        return run(ctx)
