"""The backend contract and the registry.

A backend module must not import its framework at module level: `capabilities()` is called in
the parent process (which never imports a framework) to validate a strategy before any worker
starts; `run()` is called inside the worker process.

A backend class inherits `BackendBase` (the defaults of the optional parts of the protocol:
no extra checks, one worker process per worker) and satisfies `Backend`. The contracts it
receives and returns are typed in `sextant.contracts`.
"""

from __future__ import annotations

import importlib
import importlib.util
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from sextant.core.errors import UserError

if TYPE_CHECKING:
    from sextant.contracts import RankResult, WorkerContext
    from sextant.strategy import Strategy
    from sextant.workloads.spec import Workload


@dataclass(kw_only=True, slots=True, frozen=True)
class ExportFormat:
    """One deployment artifact a backend builds with its framework's own exporter
    (`<backend package>.export.EXPORTERS[name]`), served in a fresh process by `runtime`
    (sextant.deploy.runtimes)."""

    name: str
    """The format's name within its framework ('onnx', 'savedmodel', ...)."""
    runtime: str
    """The serving runtime that loads it: 'torch', 'aoti', 'executorch', 'onnxruntime',
    'tensorflow', 'litert' or 'jax'."""
    needs: tuple[str, ...]
    """Import names the export and the serving need, checked without importing them."""
    install: str
    """What installs what `needs` names (the unavailable row's hint)."""
    targets: tuple[str, ...]
    """Where the format is deployed ('server', 'mobile', 'edge', 'browser'), as its
    framework documents it; measured here is its runtime on this machine's CPU."""
    quantized: bool = False
    """Weights stored in fewer bits: judged by its held-out loss change, never a match."""
    compiler: bool = False
    """Needs the host's C++ compiler at export time (AOTInductor)."""


DEPLOY_INSTALL = "pip install 'sextant[deploy]'"
"""The extra that installs the exporters and serving runtimes beside the frameworks."""


@dataclass(kw_only=True, slots=True, frozen=True)
class Capabilities:
    modes: tuple[str, ...]
    """Execution modes; the first is the default."""
    parallel: tuple[str, ...]
    precisions: tuple[str, ...]
    devices: tuple[str, ...] = ("cpu",)
    """Where sextant runs it: 'cpu', and 'gpu' where its precision switches, placement,
    NCCL collectives and device memory are wired."""
    compress: tuple[str, ...] = ("none",)
    grad_accum: bool = False
    activation_checkpointing: bool = False
    """Recomputes each transformer block in backward (Strategy.activation_checkpointing)."""
    checkpoint: tuple[str, ...] = ()
    """Parallel strategies whose runs can be checkpointed and resumed."""
    model_features: tuple[str, ...] = ("qkv_bias", "tied_gpt_head")
    """The optional model parts (sextant.workloads.spec.model_features) its model code has."""
    why_not: tuple[tuple[str, str], ...] = ()
    """(parallel strategy, reason) for strategies this backend does not run, where the
    reason is worth knowing (what the framework offers instead); shown by `sextant
    capabilities` and in the refusal."""
    exports: tuple[ExportFormat, ...] = ()
    """The deployment artifacts its framework's exporters build (`sextant compare deploy`)."""


@dataclass(kw_only=True, slots=True, frozen=True)
class ProcessLayout:
    """The processes of one run. Primary ranks train and report measurements; the run ends
    when they all exit cleanly. Service ranks (e.g. parameter servers) serve until then and
    are stopped by the launcher; one that exits early fails the run."""

    roles: tuple[str, ...]
    """Role of each rank, e.g. ('worker', 'worker') or ('chief', 'ps', 'worker', 'worker')."""
    primary: tuple[int, ...]

    @classmethod
    def workers(cls, n: int) -> ProcessLayout:
        return cls(roles=("worker",) * n, primary=tuple(range(n)))


def layout_of(strategy: Strategy) -> ProcessLayout:
    """The processes a run of `strategy` needs, from its framework's backend (the
    launchers' entry point)."""
    return get_backend(strategy.framework).process_layout(strategy)


@runtime_checkable
class Backend(Protocol):
    name: str
    """Framework name in the strategy vocabulary: 'torch', 'jax', 'tensorflow'."""
    package: str
    """Import name whose presence means the framework is installed."""
    extra: str
    """pip extra that installs it: pip install 'sextant[<extra>]'."""
    OPT_IN: str | None
    """Why `sextant compare` runs it only when named (BackendBase: None, run by default)."""
    ENVIRONMENT: str | None
    """The sextant environment (sextant.core.envs) whose interpreter runs its workers, for a
    framework that cannot share this one's (BackendBase: None, this interpreter)."""

    def capabilities(self) -> Capabilities: ...

    def compare_matrix(self, workers: int) -> list[dict[str, Any]]:
        """Strategy fields (mode, parallel, workers) that `sextant compare` runs by default."""
        ...

    def check(self, strategy: Strategy) -> None:
        """Refuse (UserError, one line naming what works) a combination the flat capability
        lists cannot express. Called in the parent process, after the capability checks."""
        ...

    def process_layout(self, strategy: Strategy) -> ProcessLayout:
        """The processes a run of this strategy needs (default: `workers` identical ones)."""
        ...

    def run(self, ctx: WorkerContext) -> RankResult:
        """Train the plan in this worker process; return this rank's raw measurements."""
        ...

    def generated_config(self, workload: Workload, strategy: Strategy) -> dict[str, Any] | None:
        """The framework configuration sextant generates for a run (`sextant run
        --print-config`), or None where the backend writes none."""
        ...

    def strategy_code(self, parallel: str) -> tuple[str, ...]:
        """The "module:qualname" functions and classes that implement a parallel strategy
        (sextant.backends.code_size counts their lines; empty: nothing strategy-specific)."""
        ...


class BackendBase:
    """Defaults for the optional parts of the `Backend` protocol; every backend inherits it."""

    def check(self, strategy: Strategy) -> None:
        """No combination beyond the capability lists is refused."""

    def process_layout(self, strategy: Strategy) -> ProcessLayout:
        return ProcessLayout.workers(strategy.workers)

    def generated_config(self, workload: Workload, strategy: Strategy) -> dict[str, Any] | None:
        """No generated configuration: the backend's code is the whole set-up."""
        return None

    OPT_IN: str | None = None
    """Why `sextant compare` leaves this framework out unless --frameworks names it (None:
    its compare_matrix rows run by default when it is installed)."""

    ENVIRONMENT: str | None = None
    """The environment of `sextant env create` its workers run in (None: this interpreter;
    `package` is then looked up here)."""

    STRATEGY_CODE: dict[str, tuple[str, ...]] = {}
    """parallel strategy -> the "module:qualname" functions and classes that implement it
    (sextant.backends.code_size counts their lines)."""

    def strategy_code(self, parallel: str) -> tuple[str, ...]:
        return self.STRATEGY_CODE.get(parallel, ())


# name -> "module:Class"; the module is imported on first use.
REGISTRY: dict[str, str] = {
    "torch": "sextant.backends.torch_backend:TorchBackend",
    "jax": "sextant.backends.jax_backend:JaxBackend",
    "tensorflow": "sextant.backends.tf_backend:TensorFlowBackend",
    "deepspeed": "sextant.backends.deepspeed_backend:DeepSpeedBackend",
    "mlx": "sextant.backends.mlx_backend:MlxBackend",
    "keras": "sextant.backends.keras_backend:KerasBackend",
    "paddle": "sextant.backends.paddle_backend:PaddleBackend",
    "mindspore": "sextant.backends.mindspore_backend:MindSporeBackend",
}


def get_backend(name: str) -> Backend:
    if name not in REGISTRY:
        raise UserError(f"no backend for framework {name!r}; available: {', '.join(REGISTRY)}")
    module_name, cls_name = REGISTRY[name].split(":")
    return getattr(importlib.import_module(module_name), cls_name)()


def not_installed(backend: Backend) -> str:
    """The one line saying a framework is missing and the command that installs it."""
    how = (f"sextant env create {backend.ENVIRONMENT}" if backend.ENVIRONMENT is not None
           else f"pip install 'sextant[{backend.extra}]'")
    return f"{backend.name}: not installed ({how})"


def available(name: str) -> bool:
    """Whether the framework is installed (here, or as its finished environment), checked
    without importing it."""
    backend = get_backend(name)
    if backend.ENVIRONMENT is not None:
        from sextant.core import envs

        try:
            return envs.load(backend.ENVIRONMENT) is not None
        except UserError:
            return False
    return importlib.util.find_spec(backend.package) is not None


def _supporting(flag: str) -> list[str]:
    """Registered backends whose capabilities set a boolean lever (no framework imported)."""
    return [name for name in REGISTRY if getattr(get_backend(name).capabilities(), flag)]


def python_for(framework: str) -> str:
    """The interpreter that runs `framework`'s workers: this one, or that of the environment
    its backend declares (sextant.core.envs checks that it exists and is current)."""
    from sextant.core import envs

    return envs.python_for(framework, get_backend(framework).ENVIRONMENT)


def require(strategy: Strategy) -> Backend:
    """The backend for a strategy, after checking it is installed and supports the strategy."""
    backend = get_backend(strategy.framework)
    if backend.ENVIRONMENT is not None:
        from sextant.core import envs

        envs.python_for(backend.name, backend.ENVIRONMENT)  # a broken one names its fix
    elif importlib.util.find_spec(backend.package) is None:
        raise UserError(not_installed(backend))
    caps = backend.capabilities()
    for axis, value, allowed in (
        ("device", strategy.device, caps.devices),
        ("mode", strategy.mode, caps.modes),
        ("parallel", strategy.parallel, caps.parallel),
        ("precision", strategy.precision, caps.precisions),
    ):
        if value not in allowed:
            reason = dict(caps.why_not).get(value) if axis == "parallel" else None
            raise UserError(
                f"{backend.name} does not support {axis} {value!r}"
                + (f" ({reason})" if reason else "") + f"; supported: {', '.join(allowed)}"
            )
    if strategy.compress not in caps.compress:
        raise UserError(
            f"{backend.name} does not support compression {strategy.compress!r}; "
            f"supported: {', '.join(caps.compress)}"
        )
    if strategy.grad_accum > 1 and not caps.grad_accum:
        raise UserError(f"{backend.name} does not support gradient accumulation yet")
    if strategy.activation_checkpointing and not caps.activation_checkpointing:
        raise UserError(f"{backend.name} does not support --activation-checkpointing; "
                        f"supported by: {', '.join(_supporting('activation_checkpointing'))}")
    if (strategy.checkpoint_every or strategy.resume) and strategy.parallel not in caps.checkpoint:
        raise UserError(
            f"{backend.name} cannot checkpoint parallel {strategy.parallel!r}; "
            f"checkpointing works with: {', '.join(caps.checkpoint) or 'nothing yet'}"
        )
    backend.check(strategy)  # combinations the flat capability lists cannot express
    return backend
