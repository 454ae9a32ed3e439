"""MindSpore backend: PyNative ('eager') or a `mindspore.jit` static graph ('compiled'), single
process or data parallel over MindSpore's dynamic cluster (a scheduler process plus one
process per worker, collectives over its mccl TCP library on the CPU). docs/mindspore.md
describes the mapping and the numbers.

MindSpore trains in an environment of its own (`sextant env create mindspore`): its
distributed runtime needs numpy < 2, which JAX does not accept, and it cannot share a process
with PaddlePaddle. It is imported only inside `run`, in the worker process.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from sextant.backends.base import BackendBase, Capabilities, ProcessLayout

if TYPE_CHECKING:
    from sextant.contracts import RankResult, WorkerContext
    from sextant.strategy import Strategy

_ASCEND_ONLY = ("MindSpore 2.10 shards and splits models through its auto-parallel "
                "compiler (mindspore.parallel.auto_parallel.AutoParallel: optimizer/HSDP "
                "sharding, operator sharding, pipeline stages), whose only listed platform "
                "is Ascend")


class MindSporeBackend(BackendBase):
    name = "mindspore"
    package = "mindspore"
    extra = "mindspore"
    ENVIRONMENT = "mindspore"

    OPT_IN = ("it trains in an environment of its own (sextant env create mindspore, "
              "about 2.8 GB)")

    STRATEGY_CODE = {
        "dp": ("sextant.backends.mindspore_backend.train:_init_distributed",
               "sextant.backends.mindspore_backend.train:serve_scheduler",
               "sextant.backends.mindspore_backend.train:cluster_env"),
    }

    def capabilities(self) -> Capabilities:
        # eager first: PyNative is MindSpore's default mode.
        return Capabilities(
            modes=("eager", "compiled"),
            parallel=("single", "dp"),
            # bf16: MindSpore 2.10's CPU MatMul kernel has no bfloat16 (docs/mindspore.md).
            precisions=("fp32",),
            grad_accum=True,
            checkpoint=("single", "dp"),
            model_features=(),  # not written yet: a workload that needs one is refused
            why_not=(*((kind, _ASCEND_ONLY) for kind in ("zero1", "zero2", "zero3", "fsdp",
                                                          "tp", "pp")),
                     ("tp-manual", "not built for MindSpore"),
                     ("dp-manual", "not built for MindSpore: parallel dp averages the "
                                   "gradients with MindSpore's nn.DistributedGradReducer"),
                     ("ps", "MindSpore's parameter-server mode (MS_PSERVER processes) is "
                            "not built in sextant")),
        )

    def check(self, strategy: Strategy) -> None:
        from sextant.core.errors import UserError

        if strategy.devices_per_worker != 1:
            raise UserError("mindspore runs one CPU device per worker process; use --workers")

    def process_layout(self, strategy: Strategy) -> ProcessLayout:
        """dp: the workers, then MindSpore's scheduler as a service rank (it trains nothing;
        the workers register with it and it watches their heartbeats)."""
        if strategy.parallel == "dp":
            return ProcessLayout(roles=("worker",) * strategy.workers + ("scheduler",),
                                 primary=tuple(range(strategy.workers)))
        return ProcessLayout.workers(strategy.workers)

    def compare_matrix(self, workers: int) -> list[dict[str, Any]]:
        """The strategies `sextant compare` runs when named: Graph mode, the faster one."""
        return [
            {"mode": "compiled", "parallel": "single", "workers": 1},
            {"mode": "compiled", "parallel": "dp", "workers": workers},
        ]

    def run(self, ctx: WorkerContext) -> RankResult:
        from sextant.backends.mindspore_backend.train import run

        return run(ctx)
