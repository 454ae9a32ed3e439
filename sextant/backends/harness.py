"""The framework-neutral training harness every backend's worker hands its pieces to.

A backend builds the model, applies its strategy and levers (one function each, in its
framework's order), and makes a step; it then hands the harness a `Trainer`: the four loop
functions of `sextant.measure.loop`, how to save and restore its state natively, how to export
the final parameters, and how to describe the run once trained. The harness owns everything
else, once for every backend:

    resume    find the newest valid sealed checkpoint (sextant.checkpoint), have the backend
              read it, and start the loop at its step; barrier
    train     the timed loop (sextant.measure.loop.timed_training), with sealed checkpoint
              saves every `checkpoint_every` steps (the backend's `save` writes, every rank,
              into the partial directory; rank 0 seals it)
    export    right after the last training step, before the exposed-communication pairs
              (which keep updating the parameters, for timing only): the final canonical
              parameters, written atomically to final_params.npz with their digest (rank 0)
    assemble  the RankResult: timings, the final digest, the communication figures (planned
              bytes from sextant.measure.comm, the measured payload where the backend counts
              one), then the backend's own memory accounting, details and fingerprint

So a new lever is one function per backend plus one capability entry, and a new backend is
`build` + strategy functions + `make_step` + one `Trainer`. A framework whose high-level API
owns the training loop (Keras `fit`) hands over `owned_loop` instead of the four loop
functions: it runs the loop and reports each step to a `StepRecorder`
(sextant.measure.loop), which keeps the timed loop's lists, events and checks.
"""

from __future__ import annotations

import io
import shutil
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sextant import checkpoint as ckpt
from sextant.backends import precision
from sextant.core.fsutil import atomic_write_bytes
from sextant.workloads.init import is_adapter, params_digest
from sextant.measure.comm import bytes_per_step
from sextant.measure.loop import StepRecorder, timed_training

if TYPE_CHECKING:
    import numpy as np

    from sextant.contracts import RankResult, WorkerContext


@dataclass(kw_only=True)
class Description:
    """What a backend says about its run once trained (after the loop and the export)."""

    memory: dict[str, Any]
    """Bytes this rank holds: params, grads (None where only the compiled step sees them),
    optimizer_state (the harness adds the parameter count)."""
    details: dict[str, Any]
    """How the step was built (optimizer, wrapping, collectives, probes); the harness adds
    the checkpoint notes."""
    fingerprint: dict[str, Any]
    """sextant.measure.env.fingerprint of the framework and device."""
    device_peak_bytes: int | None = None
    """Accelerator allocator peak during training, where the framework reports one."""
    precision: precision.Precision | None = None
    """The precision the backend set its framework to, read back from it; None for a
    framework sextant runs on CPU cores only (fp32 as asked: no TF32 there)."""


def _no_barrier() -> None:
    return None


@dataclass(kw_only=True)
class Trainer:
    """One rank's training as a backend built it: what the harness drives."""

    n_params: int
    """Parameters of the canonical model (not of this rank's shard)."""
    n_trainable: int | None = None
    """Of those, the ones the optimizer updates, counted from the framework's own objects
    (LoRA: the adapters); None: all of them."""
    fetch: Callable[[int], Any]
    step: Callable[[Any], Any]
    block: Callable[[Any], None]
    to_floats: Callable[[list[Any]], list[tuple[float, float]]]
    """The loop's four functions (sextant.measure.loop)."""
    final_params: Callable[[], dict[str, np.ndarray] | None]
    """The canonical parameters now; every rank calls it (it may gather), rank 0 gets the
    dict, the others may get None."""
    describe: Callable[[], Description]
    step_nosync: Callable[[Any], Any] | None = None
    """The same step without gradient communication (exposed-communication pairs)."""
    rows_of: Callable[[Any], int | None] | None = None
    save: Callable[[Path], None] | None = None
    """Write this rank's part of the state into a directory (the framework's native save)."""
    restore: Callable[[Path, int], None] | None = None
    """Read the state saved at a step from a sealed directory."""
    barrier: Callable[[], None] = _no_barrier
    """Wait for every rank (checkpoint saves and resume); a no-op in one process."""
    grad_payload_bytes: Callable[[], int] | None = None
    """Gradient bytes handed to the collectives so far, where the backend counts them (the
    measured side of the bytes-per-step figure)."""
    notes: list[str] = field(default_factory=list)
    owned_loop: Callable[[StepRecorder], None] | None = None
    """For a framework that runs the training loop itself (Keras `fit`): trains steps
    [recorder.start_step, workload.steps), calling the recorder's begin, data_time and
    step_end from its hooks. The harness then does not call fetch/step/block/to_floats (a
    backend with an owned loop passes `unused`) and there are no exposed-communication pairs."""


def unused(*args: Any) -> Any:
    """A loop function of a Trainer whose framework owns the loop (never called)."""
    raise RuntimeError("the framework owns this training loop")


def resume(ctx: WorkerContext, trainer: Trainer) -> int:
    """The step training starts from: the newest usable sealed checkpoint's (its state read
    by the backend), or 0. Every rank calls it; refusals and the outcome go to the notes."""
    if not ctx.strategy.resume:
        return 0
    if trainer.restore is None:
        raise RuntimeError(f"{ctx.strategy.framework}: --resume without a restore function")
    step, copy = ckpt.resume_point(ctx, trainer.notes)
    try:
        if copy is not None:
            trainer.restore(copy, step)  # the verified private copy, never the original
        trainer.barrier()
    finally:
        if copy is not None:
            shutil.rmtree(copy, ignore_errors=True)
    return step


def write_final_params(ctx: WorkerContext, final: dict[str, np.ndarray]) -> str:
    """final_params.npz in the run directory, written atomically; returns its digest."""
    import numpy as np

    buffer = io.BytesIO()
    np.savez(buffer, **final)  # type: ignore[arg-type]  # numpy stub: savez(file, *args)
    atomic_write_bytes(ctx.run_dir / "final_params.npz", buffer.getvalue())
    return params_digest(final)


def write_adapters(ctx: WorkerContext, final: dict[str, np.ndarray]) -> int:
    """LoRA's adapter checkpoint, adapters.npz (what a fine-tune ships beside its base
    model), written atomically; returns its size in bytes."""
    import numpy as np

    buffer = io.BytesIO()
    np.savez(buffer, **{k: v for k, v in final.items() if is_adapter(k)})  # type: ignore[arg-type]
    atomic_write_bytes(ctx.run_dir / "adapters.npz", buffer.getvalue())
    return len(buffer.getvalue())


def train(ctx: WorkerContext, trainer: Trainer) -> RankResult:
    """Resume, train, export, assemble (the module docstring); returns this rank's result."""
    strategy = ctx.strategy
    start_step = resume(ctx, trainer)
    exported: dict[str, Any] = {}

    def save(step: int) -> None:
        assert trainer.save is not None
        ckpt.save_sealed(ctx, step, trainer.save, trainer.barrier)

    def on_trained() -> None:
        if trainer.grad_payload_bytes is not None:  # the training steps' payload only
            exported["payload"] = trainer.grad_payload_bytes() / (ctx.workload.steps
                                                                  - start_step)
        final = trainer.final_params()
        if final is not None and ctx.rank == 0:
            exported["sha256"] = write_final_params(ctx, final)
            if ctx.workload.finetune.lora:
                exported["adapter_bytes"] = write_adapters(ctx, final)

    if strategy.checkpoint_every and trainer.save is None:
        raise RuntimeError(f"{strategy.framework}: checkpointing without a save function")
    if trainer.owned_loop is not None:
        recorder = StepRecorder(ctx, start_step=start_step, on_trained=on_trained,
                                checkpoint=save if strategy.checkpoint_every else None)
        trainer.owned_loop(recorder)
        timed = recorder.result()
    else:
        timed = timed_training(
            ctx, fetch=trainer.fetch, step=trainer.step, block=trainer.block,
            to_floats=trainer.to_floats, step_nosync=trainer.step_nosync,
            rows_of=trainer.rows_of, start_step=start_step,
            checkpoint=save if strategy.checkpoint_every else None, on_trained=on_trained,
        )
    described = trainer.describe()
    trained = trainer.n_params if trainer.n_trainable is None else trainer.n_trainable
    result: RankResult = {
        **timed,  # type: ignore[typeddict-item]  # the loop's keys, checked by the contract
        "final_params_sha256": exported.get("sha256"),  # rank 0 only
        "memory_accounting": {**described.memory, "parameters": trainer.n_params,
                              "trainable_parameters": trained},
        # Only the trained parameters' gradients are reduced (LoRA: the adapters').
        "comm": {"planned_bytes_per_step": bytes_per_step(strategy, trained),
                 "measured_grad_payload_bytes_per_step": exported.get("payload")},
        "details": {**described.details, "notes": trainer.notes,
                    **({"adapter_bytes": exported["adapter_bytes"]}
                       if "adapter_bytes" in exported else {})},
        # Every run records the precision it used: the backend's read-back, or, for a
        # framework sextant runs on CPU cores only, fp32 as asked (no TF32 there).
        "fingerprint": {**described.fingerprint,
                        "precision": (described.precision
                                      or precision.cpu_only(strategy.precision)).to_dict()},
    }
    if described.device_peak_bytes is not None:
        result["device_peak_bytes"] = described.device_peak_bytes
    return result
