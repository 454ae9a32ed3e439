"""The framework-neutral timed training loop every backend drives.

A backend supplies four small functions; the loop owns the clock, so every framework's step
time means the same thing:

    fetch(i)      -> this rank's shard of global batch i, as framework tensors (timed as
                     "data wait")
    step(batch)   -> run one optimizer step, return the loss as a framework handle
                     (no host transfer)
    block(loss)   -> wait until the step's work is finished (device sync; no-op on eager CPU)
    to_floats(ls) -> turn a list of loss handles into Python floats (the only host transfer,
                     done every `log_every` steps, outside the timed region)

Step time = fetch + step + block. The first `measure.warmup_steps` steps are excluded from the
steady-state statistics; the first step is reported apart (it includes compilation).

For data-parallel runs, `step_nosync` runs the same step with gradient synchronisation
disabled. After training, steps with and without sync alternate (`measure.nosync_steps`
pairs) and the median pairwise difference is the exposed communication time.
"""

from __future__ import annotations

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
    to_floats: Callable[[list[Any]], list[float]],
    step_nosync: Callable[[Any], Any] | None = None,
) -> dict[str, Any]:
    workload = ctx.workload
    steps = workload.steps
    log_every = workload.measure.log_every
    step_times: list[float] = []
    data_times: list[float] = []
    losses: list[float] = []
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
        if (i + 1) % log_every == 0 or i + 1 == steps:
            losses.extend(to_floats(pending))
            pending.clear()
            ctx.emit("step", step=i + 1, loss=losses[-1], step_time_s=step_times[-1])
    peak_train = memory.peak_rss()

    sync_times: list[float] = []
    nosync_times: list[float] = []
    if step_nosync is not None and workload.measure.nosync_steps:
        ctx.emit("phase", name="exposed-communication")
        for j in range(workload.measure.nosync_steps):
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
        "warmup_steps": workload.measure.warmup_steps,
        "peak_rss_bytes": peak_train,
        "rss_start_bytes": rss_start,
        "sync_step_times_s": sync_times,
        "nosync_step_times_s": nosync_times,
    }
