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

FRAMEWORKS = ("torch", "jax", "tensorflow")
MODES = ("eager", "compiled")
# The parallel-strategy vocabulary shared by all backends (each supports a subset):
#   single     one process, one device
#   dp         data parallel; gradients all-reduced by the framework's own mechanism
#              (torch DDP, XLA-inserted collectives over a jax Mesh, tf MultiWorkerMirrored)
#   dp-manual  data parallel written by hand: per-device step with an explicit gradient
#              mean (jax shard_map + pmean), the style articles contrast with declarative dp
#   fsdp       parameters, gradients and optimizer state sharded across data-parallel ranks
#              (ZeRO-3 style)
#   ps         parameter servers hold the variables; workers push gradients asynchronously
PARALLEL = ("single", "dp", "dp-manual", "fsdp", "ps")
PRECISIONS = ("fp32",)


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
    devices_per_worker: int = 1
    """Devices inside each worker process (jax: host devices of one CPU process;
    tensorflow: logical CPU devices under MirroredStrategy)."""
    ps: int = 0
    """Parameter-server processes (parallel 'ps' only)."""
    threads: int | None = None
    """Intra-op threads per worker; default: the machine's cores divided by the workers."""

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
        if self.threads is not None and (
            isinstance(self.threads, bool) or not isinstance(self.threads, int) or self.threads < 1
        ):
            raise UserError(f"threads must be an integer >= 1. Received: {self.threads!r}")

    @property
    def replicas(self) -> int:
        """Data-parallel replicas: the global batch is split this many ways."""
        return self.workers * self.devices_per_worker

    @property
    def label(self) -> str:
        """Short human name, e.g. 'torch compiled', 'torch dp x2', 'jax fsdp 1x8'."""
        parts = [self.framework]
        if self.mode != "eager" or self.parallel == "single":
            parts.append(self.mode)
        if self.parallel != "single":
            size = (f"x{self.workers}" if self.devices_per_worker == 1
                    else f"{self.workers}x{self.devices_per_worker}")
            parts.append(f"{self.parallel} {size}")
        if self.ps:
            parts.append(f"ps{self.ps}")
        return " ".join(parts)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> Strategy:
        return cls(**raw)
