"""MLX backend: eager or mx.compile, single process or data parallel over mx.distributed's
ring (TCP) backend. On Linux MLX runs on the CPU (`pip install 'sextant[mlx]'` installs
`mlx[cpu]`; plain `mlx` does not import there); on Apple silicon the same code runs on its GPU.

MLX is imported only inside `run`, in the worker process.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from sextant.backends.base import BackendBase, Capabilities

if TYPE_CHECKING:
    from sextant.contracts import RankResult, WorkerContext
    from sextant.strategy import Strategy

_NOT_WIRED = ("MLX 0.32 offers nn.fully_shard (FSDP over nn.Modules) and tensor-parallel "
              "linear layers (nn.AllToShardedLinear, nn.ShardedToAllLinear); sextant's MLX "
              "model is a function of a parameter tree, not an nn.Module, and is not wired "
              "into them yet")


class MlxBackend(BackendBase):
    name = "mlx"
    package = "mlx"
    extra = "mlx"

    OPT_IN = ("on Linux its CPU build (mlx[cpu]) multiplies matrices with the reference "
              "BLAS it bundles, far slower than numpy's or torch's here "
              "(benchmarks/mlx_blas.py, docs/benchmarks.md)")

    STRATEGY_CODE = {
        "dp": ("sextant.backends.mlx_backend.train:_init_distributed",),
    }

    def capabilities(self) -> Capabilities:
        return Capabilities(
            modes=("compiled", "eager"),
            parallel=("single", "dp"),
            precisions=("fp32", "bf16"),
            model_features=("qkv_bias", "tied_gpt_head", "lora", "lora_gpt", "masked_loss"),
            checkpoint=("single", "dp"),
            why_not=(("zero1", _NOT_WIRED), ("zero2", _NOT_WIRED), ("fsdp", _NOT_WIRED),
                     ("zero3", _NOT_WIRED),
                     ("tp", _NOT_WIRED), ("pp", "MLX 0.32 has no pipeline schedule")),
        )

    def check(self, strategy: Strategy) -> None:
        from sextant.core.errors import UserError

        if strategy.devices_per_worker != 1:
            raise UserError("mlx runs one device per worker process; use --workers")

    def compare_matrix(self, workers: int) -> list[dict[str, Any]]:
        """The strategies `sextant compare` runs by default."""
        return [
            {"mode": "compiled", "parallel": "single", "workers": 1},
            {"mode": "compiled", "parallel": "dp", "workers": workers},
        ]

    def run(self, ctx: WorkerContext) -> RankResult:
        from sextant.backends.mlx_backend.train import run

        return run(ctx)
