"""How a workload is run: framework, execution mode, parallelism, workers, precision.

Framework, execution mode and parallel strategy are separate axes; each backend declares
which values it supports (`Capabilities`), and asking for anything else is a UserError that
names what is supported, never a silent fallback.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from sextant.core.errors import UserError
from sextant.core.fields import (
    boolean,
    check_fields,
    int_at_least,
    one_of,
    option,
    to_flags,
)

FRAMEWORKS = ("torch", "jax", "tensorflow", "deepspeed", "mlx", "keras", "paddle",
              "mindspore")
KERAS_BACKENDS = ("jax", "torch", "tensorflow")
"""The backends Keras 3 runs on (framework 'keras', Strategy.keras_backend)."""
MODES = ("eager", "compiled")
# The parallel-strategy vocabulary shared by all backends (each supports a subset):
#   single     one process, one device
#   dp         data parallel; gradients all-reduced by the framework's own mechanism
#              (torch DDP, XLA-inserted collectives over a jax Mesh, tf MultiWorkerMirrored)
#   dp-manual  data parallel written by hand: per-device step with an explicit gradient
#              mean (jax shard_map + pmean), the style articles contrast with declarative dp
#   zero1      data parallel with the optimizer state sharded across ranks (ZeRO stage 1)
#   zero2      ... and the gradients sharded too (ZeRO stage 2)
#   fsdp       parameters, gradients and optimizer state sharded across data-parallel ranks
#              (ZeRO-3 style)
#   zero3      the same sharding under DeepSpeed's name: ZeRO stage 3 of the DeepSpeed engine
#   ps         parameter servers hold the variables; workers push gradients asynchronously
#   tp         tensor parallel (Megatron's split): attention heads and MLP columns divided
#              over `tp` devices, column-parallel in, row-parallel out; with more devices than
#              `tp`, the rest is data parallel (dp x tp on a 2-D device mesh)
#   tp-manual  the same split written by hand: explicit all-reduces of the partial sums
#              (jax shard_map + psum, Megatron's f/g operators)
#   pp         pipeline parallel: the layers cut into `pp` stages, each batch into
#              `microbatches`, run by a `schedule` (gpipe or 1f1b); dp x pp likewise
PARALLEL = ("single", "dp", "dp-manual", "zero1", "zero2", "zero3", "fsdp", "ps", "tp",
            "tp-manual", "pp")
ZERO_STAGE = {"single": 0, "dp": 0, "dp-manual": 0, "zero1": 1, "zero2": 2, "zero3": 3,
              "fsdp": 3}
"""The data-parallel strategies as ZeRO stages: what each shards (1: optimizer state, 2: and
gradients, 3: and parameters; FSDP is stage 3). The one table: DeepSpeed's config, the bytes
measured and planned, and the planner's layout of a run read it."""
DATA_PARALLEL = tuple(p for p in ZERO_STAGE if p != "single")
TENSOR_PARALLEL = ("tp", "tp-manual")
PIPELINE_SCHEDULES = ("gpipe", "1f1b")
# Numerical precision, with one meaning on every framework and device:
#   fp32  true fp32 matmuls (no TF32: XLA and cuBLAS default to TF32 on GPUs; sextant turns it
#         off, so an fp32 comparison is about frameworks, not about precision)
#   tf32  fp32 storage, matmuls on TF32 tensor cores where the device has them (a CPU has
#         none: the run records its effective precision as fp32)
#   bf16  mixed precision: fp32 master weights, bf16 matmul and attention operands, norms,
#         softmax and the loss in fp32 (torch autocast's policy)
#   fp16  the same in fp16, with dynamic loss scaling
PRECISION_MEANINGS = {
    "fp32": "true fp32, no TF32 on any framework",
    "tf32": "TF32 matmuls where the device has them",
    "bf16": "mixed: fp32 master weights, bf16 matmuls",
    "fp16": "mixed as bf16, in fp16 with loss scaling",
}
"""One line per precision, in the order of PRECISIONS (the CLI's help is made of them)."""
PRECISIONS = tuple(PRECISION_MEANINGS)
PRECISION_HELP = ", ".join(f"{name} ({meaning})" for name, meaning in PRECISION_MEANINGS.items())
MIXED_PRECISIONS = ("bf16", "fp16")
DEVICES = ("cpu", "gpu")
"""Where a run's ranks compute: 'cpu' cores, or one 'gpu' per rank (placed by local rank)."""
# Gradient-communication compression: cast to 16 bits before the all-reduce, or PowerSGD
# (low-rank, with error feedback).
MAX_THREADS = 1024
"""Threads per worker: above any machine's cores per process; a million crashed the worker."""
COMPRESSIONS = ("none", "bf16", "fp16", "powersgd")


@dataclass(frozen=True, slots=True)
class ParallelDims:
    """A run's parallel layout as one typed value, read alike by the runner, the backends, the
    measured and planned communication and the planner (in the manner of torchtitan's
    ParallelDims): devices = dp x tp x pp."""

    dp: int
    """Data-parallel replicas: the global batch is split this many ways."""
    tp: int
    """Tensor-parallel degree: devices that split each layer."""
    pp: int
    """Pipeline stages."""
    zero: int | None
    """ZeRO stage of the data-parallel group (ZERO_STAGE: 0 replicates, 3 shards everything);
    None where the strategy's data parallelism is none of those (parameter servers, tensor-
    and pipeline-parallel runs, whose data-parallel part is plain replication)."""
    sp: bool
    """Sequence parallelism between the tensor-parallel regions."""
    microbatches: int
    """Pipeline micro-batches per batch."""
    grad_accum: int
    """Micro-batches per optimizer step (gradients communicated once per step)."""
    ps: int
    """Parameter-server processes (beside the dp x tp x pp training devices)."""

    @property
    def devices(self) -> int:
        return self.dp * self.tp * self.pp


@dataclass(kw_only=True, slots=True, frozen=True)
class Strategy:
    framework: str = option(dataclasses.MISSING, one_of(FRAMEWORKS, "framework"), group="who",
                            flag_default="torch",
                            help=f"{', '.join(FRAMEWORKS)} (default: torch)")
    """Which framework trains the workload."""
    mode: str = option("eager", one_of(MODES, "mode"), group="who", flag_default=None,
                       help="eager or compiled (default: the framework's usual way: eager for "
                            "torch, compiled (jit) for jax)")
    """'eager' or 'compiled' (torch.compile, jax.jit, tf.function(jit_compile=True))."""
    parallel: str = option("single", one_of(PARALLEL, "parallel strategy"), group="who",
                           choices=PARALLEL,
                           help="the parallel strategy (default: {default}; `sextant "
                                "capabilities` shows which framework supports which)")
    """'single' (one process) or 'dp' (data parallel, gradients all-reduced)."""
    workers: int = option(1, int_at_least(1), group="who", flag_default=None,
                          help="worker processes (default: 1, or 2 with a parallel strategy)")
    """Worker processes."""
    precision: str = option("fp32", one_of(PRECISIONS, "precision"), group="device",
                            choices=PRECISIONS,
                            help=PRECISION_HELP + "; default: {default}")
    """Numerical precision (PRECISIONS): what the framework is asked for; each run records
    the precision it actually used."""
    device: str = option("cpu", one_of(DEVICES, "device"), group="device", flag_default="auto",
                         choices=("auto", *DEVICES),
                         help="where ranks compute: one GPU per rank where the host has GPUs "
                              "(auto, the default), or CPU cores (cpu), or refuse without GPUs "
                              "(gpu)")
    """'cpu', or 'gpu': one GPU per primary rank, the host's visible device at its local rank
    (the CLI's --device auto picks 'gpu' where the host has GPUs)."""
    grad_accum: int = option(1, int_at_least(1), group="lever",
                             help="micro-batches per optimizer step (global batch unchanged; "
                                  "default 1)")
    """Micro-batches per optimizer step; gradients are communicated once per step. The global
    batch is unchanged, so the losses must equal the grad_accum=1 run."""
    compress: str = option("none", one_of(COMPRESSIONS, "compression"), group="lever",
                           help="gradient-communication compression: none (default), bf16, "
                                "fp16, powersgd")
    """Gradient-communication compression (data-parallel strategies only)."""
    activation_checkpointing: bool = option(
        False, boolean, group="lever",
        help="recompute each transformer block in backward instead of keeping its activations "
             "(`sextant capabilities` shows who supports it)")
    """Recompute each transformer block's activations in the backward pass instead of keeping
    them (less activation memory, about one more forward per step; numerics unchanged)."""
    checkpoint_every: int = option(0, int_at_least(0), group="lever",
                                   help="save a checkpoint every K steps (default: never)")
    """Save a checkpoint after every K steps (0: never)."""
    checkpoint_dir: str | None = option(None, group="lever", help="checkpoint directory")
    """Where checkpoints go (required with checkpoint_every or resume)."""
    resume: bool = option(False, group="lever",
                          help="continue from the newest valid checkpoint in --checkpoint-dir")
    """Continue from the newest valid checkpoint in checkpoint_dir."""
    trust_checkpoint: bool = option(
        False, boolean, group="lever",
        help="with --resume: also load checkpoints not signed with your own key (written by "
             "someone else: loading one can run their code; see docs/reliability.md)")
    """Load checkpoints not signed with this user's key (sextant.checkpoint's trust model)."""
    devices_per_worker: int = option(1, int_at_least(1), group="layout",
                                     help="devices inside each worker process (jax host "
                                          "devices, tensorflow logical CPUs; default: 1)")
    """Devices inside each worker process (jax: host devices of one CPU process;
    tensorflow: logical CPU devices under MirroredStrategy)."""
    ps: int = option(0, int_at_least(0), group="layout",
                     help="parameter-server processes (with --parallel ps)")
    """Parameter-server processes (parallel 'ps' only)."""
    threads: int | None = option(None, int_at_least(1, optional=True, at_most=MAX_THREADS),
                                 group="who", help="threads per worker (default: cores / "
                                                   "workers)")
    """Intra-op threads per worker; default: the machine's cores divided by the workers."""
    tp: int = option(1, int_at_least(1), group="layout", flag_default=None,
                     help="with --parallel tp/tp-manual: tensor-parallel degree (default: all "
                          "devices; fewer makes the rest data parallel, dp x tp)")
    """Tensor-parallel degree (parallel 'tp' / 'tp-manual'): devices that split each layer."""
    pp: int = option(1, int_at_least(1), group="layout", flag_default=None,
                     help="with --parallel pp: pipeline stages (default: all devices; fewer "
                          "makes the rest data parallel, dp x pp)")
    """Pipeline stages (parallel 'pp')."""
    microbatches: int = option(1, int_at_least(1), group="layout", flag_default=None,
                               help="with --parallel pp: micro-batches per batch (default: 2 x "
                                    "stages)")
    """Micro-batches each batch is cut into for the pipeline (parallel 'pp')."""
    schedule: str = option("gpipe", one_of(PIPELINE_SCHEDULES, "pipeline schedule"),
                           group="layout", help="with --parallel pp: gpipe (default) or 1f1b")
    """Pipeline schedule (parallel 'pp'): 'gpipe' (all forwards, then all backwards) or
    '1f1b' (one forward, one backward, interleaved once the pipeline is full)."""
    sequence_parallel: bool = option(False, boolean, group="layout",
                                     help="with --parallel tp: split norms and residuals "
                                          "along the sequence")
    """With tensor parallelism: norms and residuals split along the sequence between the
    tensor-parallel regions (all-gather / reduce-scatter instead of all-reduce)."""
    keras_backend: str = option("jax", one_of(KERAS_BACKENDS, "keras backend"), group="lever",
                                help="with --framework keras: the backend Keras runs on, jax "
                                     "(default: the one with keras.distribution), torch or "
                                     "tensorflow")
    """Framework 'keras' only: the backend Keras 3 runs on (KERAS_BACKEND in the worker):
    'jax' (the default: the only one with keras.distribution on Keras 3.15, and Keras'
    fastest here, docs/keras.md), 'torch' or 'tensorflow'."""

    def __post_init__(self) -> None:
        check_fields(self)
        self._check_layout()
        self._check_levers()
        self._check_model_parallel()

    def _check_layout(self) -> None:
        if self.parallel == "single" and (self.workers != 1 or self.devices_per_worker != 1):
            raise UserError(
                f"parallel 'single' runs one worker on one device. Received: "
                f"workers={self.workers}, devices_per_worker={self.devices_per_worker}; "
                "use --parallel dp for several"
            )
        if self.parallel == "ps" and self.ps < 1:
            raise UserError("parallel 'ps' needs at least one parameter server (--ps N)")
        if self.parallel != "ps" and self.ps:
            raise UserError(
                f"--ps is only for parallel 'ps'. Received: parallel={self.parallel!r}, ps={self.ps}"
            )
        if self.device == "gpu" and self.devices_per_worker != 1:
            raise UserError("on GPUs each worker process drives one GPU: devices_per_worker "
                            f"must be 1. Received: {self.devices_per_worker}; use --workers "
                            f"{self.workers * self.devices_per_worker}")

    def _check_levers(self) -> None:
        if self.compress != "none" and self.parallel in ("single", "ps"):
            raise UserError(
                f"--compress applies to gradient all-reduces; parallel {self.parallel!r} has none"
            )
        if self.trust_checkpoint and not self.resume:
            raise UserError("--trust-checkpoint applies to the checkpoints a --resume loads; "
                            "give --resume too")
        if (self.checkpoint_every or self.resume) and not self.checkpoint_dir:
            raise UserError("--checkpoint-every and --resume need --checkpoint-dir")
        if self.framework != "keras" and self.keras_backend != "jax":
            raise UserError("--keras-backend is for framework 'keras'. "
                            f"Received: framework={self.framework!r}, "
                            f"keras_backend={self.keras_backend!r}")

    def _check_model_parallel(self) -> None:
        devices = self.workers * self.devices_per_worker
        if self.parallel in TENSOR_PARALLEL:
            if self.tp < 2 or devices % self.tp:
                raise UserError(
                    f"parallel {self.parallel!r} needs --tp N >= 2 dividing the {devices} "
                    f"devices (the rest is data parallel). Received: tp={self.tp}")
        elif self.tp != 1 or self.sequence_parallel:
            raise UserError("--tp and --sequence-parallel are for parallel 'tp' or 'tp-manual'. "
                            f"Received: parallel={self.parallel!r}")
        if self.parallel == "pp":
            if self.pp < 2 or devices % self.pp:
                raise UserError(
                    f"parallel 'pp' needs --pp N >= 2 dividing the {devices} devices (the "
                    f"rest is data parallel). Received: pp={self.pp}")
        elif self.pp != 1 or self.microbatches != 1 or self.schedule != "gpipe":
            raise UserError("--pp, --microbatches and --schedule are for parallel 'pp'. "
                            f"Received: parallel={self.parallel!r}")

    @property
    def replicas(self) -> int:
        """Data-parallel replicas: the global batch is split this many ways (the devices
        that are not tensor- or pipeline-parallel peers of one another)."""
        return self.workers * self.devices_per_worker // (self.tp * self.pp)

    def dims(self) -> ParallelDims:
        """The run's parallel layout (ParallelDims), one value for every reader."""
        return ParallelDims(dp=self.replicas, tp=self.tp, pp=self.pp,
                            zero=ZERO_STAGE.get(self.parallel), sp=self.sequence_parallel,
                            microbatches=self.microbatches, grad_accum=self.grad_accum,
                            ps=self.ps)

    @property
    def label(self) -> str:
        """Short human name, e.g. 'torch compiled', 'torch dp x2', 'jax fsdp 1x8',
        'keras-torch eager'."""
        # 'keras-jax', not 'keras[jax]': labels go through rich markup, where [jax] is a tag.
        parts = [f"keras-{self.keras_backend}" if self.framework == "keras"
                 else self.framework]
        if self.mode != "eager" or self.parallel == "single":
            parts.append(self.mode)
        if self.parallel != "single":
            size = (f"x{self.workers}" if self.devices_per_worker == 1
                    else f"{self.workers}x{self.devices_per_worker}")
            parts.append(f"{self.parallel} {size}")
        if self.ps:
            parts.append(f"ps{self.ps}")
        if self.tp > 1 or self.pp > 1:
            if self.replicas > 1:
                parts.append(f"dp{self.replicas}")
            if self.pp > 1:
                parts.append(f"m{self.microbatches} {self.schedule}")
        if self.sequence_parallel:
            parts.append("sp")
        if self.precision != "fp32":
            parts.append(self.precision)
        if self.grad_accum > 1:
            parts.append(f"accum{self.grad_accum}")
        if self.compress != "none":
            parts.append(f"compress={self.compress}")
        if self.activation_checkpointing:
            parts.append("act-ckpt")
        return " ".join(parts)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def to_flags(self) -> list[str]:
        """The command-line flags that rebuild this strategy (sextant.core.fields.to_flags):
        `sextant join` and the Slurm batch script take these; tests/test_strategy_flags.py
        parses them back."""
        return to_flags(self)

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> Strategy:
        # Records stored before the device axis existed ran on CPUs.
        return cls(**{"device": "cpu", **raw})
