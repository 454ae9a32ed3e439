"""Keras 3 backend: the canonical model in Keras layers, trained by `model.fit`, on the JAX,
torch or TensorFlow backend of Keras (Strategy.keras_backend, KERAS_BACKEND in the worker).
Data parallel through `keras.distribution.DataParallel`, on the JAX backend only.
docs/keras.md describes the mapping and what the high-level API costs.

Keras is imported only inside `run`, in the worker process, after KERAS_BACKEND is set.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from sextant.backends.base import DEPLOY_INSTALL, BackendBase, Capabilities, ExportFormat

if TYPE_CHECKING:
    from sextant.contracts import RankResult, WorkerContext
    from sextant.strategy import Strategy

KERAS_DP_JAX_ONLY = (
    "keras.distribution (DataParallel, ModelParallel) runs on the JAX backend only in Keras "
    "3.15: torch has no distribution module, TensorFlow's is a prototype marked 'DO NOT USE', "
    "and Keras fit fails under TensorFlow's MultiWorkerMirrored strategy"
)
KERAS_NO_SHARDING = (
    "Keras 3.15's distribution API shards variables only through ModelParallel's LayoutMap "
    "(JAX backend), not built in sextant; it has no optimizer-state or gradient sharding"
)
KERAS_NO_MODEL_PARALLEL = (
    "Keras 3.15 splits layers only through keras.distribution.ModelParallel with a LayoutMap "
    "(JAX backend), not built in sextant; it has no pipeline schedule"
)


# Keras exports from its TensorFlow backend, whatever backend it trained on (export.py).
EXPORTS = (
    ExportFormat(name="savedmodel", runtime="tensorflow", needs=("keras", "tensorflow"),
                 install="pip install 'sextant[keras,tensorflow]'", targets=("server",)),
    ExportFormat(name="onnx", runtime="onnxruntime",
                 needs=("keras", "tensorflow", "tf2onnx", "onnxruntime"), install=DEPLOY_INSTALL,
                 targets=("server", "browser", "mobile")),
    ExportFormat(name="litert", runtime="litert",
                 needs=("keras", "tensorflow", "ai_edge_litert"), install=DEPLOY_INSTALL,
                 targets=("mobile", "edge")),
)


class KerasBackend(BackendBase):
    name = "keras"
    package = "keras"
    extra = "keras"

    STRATEGY_CODE = {"dp": ("sextant.backends.keras_backend.train:_distribution",)}

    def capabilities(self) -> Capabilities:
        # compiled (jit_compile=True) first: what a Keras user gets by default on JAX (jit)
        # and the faster mode on each backend here.
        return Capabilities(
            modes=("compiled", "eager"),
            parallel=("single", "dp"),
            precisions=("fp32",),
            model_features=("qkv_bias", "tied_gpt_head", "lora", "masked_loss"),
            checkpoint=("single", "dp"),
            why_not=(("ps", "Keras fit fails under TensorFlow's ParameterServerStrategy; "
                            "parameter servers run on framework tensorflow"),
                     ("dp-manual", "Keras' data parallelism is declarative "
                                   "(keras.distribution.DataParallel, parallel dp)"),
                     *((kind, KERAS_NO_SHARDING) for kind in ("zero1", "zero2", "fsdp")),
                     *((kind, KERAS_NO_MODEL_PARALLEL) for kind in ("tp", "tp-manual", "pp"))),
            exports=EXPORTS,
        )

    def check(self, strategy: Strategy) -> None:
        from sextant.core.errors import UserError

        if strategy.parallel == "dp" and strategy.keras_backend != "jax":
            raise UserError(f"keras-{strategy.keras_backend} does not support parallel 'dp' "
                            f"({KERAS_DP_JAX_ONLY}); use --keras-backend jax")

    OPT_IN = ("a front end over another framework's runtime (fit's cost against that "
              "framework's own loop: benchmarks/keras_fit.py, docs/keras.md), not a stack of "
              "its own for the advisor")

    def compare_matrix(self, workers: int) -> list[dict[str, Any]]:
        """One row when named (Keras' import and compile cost ~10 s a row on 2 cores): fit
        on its default JAX backend. The torch and tensorflow backends and dp are run with
        `sextant run --framework keras --keras-backend ...`."""
        return [{"mode": "compiled", "parallel": "single", "workers": 1, "keras_backend": "jax"}]

    def run(self, ctx: WorkerContext) -> RankResult:
        from sextant.backends.keras_backend.train import run

        return run(ctx)
