"""The framework-neutral timed training loop every backend drives.

A backend supplies four small functions; the loop owns the clock, so every framework's step
time means the same thing:

    fetch(i)      -> this rank's shard of global batch i, as framework tensors (timed as
                     "data wait")
    step(batch)   -> run one optimizer step, return a framework handle holding the step's
                     loss and global gradient norm (no host transfer)
    block(h)      -> wait until the step's work is finished (device sync; no-op on eager CPU)
    to_floats(hs) -> turn a list of handles into (loss, grad_norm) float pairs (the only host
                     transfer, done every `log_every` steps, outside the timed region)

The gradient norm is recorded beside the loss because Adam is invariant to the scale of the
gradient: a data-parallel bug that sums instead of averaging barely moves the loss curve, but
doubles the gradient norm.

Step time = fetch + step + block. The global batches themselves (sextant.data's numpy
windows of the bundled corpus: the same code for every framework, part of none) are made
between steps, a few at a time (`data.prepare`, outside the clock), the way an expert's
benchmark loop has its batches ready in host memory; "data wait" is what the step waits for
its batch to become the framework's tensors (a host-to-device copy on an accelerator). The
first `measure.warmup_steps` steps are excluded from the steady-state statistics; the first
step is reported apart (it includes compilation).

For data-parallel runs, `step_nosync` runs the same step with gradient synchronisation
disabled. After training, steps with and without sync alternate (`measure.nosync_steps`
pairs) and the median pairwise difference is the exposed communication time.
"""

from __future__ import annotations

import math
import os
import signal
import time
from collections.abc import Callable
from typing import Any

from sextant import data
from sextant.core.errors import TrainingDiverged
from sextant.core.fsutil import atomic_write_json
from sextant.measure import memory

from sextant.contracts import WorkerContext


def timed_training(
    ctx: WorkerContext,
    *,
    fetch: Callable[[int], Any],
    step: Callable[[Any], Any],
    block: Callable[[Any], None],
    to_floats: Callable[[list[Any]], list[tuple[float, float]]],
    step_nosync: Callable[[Any], Any] | None = None,
    start_step: int = 0,
    rows_of: Callable[[Any], int | None] | None = None,
    checkpoint: Callable[[int], None] | None = None,
    on_trained: Callable[[], None] | None = None,
) -> dict[str, Any]:
    """Train steps [start_step, workload.steps); see the module docstring.

    `checkpoint(k)` is called after step k when k is a multiple of `checkpoint_every`
    (outside the timed region; its duration is recorded apart)."""
    workload = ctx.workload
    steps = workload.steps
    log_every = workload.measure.log_every
    every = ctx.strategy.checkpoint_every if checkpoint is not None else 0
    faults = Faults(ctx)
    step_times: list[float] = []
    data_times: list[float] = []
    rows: list[int | None] = []
    losses: list[float] = []
    grad_norms: list[float] = []
    checkpoint_times: list[float] = []
    pending: list[Any] = []

    def flush() -> None:
        if not pending:
            return
        checked = len(losses)
        for loss_value, grad_norm in to_floats(pending):
            losses.append(loss_value)
            grad_norms.append(grad_norm)
        pending.clear()
        # Checked where the values reach the host anyway: no extra sync in the step.
        check_finite(ctx, losses, grad_norms, start_step, checked)

    memory.reset_peak()
    rss_start = memory.current_rss()
    ctx.emit("start", steps=steps, start_step=start_step)
    startup = {"loop_start_time": time.time()}
    for i in range(start_step, steps):
        data.prepare_ahead(workload, i)  # the next few global batches, before the clock
        t0 = time.perf_counter()
        batch = fetch(i)
        faults.loader()
        t1 = time.perf_counter()
        loss = step(batch)
        block(loss)
        faults.straggle()
        t2 = time.perf_counter()
        step_times.append(t2 - t0)
        data_times.append(t1 - t0)
        startup.setdefault("first_step_end_time", time.time())
        rows.append((rows_of or _rows)(batch))
        pending.append(loss)
        faults.maybe_die(i + 1)
        # One event per step and rank (a JSON line, ~20 us, after the step's clock stopped);
        # the loss is read back from the framework only every `log_every` steps.
        if (i + 1) % log_every == 0 or i + 1 == steps:
            flush()
            loss_now: float | None = losses[-1]
        else:
            loss_now = None
        ctx.emit("step", step=i + 1, loss=loss_now, step_time_s=step_times[-1],
                 data_time_s=data_times[-1], rows=rows[-1], rss_bytes=memory.current_rss())
        if every and checkpoint is not None and (i + 1) % every == 0:
            flush()
            tc = time.perf_counter()
            checkpoint(i + 1)
            checkpoint_times.append(time.perf_counter() - tc)
            ctx.emit("checkpoint", step=i + 1, seconds=checkpoint_times[-1])
    peak_train = memory.peak_rss()
    if on_trained is not None:
        on_trained()  # e.g. export the final parameters before the timing-only pairs

    sync_times: list[float] = []
    nosync_times: list[float] = []
    if step_nosync is not None and workload.measure.nosync_steps:
        ctx.emit("phase", name="exposed-communication")
        # One untimed pair first: the no-sync variant may compile on its first call.
        block(step(fetch(steps)))
        block(step_nosync(fetch(steps)))
        for j in range(1, workload.measure.nosync_steps + 1):
            for fn, bucket in ((step, sync_times), (step_nosync, nosync_times)):
                batch = fetch(steps + j)
                t0 = time.perf_counter()
                block(fn(batch))
                bucket.append(time.perf_counter() - t0)
    ctx.emit("done")
    return {
        "step_times_s": step_times,
        "data_times_s": data_times,
        "losses": losses,
        "grad_norms": grad_norms,
        "start_step": start_step,
        "rows_per_step": rows,
        "checkpoint_times_s": checkpoint_times,
        "warmup_steps": workload.measure.warmup_steps,
        "peak_rss_bytes": peak_train,
        "rss_start_bytes": rss_start,
        "sync_step_times_s": sync_times,
        "nosync_step_times_s": nosync_times,
        "startup": startup,
    }


class StepRecorder:
    """The timed loop's bookkeeping for a framework that runs the training loop itself
    (Keras `fit`): the framework's per-batch hooks tell it when training starts and when each
    step has ended, with the step's loss and gradient norm already on the host; it keeps the
    same lists, events, divergence checks, fault hooks and checkpoint calls as
    `timed_training`, so the result means the same thing.

    Step time is from the end of the previous step (for the first, from `begin`) to the end
    of this one: everything the framework's loop does per step (fetching the batch, its own
    bookkeeping, the step, the read-back of the logs). `data_time(i, s)` records how long
    fetching batch i took where the framework calls the fetch in the step's path."""

    def __init__(self, ctx: WorkerContext, *, start_step: int = 0,
                 checkpoint: Callable[[int], None] | None = None,
                 on_trained: Callable[[], None] | None = None) -> None:
        self.ctx = ctx
        self.start_step = start_step
        self.checkpoint = checkpoint
        self.on_trained = on_trained
        self.every = ctx.strategy.checkpoint_every if checkpoint is not None else 0
        self.faults = Faults(ctx)
        self.step_times: list[float] = []
        self.data_times: dict[int, float] = {}
        self.rows: list[int | None] = []
        self.losses: list[float] = []
        self.grad_norms: list[float] = []
        self.checkpoint_times: list[float] = []
        self.rss_start: int | None = None
        self.last = 0.0
        self.startup: dict[str, float] = {}

    def begin(self) -> None:
        memory.reset_peak()
        self.rss_start = memory.current_rss()
        self.ctx.emit("start", steps=self.ctx.workload.steps, start_step=self.start_step)
        self.startup = {"loop_start_time": time.time()}
        data.prepare_ahead(self.ctx.workload, self.start_step)  # outside the step times
        self.last = time.perf_counter()

    def data_time(self, step: int, seconds: float) -> None:
        self.faults.loader()
        self.data_times[step] = seconds + self.faults.loader_s

    def step_end(self, step: int, loss: float, grad_norm: float, rows: int | None) -> None:
        """Step `step` (0-based, global) has finished with these values."""
        self.faults.straggle()
        now = time.perf_counter()
        self.startup.setdefault("first_step_end_time", time.time())
        self.step_times.append(now - self.last)
        self.rows.append(rows)
        self.losses.append(float(loss))
        self.grad_norms.append(float(grad_norm))
        check_finite(self.ctx, self.losses, self.grad_norms, self.start_step,
                     len(self.losses) - 1)
        self.faults.maybe_die(step + 1)
        log_every = self.ctx.workload.measure.log_every
        shown = (step + 1) % log_every == 0 or step + 1 == self.ctx.workload.steps
        self.ctx.emit("step", step=step + 1, loss=self.losses[-1] if shown else None,
                      step_time_s=self.step_times[-1],
                      data_time_s=self.data_times.get(step, 0.0), rows=rows,
                      rss_bytes=memory.current_rss())
        if self.every and self.checkpoint is not None and (step + 1) % self.every == 0:
            tc = time.perf_counter()
            self.checkpoint(step + 1)
            self.checkpoint_times.append(time.perf_counter() - tc)
            self.ctx.emit("checkpoint", step=step + 1, seconds=self.checkpoint_times[-1])
        data.prepare_ahead(self.ctx.workload, step + 1)
        self.last = time.perf_counter()  # the checkpoint stays outside the next step

    def result(self) -> dict[str, Any]:
        """Once training has ended: export (on_trained) and the loop's result dict."""
        peak_train = memory.peak_rss()
        if self.on_trained is not None:
            self.on_trained()
        self.ctx.emit("done")
        steps = range(self.start_step, self.start_step + len(self.step_times))
        return {
            "step_times_s": self.step_times,
            "data_times_s": [self.data_times.get(i, 0.0) for i in steps],
            "losses": self.losses,
            "grad_norms": self.grad_norms,
            "start_step": self.start_step,
            "rows_per_step": self.rows,
            "checkpoint_times_s": self.checkpoint_times,
            "warmup_steps": self.ctx.workload.measure.warmup_steps,
            "peak_rss_bytes": peak_train,
            "rss_start_bytes": self.rss_start,
            "sync_step_times_s": [],
            "nosync_step_times_s": [],
            "startup": self.startup,
        }


def check_finite(ctx: WorkerContext, losses: list[float], grad_norms: list[float], start_step: int,
                 checked: int = 0) -> None:
    """Stop a diverged run: the first non-finite loss or gradient norm raises
    TrainingDiverged naming the step, rank and value, after writing
    `rank{r}.diverged.json` (the runner stores the run as 'diverged' from it). The first
    `checked` values were checked before."""
    for i in range(checked, len(losses)):
        loss, norm = losses[i], grad_norms[i]
        if math.isfinite(loss) and math.isfinite(norm):
            continue
        step = start_step + i + 1
        what = f"loss = {loss}" if not math.isfinite(loss) else f"gradient norm = {norm}"
        atomic_write_json(ctx.run_dir / f"rank{ctx.rank}.diverged.json", {
            "step": step, "rank": ctx.rank, "what": what,
            "losses": [finite_or_none(x) for x in losses],
            "grad_norms": [finite_or_none(x) for x in grad_norms],
        })
        raise TrainingDiverged(f"training diverged at step {step} on rank {ctx.rank}: {what} "
                               "(lower optimizer.lr, check the data)")


def finite_or_none(x: float) -> float | None:
    return float(x) if math.isfinite(x) else None


def _rows(batch: Any) -> int | None:
    """Samples in this rank's batch, when the batch is an (inputs, targets) pair."""
    try:
        return int(len(batch[0]))
    except (TypeError, IndexError, KeyError):
        return None


class Faults:
    """Test hooks (SEXTANT_TEST_FAULT, comma-separated) that make a worker misbehave on
    purpose, so the tests can prove each check fails when it should:

    kill-rank-R[-at-S]   rank R SIGKILLs itself after step S (default 2), like the OOM killer
    slow-rank-R[-MS]     rank R sleeps MS ms (default 50) in every step: a straggler
    slow-loader[-MS]     every rank's batch takes MS ms (default 30) longer: a slow loader
    Handled elsewhere: sum-gradients (torch DDP), shape-change (jax), skew-rank-R (data),
    fingerprint-rank-R (worker).
    """

    def __init__(self, ctx: WorkerContext) -> None:
        self.rank = ctx.rank
        self.kill_at: int | None = None
        self.straggle_s = 0.0
        self.loader_s = 0.0
        for fault in (ctx.fault or "").split(","):
            parts = fault.strip().split("-")
            if fault.startswith("kill-rank-") and int(parts[2]) == ctx.rank:
                self.kill_at = int(parts[4]) if len(parts) > 4 else 2
            elif fault.startswith("slow-rank-") and int(parts[2]) == ctx.rank:
                self.straggle_s = (int(parts[3]) if len(parts) > 3 else 50) / 1e3
            elif fault.startswith("slow-loader"):
                self.loader_s = (int(parts[2]) if len(parts) > 2 else 30) / 1e3

    def maybe_die(self, step: int) -> None:
        if self.kill_at == step:
            os.kill(os.getpid(), signal.SIGKILL)

    def straggle(self) -> None:
        if self.straggle_s:
            time.sleep(self.straggle_s)

    def loader(self) -> None:
        if self.loader_s:
            time.sleep(self.loader_s)
