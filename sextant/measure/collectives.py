"""Timing one collective at one message size, inside a torch.distributed worker (used by
`sextant calibrate` for all-reduce and `sextant check` for all-gather), and the alpha-beta fit
of the times against the message sizes (t = alpha + beta * bytes)."""

from __future__ import annotations

import time
from collections.abc import Callable

import numpy as np

from sextant.core.errors import UserError


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


def fit_alpha_beta(sizes, times) -> dict[str, float]:
    """Least squares fit of t = alpha + beta * bytes, minimising relative residuals."""
    m = np.asarray(sizes, dtype=np.float64)
    t = np.asarray(times, dtype=np.float64)
    if len(m) < 2:
        raise UserError("an alpha-beta fit needs at least 2 message sizes")
    a = np.stack([1.0 / t, m / t], axis=1)
    (alpha, beta), *_ = np.linalg.lstsq(a, np.ones_like(t), rcond=None)
    pred = alpha + beta * m
    rel = (pred - t) / t
    ss_res = float(((pred - t) ** 2).sum())
    ss_tot = float(((t - t.mean()) ** 2).sum()) or 1.0
    return {
        "alpha_s": float(alpha),
        "beta_s_per_byte": float(beta),
        "bandwidth_bytes_per_s": float(1.0 / beta) if beta > 0 else 0.0,
        "r2": 1.0 - ss_res / ss_tot,
        "max_rel_residual": float(np.abs(rel).max()),
        "median_rel_residual": float(np.median(np.abs(rel))),
    }
