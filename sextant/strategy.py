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
PARALLEL = ("single", "dp")
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
        if self.parallel == "single" and self.workers != 1:
            raise UserError(
                f"parallel 'single' runs one worker. Received: workers={self.workers}; "
                "use --parallel dp for several"
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
    def label(self) -> str:
        """Short human name, e.g. 'torch compiled', 'torch dp x2'."""
        parts = [self.framework]
        if self.mode != "eager" or self.parallel == "single":
            parts.append(self.mode)
        if self.parallel != "single":
            parts.append(f"{self.parallel} x{self.workers}")
        return " ".join(parts)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> Strategy:
        return cls(**raw)
