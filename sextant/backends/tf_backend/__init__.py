"""TensorFlow backend: a custom training step under tf.function (XLA for 'compiled'); single
process, data parallel (MultiWorkerMirroredStrategy across processes, MirroredStrategy over
logical CPU devices inside one), or parameter servers (ParameterServerStrategy driven by a
ClusterCoordinator from a chief process). docs/tensorflow.md describes the mapping.

TensorFlow is imported only inside `run`, in the worker process, after the environment that
silences its start-up logging and fixes its numerics has been set.
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sextant.backends.base import (
    DEPLOY_INSTALL,
    BackendBase,
    Capabilities,
    ExportFormat,
    ProcessLayout,
)
from sextant.core.fsutil import private_tempdir

if TYPE_CHECKING:
    from sextant.contracts import RankResult, WorkerContext
    from sextant.strategy import Strategy

# Set in every TensorFlow worker before TensorFlow is imported, overriding the user's shell,
# so that a run's numerics and speed never depend on it (docs/tensorflow.md).
WORKER_ENV = {
    # C++ INFO and WARNING lines (CPU feature guard, gRPC server start-up, XLA notices).
    "TF_CPP_MIN_LOG_LEVEL": "2",
    "GRPC_VERBOSITY": "ERROR",
    "GLOG_minloglevel": "2",
    # oneDNN kernels: TensorFlow enables them by default only on CPUs with AVX-512/AMX, so on
    # AVX2 machines (this AMD EPYC) the default is off. On is faster here for the GPT in
    # both modes; parity with torch holds at 1e-5 either way.
    "TF_ENABLE_ONEDNN_OPTS": "1",
}

# Printed by TensorFlow's C++ libraries while `import tensorflow` runs, before absl logging is
# initialised, so TF_CPP_MIN_LOG_LEVEL cannot silence them.
IMPORT_NOTICES = (
    "All log messages before absl::InitializeLog() is called are written to STDERR",
    "oneDNN custom operations are on",
)

# Logged once per process (ERROR level, so TF_CPP_MIN_LOG_LEVEL=2 does not hide it) by the
# oneDNN graph-rewrite pass when a graph holds a bf16 or fp16 op and the CPU lacks AVX-512
# ("oneDNN supports DT_BFLOAT16 only on platforms with AVX-512. Falling back to the default
# Eigen-based implementation if present."). train.probe_16bit_notice records it instead.
ONEDNN_16BIT_NOTICE = "oneDNN supports DT_"


def prepare_environment() -> None:
    """The worker's TensorFlow environment; call before `import tensorflow`."""
    os.environ.update(WORKER_ENV)


def import_tensorflow(ctx: WorkerContext, scratch: bool = True) -> Any:
    """`import tensorflow` with its import-time notices filtered out of stderr.

    The import's stderr goes to rank{r}.tf-import.log in the run directory (kept if the
    import kills the process); anything else it printed is copied to stderr afterwards."""
    prepare_environment()
    if "tensorflow" in sys.modules:
        return sys.modules["tensorflow"]
    # autograph's generated modules go to a directory of this rank's own in its run
    # directory, deleted when the rank ends (in /tmp they would pile up: ~11 files a run).
    # Not for a parameter-server service process (scratch=False): it traces nothing, and the
    # launcher ends it with SIGKILL, which would leave the directory behind.
    if scratch:
        private_tempdir(f"rank{ctx.rank}.tmp-", parent=ctx.run_dir)
    with filtered_stderr(ctx.run_dir / f"rank{ctx.rank}.tf-import.log", IMPORT_NOTICES):
        import tensorflow as tf
    return tf


@contextlib.contextmanager
def filtered_stderr(path: Path, drop: tuple[str, ...]) -> Iterator[list[str]]:
    """Run the block with file descriptor 2 (where TensorFlow's C++ code logs) going to
    `path`. Afterwards the lines containing one of `drop` are put in the yielded list and
    every other line is copied to stderr; the file is deleted unless the block raised (or
    killed the process)."""
    dropped: list[str] = []
    sys.stderr.flush()
    saved = os.dup(2)
    with open(path, "w+b") as sink:
        os.dup2(sink.fileno(), 2)
        try:
            yield dropped
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            sink.seek(0)
            kept: list[str] = []
            for line in sink.read().decode(errors="replace").splitlines():
                if line.strip():
                    (dropped if any(n in line for n in drop) else kept).append(line)
            if kept:
                sys.stderr.write("\n".join(kept) + "\n")
                sys.stderr.flush()
    path.unlink()


TF_NO_SHARDING = (
    "tf.distribute in TensorFlow 2.21 has no sharded data parallelism (no ZeRO / FSDP "
    "strategy): every replica keeps whole variables and optimizer slots"
)
TF_NO_MODEL_PARALLEL = (
    "tf.distribute in TensorFlow 2.21 has data-parallel strategies only (Mirrored, "
    "MultiWorkerMirrored, ParameterServer, TPU); layouts that split a layer exist only in the "
    "experimental tf.experimental.dtensor (Mesh/Layout, no tf.distribute strategy, no pipeline "
    "schedule), and Keras 3's ModelParallel distribution is built for its JAX backend (its TensorFlow "
    "module is marked a prototype, 'DO NOT USE', in Keras 3.15)"
)


EXPORTS = (
    ExportFormat(name="savedmodel", runtime="tensorflow", needs=("tensorflow",),
                 install="pip install 'sextant[tensorflow]'", targets=("server",)),
    ExportFormat(name="litert", runtime="litert", needs=("tensorflow", "ai_edge_litert"),
                 install=DEPLOY_INSTALL, targets=("mobile", "edge")),
    ExportFormat(name="litert-int8", runtime="litert", needs=("tensorflow", "ai_edge_litert"),
                 install=DEPLOY_INSTALL, targets=("mobile", "edge"), quantized=True),
    ExportFormat(name="onnx", runtime="onnxruntime",
                 needs=("tensorflow", "tf2onnx", "onnxruntime"), install=DEPLOY_INSTALL,
                 targets=("server", "browser", "mobile")),
)


class TensorFlowBackend(BackendBase):
    name = "tensorflow"
    package = "tensorflow"
    extra = "tensorflow"

    def capabilities(self) -> Capabilities:
        # compiled (XLA) first: the fastest TensorFlow mode measured here, so the default.
        # No ZeRO/FSDP: tf.distribute has no sharded data-parallel strategy. No PowerSGD:
        # TensorFlow has no implementation of it.
        return Capabilities(
            modes=("compiled", "eager"),
            parallel=("single", "dp", "ps"),
            precisions=("fp32", "tf32", "bf16"),
            model_features=("qkv_bias", "tied_gpt_head", "lora", "lora_gpt", "masked_loss"),
            devices=("cpu", "gpu"),
            compress=("none", "bf16", "fp16"),
            grad_accum=True,
            checkpoint=("single", "dp"),
            why_not=(("zero1", TF_NO_SHARDING), ("zero2", TF_NO_SHARDING),
                     ("zero3", TF_NO_SHARDING), ("fsdp", TF_NO_SHARDING),
                     *((kind, TF_NO_MODEL_PARALLEL) for kind in ("tp", "tp-manual", "pp"))),
            exports=EXPORTS,
        )

    def check(self, strategy: Strategy) -> None:
        """Combinations the capability lists cannot express (checked in the parent)."""
        from sextant.core.errors import UserError

        if strategy.devices_per_worker > 1 and (strategy.parallel != "dp" or strategy.workers > 1):
            raise UserError(
                "tensorflow runs several devices per process only as MirroredStrategy over "
                "logical CPUs: devices_per_worker > 1 needs parallel dp with one worker "
                "(MultiWorkerMirroredStrategy and parameter-server workers use one CPU device "
                f"each). Received: parallel={strategy.parallel!r}, workers={strategy.workers}, "
                f"devices_per_worker={strategy.devices_per_worker}"
            )
        if strategy.parallel == "ps":
            levers = [f for f, on in (
                (f"--precision {strategy.precision}", strategy.precision != "fp32"),
                (f"--grad-accum {strategy.grad_accum}", strategy.grad_accum > 1),
                (f"--compress {strategy.compress}", strategy.compress != "none"),
                ("--checkpoint-every/--resume", bool(strategy.checkpoint_every or strategy.resume)),
            ) if on]
            if levers:
                raise UserError(
                    "tensorflow parameter-server training (parallel ps) runs fp32 without "
                    "levers; bf16, --grad-accum, --compress and checkpoints work with parallel "
                    f"single and dp (compress: dp only). Received: {', '.join(levers)}"
                )
        if strategy.compress != "none" and strategy.parallel != "dp":
            raise UserError(
                "tensorflow compresses gradients by casting before the replica all-reduce: "
                f"--compress needs parallel dp. Received: parallel={strategy.parallel!r}"
            )

    def compare_matrix(self, workers: int) -> list[dict[str, Any]]:
        """The strategies `sextant compare` runs by default: XLA, the fastest TF mode on CPU
        for these models (docs/tensorflow.md)."""
        return [
            {"mode": "compiled", "parallel": "single", "workers": 1},
            {"mode": "compiled", "parallel": "dp", "workers": workers},
        ]

    def process_layout(self, strategy: Strategy) -> ProcessLayout:
        if strategy.parallel == "ps":
            return ProcessLayout(
                roles=("chief",) + ("ps",) * strategy.ps + ("worker",) * strategy.workers,
                primary=(0,),
            )
        return ProcessLayout.workers(strategy.workers)

    def run(self, ctx: WorkerContext) -> RankResult:
        if ctx.strategy.parallel == "ps":
            from sextant.backends.tf_backend.ps import run as run_ps

            return run_ps(ctx)
        from sextant.backends.tf_backend.train import run

        return run(ctx)
