"""Timing one collective at one message size, inside a torch.distributed worker (used by
`sextant calibrate` for all-reduce and `sextant check` for all-gather)."""

from __future__ import annotations

import time
from collections.abc import Callable


def time_collective(op: Callable[..., object]) -> tuple[float, float, float, int]:
    """(median, p10, p90, repetitions) of `op()` in seconds on this rank.

    Three untimed calls warm the connection up; then every rank runs the same number of timed
    calls, chosen by rank 0 from one probe call (about 0.25 s of work, 5 to 50 calls)."""
    import torch
    import torch.distributed as dist

    for _ in range(3):
        op()
    dist.barrier()
    t0 = time.perf_counter()
    op()
    probe = torch.tensor([time.perf_counter() - t0], dtype=torch.float64)
    dist.broadcast(probe, 0)
    reps = int(min(50, max(5, 0.25 / max(float(probe.item()), 1e-6))))
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        op()
        times.append(time.perf_counter() - t0)
    times.sort()
    return (times[len(times) // 2], times[len(times) // 10],
            times[min(len(times) - 1, (9 * len(times)) // 10)], reps)
