"""How a workload is run: framework, execution mode, parallelism, workers, precision.

Framework, execution mode and parallel strategy are separate axes; each backend declares
which values it supports (`Capabilities`), and asking for anything else is a UserError that
names what is supported, never a silent fallback.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from sextant.errors import UserError

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
PRECISIONS = ("fp32", "tf32", "bf16", "fp16")
MIXED_PRECISIONS = ("bf16", "fp16")
DEVICES = ("cpu", "gpu")
"""Where a run's ranks compute: 'cpu' cores, or one 'gpu' per rank (placed by local rank)."""
# Gradient-communication compression: cast to 16 bits before the all-reduce, or PowerSGD
# (low-rank, with error feedback).
COMPRESSIONS = ("none", "bf16", "fp16", "powersgd")


def flag_of(field_name: str) -> str:
    """The command-line flag of a Strategy field: `grad_accum` -> `--grad-accum`."""
    return "--" + field_name.replace("_", "-")


@dataclass(kw_only=True, slots=True, frozen=True)
class Strategy:
    framework: str
    """Which framework trains the workload."""
    mode: str = "eager"
    """'eager' or 'compiled' (torch.compile, jax.jit, tf.function(jit_compile=True))."""
    parallel: str = "single"
    """'single' (one process) or 'dp' (data parallel, gradients all-reduced)."""
    workers: int = 1
    """Worker processes."""
    precision: str = "fp32"
    """Numerical precision (PRECISIONS): what the framework is asked for; each run records
    the precision it actually used."""
    device: str = "cpu"
    """'cpu', or 'gpu': one GPU per primary rank, the host's visible device at its local rank
    (the CLI's --device auto picks 'gpu' where the host has GPUs)."""
    grad_accum: int = 1
    """Micro-batches per optimizer step; gradients are communicated once per step. The global
    batch is unchanged, so the losses must equal the grad_accum=1 run."""
    compress: str = "none"
    """Gradient-communication compression (data-parallel strategies only)."""
    activation_checkpointing: bool = False
    """Recompute each transformer block's activations in the backward pass instead of keeping
    them (less activation memory, about one more forward per step; numerics unchanged)."""
    checkpoint_every: int = 0
    """Save a checkpoint after every K steps (0: never)."""
    checkpoint_dir: str | None = None
    """Where checkpoints go (required with checkpoint_every or resume)."""
    resume: bool = False
    """Continue from the newest valid checkpoint in checkpoint_dir."""
    trust_checkpoint: bool = False
    """Load checkpoints not signed with this user's key (sextant.checkpoint's trust model)."""
    devices_per_worker: int = 1
    """Devices inside each worker process (jax: host devices of one CPU process;
    tensorflow: logical CPU devices under MirroredStrategy)."""
    ps: int = 0
    """Parameter-server processes (parallel 'ps' only)."""
    threads: int | None = None
    """Intra-op threads per worker; default: the machine's cores divided by the workers."""
    tp: int = 1
    """Tensor-parallel degree (parallel 'tp' / 'tp-manual'): devices that split each layer."""
    pp: int = 1
    """Pipeline stages (parallel 'pp')."""
    microbatches: int = 1
    """Micro-batches each batch is cut into for the pipeline (parallel 'pp')."""
    schedule: str = "gpipe"
    """Pipeline schedule (parallel 'pp'): 'gpipe' (all forwards, then all backwards) or
    '1f1b' (one forward, one backward, interleaved once the pipeline is full)."""
    sequence_parallel: bool = False
    """With tensor parallelism: norms and residuals split along the sequence between the
    tensor-parallel regions (all-gather / reduce-scatter instead of all-reduce)."""
    keras_backend: str = "jax"
    """Framework 'keras' only: the backend Keras 3 runs on (KERAS_BACKEND in the worker):
    'jax' (the default: the only one with keras.distribution on Keras 3.15, and Keras'
    fastest here, docs/keras.md), 'torch' or 'tensorflow'."""

    def __post_init__(self) -> None:
        if self.framework not in FRAMEWORKS:
            raise UserError(
                f"unknown framework {self.framework!r}; allowed: {', '.join(FRAMEWORKS)}"
            )
        if self.mode not in MODES:
            raise UserError(f"unknown mode {self.mode!r}; allowed: {', '.join(MODES)}")
        if self.parallel not in PARALLEL:
            raise UserError(
                f"unknown parallel strategy {self.parallel!r}; allowed: {', '.join(PARALLEL)}"
            )
        if isinstance(self.workers, bool) or not isinstance(self.workers, int) or self.workers < 1:
            raise UserError(f"workers must be an integer >= 1. Received: {self.workers!r}")
        for name in ("devices_per_worker", "ps"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise UserError(f"{name} must be an integer >= 0. Received: {value!r}")
        if self.devices_per_worker < 1:
            raise UserError(
                f"devices_per_worker must be >= 1. Received: {self.devices_per_worker}"
            )
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
        if self.precision not in PRECISIONS:
            raise UserError(
                f"unknown precision {self.precision!r}; allowed: {', '.join(PRECISIONS)}"
            )
        if self.device not in DEVICES:
            raise UserError(f"unknown device {self.device!r}; allowed: {', '.join(DEVICES)}")
        if self.device == "gpu" and self.devices_per_worker != 1:
            raise UserError("on GPUs each worker process drives one GPU: devices_per_worker "
                            f"must be 1. Received: {self.devices_per_worker}; use --workers "
                            f"{self.workers * self.devices_per_worker}")
        if isinstance(self.grad_accum, bool) or not isinstance(self.grad_accum, int) \
                or self.grad_accum < 1:
            raise UserError(f"grad_accum must be an integer >= 1. Received: {self.grad_accum!r}")
        if self.compress not in COMPRESSIONS:
            raise UserError(
                f"unknown compression {self.compress!r}; allowed: {', '.join(COMPRESSIONS)}"
            )
        if self.compress != "none" and self.parallel in ("single", "ps"):
            raise UserError(
                f"--compress applies to gradient all-reduces; parallel {self.parallel!r} has none"
            )
        if not isinstance(self.activation_checkpointing, bool):
            raise UserError("activation_checkpointing must be true or false. "
                            f"Received: {self.activation_checkpointing!r}")
        if isinstance(self.checkpoint_every, bool) or not isinstance(self.checkpoint_every, int) \
                or self.checkpoint_every < 0:
            raise UserError(
                f"checkpoint_every must be an integer >= 0. Received: {self.checkpoint_every!r}"
            )
        if not isinstance(self.trust_checkpoint, bool):
            raise UserError(
                f"trust_checkpoint must be true or false. Received: {self.trust_checkpoint!r}"
            )
        if self.trust_checkpoint and not self.resume:
            raise UserError("--trust-checkpoint applies to the checkpoints a --resume loads; "
                            "give --resume too")
        if (self.checkpoint_every or self.resume) and not self.checkpoint_dir:
            raise UserError("--checkpoint-every and --resume need --checkpoint-dir")
        self._check_model_parallel()
        if self.keras_backend not in KERAS_BACKENDS:
            raise UserError(f"unknown keras backend {self.keras_backend!r}; allowed: "
                            f"{', '.join(KERAS_BACKENDS)}")
        if self.framework != "keras" and self.keras_backend != "jax":
            raise UserError("--keras-backend is for framework 'keras'. "
                            f"Received: framework={self.framework!r}, "
                            f"keras_backend={self.keras_backend!r}")
        if self.threads is not None and (
            isinstance(self.threads, bool) or not isinstance(self.threads, int) or self.threads < 1
        ):
            raise UserError(f"threads must be an integer >= 1. Received: {self.threads!r}")

    def _check_model_parallel(self) -> None:
        for name in ("tp", "pp", "microbatches"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise UserError(f"{name} must be an integer >= 1. Received: {value!r}")
        devices = self.workers * self.devices_per_worker
        if self.parallel in TENSOR_PARALLEL:
            if self.tp < 2 or devices % self.tp:
                raise UserError(
                    f"parallel {self.parallel!r} needs --tp N >= 2 dividing the {devices} "
                    f"devices (the rest is data parallel). Received: tp={self.tp}")
        elif self.tp != 1 or self.sequence_parallel:
            raise UserError("--tp and --sequence-parallel are for parallel 'tp' or 'tp-manual'. "
                            f"Received: parallel={self.parallel!r}")
        if not isinstance(self.sequence_parallel, bool):
            raise UserError("sequence_parallel must be true or false. "
                            f"Received: {self.sequence_parallel!r}")
        if self.parallel == "pp":
            if self.pp < 2 or devices % self.pp:
                raise UserError(
                    f"parallel 'pp' needs --pp N >= 2 dividing the {devices} devices (the "
                    f"rest is data parallel). Received: pp={self.pp}")
            if self.schedule not in PIPELINE_SCHEDULES:
                raise UserError(f"unknown pipeline schedule {self.schedule!r}; allowed: "
                                f"{', '.join(PIPELINE_SCHEDULES)}")
        elif self.pp != 1 or self.microbatches != 1 or self.schedule != "gpipe":
            raise UserError("--pp, --microbatches and --schedule are for parallel 'pp'. "
                            f"Received: parallel={self.parallel!r}")

    @property
    def replicas(self) -> int:
        """Data-parallel replicas: the global batch is split this many ways (the devices
        that are not tensor- or pipeline-parallel peers of one another)."""
        return self.workers * self.devices_per_worker // (self.tp * self.pp)

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
        """The command-line flags that rebuild this strategy, every field spelled out (so the
        result does not depend on the CLI's defaults): `--field-name VALUE`, a true boolean
        as its bare flag, a false one and a None value left out. `sextant join` and the
        Slurm batch script take these; tests/test_strategy_flags.py parses them back."""
        flags: list[str] = []
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if value is None or value is False:
                continue
            flags += [flag_of(f.name)] if value is True else [flag_of(f.name), str(value)]
        return flags

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> Strategy:
        # Records stored before the device axis existed ran on CPUs.
        return cls(**{"device": "cpu", **raw})
