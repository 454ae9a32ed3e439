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

Step time = fetch + step + block. The first `measure.warmup_steps` steps are excluded from the
steady-state statistics; the first step is reported apart (it includes compilation).

For data-parallel runs, `step_nosync` runs the same step with gradient synchronisation
disabled. After training, steps with and without sync alternate (`measure.nosync_steps`
pairs) and the median pairwise difference is the exposed communication time.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable
from typing import Any

from sextant.measure import memory


def timed_training(
    ctx: Any,
    *,
    fetch: Callable[[int], Any],
    step: Callable[[Any], Any],
    block: Callable[[Any], None],
    to_floats: Callable[[list[Any]], list[tuple[float, float]]],
    step_nosync: Callable[[Any], Any] | None = None,
) -> dict[str, Any]:
    workload = ctx.workload
    steps = workload.steps
    log_every = workload.measure.log_every
    step_times: list[float] = []
    data_times: list[float] = []
    losses: list[float] = []
    grad_norms: list[float] = []
    pending: list[Any] = []

    memory.reset_peak()
    rss_start = memory.current_rss()
    ctx.emit("start", steps=steps)
    for i in range(steps):
        t0 = time.perf_counter()
        batch = fetch(i)
        t1 = time.perf_counter()
        loss = step(batch)
        block(loss)
        t2 = time.perf_counter()
        step_times.append(t2 - t0)
        data_times.append(t1 - t0)
        pending.append(loss)
        if i == 1 and ctx.fault == f"kill-rank-{ctx.rank}":
            # Test hook: this rank dies mid-training as if the OOM killer had struck.
            os.kill(os.getpid(), signal.SIGKILL)
        if (i + 1) % log_every == 0 or i + 1 == steps:
            for loss_value, grad_norm in to_floats(pending):
                losses.append(loss_value)
                grad_norms.append(grad_norm)
            pending.clear()
            ctx.emit("step", step=i + 1, loss=losses[-1], step_time_s=step_times[-1])
    peak_train = memory.peak_rss()

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
        "warmup_steps": workload.measure.warmup_steps,
        "peak_rss_bytes": peak_train,
        "rss_start_bytes": rss_start,
        "sync_step_times_s": sync_times,
        "nosync_step_times_s": nosync_times,
    }
