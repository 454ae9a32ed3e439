"""The batch pipeline measured on its own: how many tokens per second one rank's reader
delivers with no training at all, against how many the training step needs.

The reader is `sextant.data.local_batch`, the same call every backend makes for its rank's
batch, so what is measured is what training waits for. A step that computes in `c` seconds
on B/N sequences of T tokens needs (B/N * T) / c tokens per second from its rank's reader:
a pipeline slower than that makes every step wait, whatever the prefetching.
"""

from __future__ import annotations

import time
from typing import Any

from sextant.data import local_batch
from sextant.workloads.spec import Workload


def pipeline_throughput(workload: Workload, world: int, *, rank: int = 0, batches: int = 20,
                        fault: str | None = None) -> dict[str, Any]:
    """Rank `rank`'s reader timed over `batches` fresh batches (steps the timed runs do not
    read first, so no page cache from them helps): tokens (or samples) per second."""
    start_step = workload.steps  # past the trained steps: batches nobody has read yet
    per_batch = 0
    t0 = time.perf_counter()
    for i in range(batches):
        x, _ = local_batch(workload, start_step + i, rank, world, fault)
        per_batch = int(x.size)
    seconds = time.perf_counter() - t0
    return {"tokens_per_s": per_batch * batches / seconds if seconds > 0 else float("inf"),
            "seconds_per_batch": seconds / batches, "tokens_per_batch": per_batch,
            "batches": batches, "world": world}


def needed_throughput(step_s: float | None, data_wait_s: float | None,
                      tokens_per_batch: int) -> float | None:
    """Tokens per second a rank's reader must deliver so that the run's step never waits:
    its batch in the compute time of a step (median step time less median data wait)."""
    if not step_s:
        return None
    compute = max(step_s - (data_wait_s or 0.0), 1e-9)
    return tokens_per_batch / compute
