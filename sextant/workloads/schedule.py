"""The learning-rate schedule, computed once on the host and shared by every backend.

Update k (0-based) uses lr * factor(k): a linear warm-up factor (k + 1) / warmup_steps for
k < warmup_steps, then a cosine from 1 down to min_lr_ratio at the last update. Backends index
this table (a Python float for torch, a constant array inside the jitted step for JAX), so the
schedule cannot drift between frameworks.
"""

from __future__ import annotations

import math

import numpy as np

from sextant.workloads.spec import OptimizerSpec


def lr_table(opt: OptimizerSpec, steps: int) -> np.ndarray:
    """float32 learning rate of each of `steps` updates."""
    out = np.empty(steps, dtype=np.float64)
    decay_steps = max(1, steps - opt.warmup_steps - 1)
    for k in range(steps):
        if k < opt.warmup_steps:
            factor = (k + 1) / opt.warmup_steps
        else:
            progress = min(1.0, (k - opt.warmup_steps) / decay_steps)
            cosine = 0.5 * (1.0 + math.cos(math.pi * progress))
            factor = opt.min_lr_ratio + (1.0 - opt.min_lr_ratio) * cosine
        out[k] = opt.lr * factor
    return out.astype(np.float32)
