"""MindSpore's AdamW implementations against torch.optim.AdamW's formula, on the CPU.

Why sextant's MindSpore backend uses `mindspore.experimental.optim.AdamW`: ten updates of a
4,096-element parameter with decaying random gradients and a warm-up learning rate, through
each MindSpore optimizer, compared with torch.optim.AdamW's update written out in float64
numpy (decoupled decay p *= 1 - lr*wd, bias-corrected moments, eps added to
sqrt(v)/sqrt(1 - b2^t)). Prints, per optimizer, the largest deviation of its total update
from torch's (relative to torch's largest) and the ratio of the update norms.

Run it with the MindSpore environment's interpreter (`sextant env create mindspore`):

    $SEXTANT_ENVS/mindspore/bin/python benchmarks/mindspore_adamw.py
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

BETA1, BETA2, EPS, WEIGHT_DECAY, STEPS = 0.9, 0.95, 1e-8, 0.1, 10
RATES = np.array([3e-3 * min(1.0, (k + 1) / 5) for k in range(STEPS)], np.float32)


def torch_adamw(p0: np.ndarray, grads: list[np.ndarray]) -> np.ndarray:
    """torch.optim.AdamW's update, in float64."""
    p, m, v = p0.astype(np.float64), np.zeros(p0.shape), np.zeros(p0.shape)
    for t, (g32, lr32) in enumerate(zip(grads, RATES), 1):
        g, lr = g32.astype(np.float64), float(lr32)
        p = p * (1 - lr * WEIGHT_DECAY)
        m = BETA1 * m + (1 - BETA1) * g
        v = BETA2 * v + (1 - BETA2) * g * g
        p = p - lr / (1 - BETA1 ** t) * m / (np.sqrt(v) / np.sqrt(1 - BETA2 ** t) + EPS)
    return p


def mindspore_updates(p0: np.ndarray, grads: list[np.ndarray],
                      make: Callable[[list[Any]], Any]) -> np.ndarray:
    from mindspore import Parameter, Tensor, ops

    w = Parameter(Tensor(p0.copy()), name="w")
    opt = make([w])
    for g, lr in zip(grads, RATES):
        for rate in getattr(opt, "lrs", None) or [opt.learning_rate]:
            ops.assign(rate, Tensor(lr))
        opt((Tensor(g),))
    return w.asnumpy().astype(np.float64)


def main() -> None:
    import mindspore as ms
    from mindspore import Parameter, Tensor, nn
    from mindspore.experimental.optim import AdamW as ExperimentalAdamW
    from mindspore.mint.optim import AdamW as MintAdamW

    ms.set_device("CPU")
    rng = np.random.default_rng(0)
    p0 = rng.standard_normal(4096).astype(np.float32) * 0.02
    grads = [rng.standard_normal(4096).astype(np.float32) * np.float32(s)
             for s in np.linspace(1.0, 0.2, STEPS)]
    reference = torch_adamw(p0, grads) - p0
    candidates: dict[str, Callable[[list[Any]], Any]] = {
        "experimental.optim.AdamW": lambda ps: ExperimentalAdamW(
            ps, lr=1e-3, betas=(BETA1, BETA2), eps=EPS, weight_decay=WEIGHT_DECAY),
        "nn.AdamWeightDecay": lambda ps: nn.AdamWeightDecay(
            ps, learning_rate=Parameter(Tensor(np.float32(1e-3)), name="lr"), beta1=BETA1,
            beta2=BETA2, eps=EPS, weight_decay=WEIGHT_DECAY),
        "mint.optim.AdamW": lambda ps: MintAdamW(
            ps, lr=1e-3, betas=(BETA1, BETA2), eps=EPS, weight_decay=WEIGHT_DECAY),
    }
    print(f"MindSpore {ms.__version__}, {STEPS} updates, against torch.optim.AdamW's formula")
    for name, make in candidates.items():
        try:
            update = mindspore_updates(p0, grads, make) - p0
        except RuntimeError as exc:
            print(f"{name:26} fails on the CPU: {str(exc).splitlines()[0]}")
            continue
        deviation = np.max(np.abs(update - reference)) / np.max(np.abs(reference))
        ratio = np.linalg.norm(update) / np.linalg.norm(reference)
        print(f"{name:26} max deviation {deviation:.2e} of torch's largest update; "
              f"update norm {ratio:.4f} x torch's")


if __name__ == "__main__":
    main()
