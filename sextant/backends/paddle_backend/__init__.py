"""PaddlePaddle backend: dygraph or `paddle.jit.to_static`, single process or data parallel
over gloo (`paddle.DataParallel`, one process per rank started by sextant's launcher).

Paddle cannot share a process with TensorFlow (importing it after TensorFlow crashes) nor an
environment with MindSpore, so its workers run in their own environment
(`sextant env create paddle`). Paddle is imported only inside `run`, in the worker process.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from sextant.backends.base import BackendBase, Capabilities

if TYPE_CHECKING:
    from sextant.contracts import RankResult, WorkerContext
    from sextant.strategy import Strategy

_NO_SHARDING = ("Paddle shards optimizer state, gradients and parameters through "
                "paddle.distributed.sharding.group_sharded_parallel (levels os, os_g, "
                "p_g_os); not wired in yet")
_NO_MODEL_PARALLEL = ("Paddle's tensor and pipeline parallelism are fleet's hybrid-parallel "
                      "layers (paddle.distributed.fleet.meta_parallel); not wired in yet")


class PaddleBackend(BackendBase):
    name = "paddle"
    package = "paddle"
    extra = "paddle"
    ENVIRONMENT = "paddle"
    """Workers run under the interpreter of `sextant env create paddle` (sextant.core.envs)."""

    OPT_IN = ("it runs in its own environment (sextant env create paddle): Paddle crashes "
              "when imported after TensorFlow and cannot share an environment with MindSpore")

    STRATEGY_CODE = {
        "dp": ("sextant.backends.paddle_backend.train:_init_distributed",),
    }

    def capabilities(self) -> Capabilities:
        return Capabilities(
            modes=("eager", "compiled"),
            parallel=("single", "dp"),
            precisions=("fp32",),
            grad_accum=True,
            checkpoint=("single", "dp"),
            model_features=(),  # not written yet: a workload that needs one is refused
            why_not=(("zero1", _NO_SHARDING), ("zero2", _NO_SHARDING), ("fsdp", _NO_SHARDING),
                     ("zero3", _NO_SHARDING), ("tp", _NO_MODEL_PARALLEL),
                     ("pp", _NO_MODEL_PARALLEL)),
        )

    def check(self, strategy: Strategy) -> None:
        from sextant.core.errors import UserError

        if strategy.devices_per_worker != 1:
            raise UserError("paddle runs one device per worker process; use --workers")

    def compare_matrix(self, workers: int) -> list[dict[str, Any]]:
        """The strategies `sextant compare` runs by default."""
        return [
            {"mode": "eager", "parallel": "single", "workers": 1},
            {"mode": "compiled", "parallel": "single", "workers": 1},
            {"mode": "eager", "parallel": "dp", "workers": workers},
        ]

    def run(self, ctx: WorkerContext) -> RankResult:
        import warnings

        with warnings.catch_warnings():
            # Paddle warns at import that ccache is missing (it builds C++ extensions with it).
            warnings.filterwarnings("ignore", message="No ccache found")
            from sextant.backends.paddle_backend.train import run

        return run(ctx)
