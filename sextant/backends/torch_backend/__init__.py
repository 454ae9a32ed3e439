"""PyTorch backend: eager or torch.compile; single process or DDP (gloo on CPU, nccl on CUDA).

Torch is imported only inside `run`, in the worker process.
"""

from __future__ import annotations

from typing import Any

from sextant.backends.base import Capabilities


class TorchBackend:
    name = "torch"
    package = "torch"
    extra = "torch"

    def capabilities(self) -> Capabilities:
        return Capabilities(modes=("eager", "compiled"), parallel=("single", "dp"),
                            precisions=("fp32",))

    def compare_matrix(self, workers: int) -> list[dict[str, Any]]:
        """The strategies `sextant compare` runs by default."""
        return [
            {"mode": "eager", "parallel": "single", "workers": 1},
            {"mode": "compiled", "parallel": "single", "workers": 1},
            {"mode": "eager", "parallel": "dp", "workers": workers},
        ]

    def run(self, ctx: Any) -> dict[str, Any]:
        from sextant.backends.torch_backend.train import run

        return run(ctx)
