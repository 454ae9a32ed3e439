"""The alternating in-process timing of the A/B scripts here: every variant warmed up, then
`rounds` rounds of `block` calls each, the order reversed every other round, and each
variant's median and 10th percentile printed against one of them."""

from __future__ import annotations

import statistics
import time
from typing import Callable


def alternate(variants: dict[str, Callable[[], object]], rounds: int, *, block: int = 10,
              warm: int = 3) -> dict[str, list[float]]:
    """Seconds per call of each variant, alternating blocks of `block` calls."""
    for f in variants.values():
        for _ in range(warm):
            f()
    ts: dict[str, list[float]] = {n: [] for n in variants}
    for r in range(rounds):
        for n in (list(variants) if r % 2 == 0 else list(variants)[::-1]):
            f = variants[n]
            for _ in range(block):
                t0 = time.perf_counter()
                f()
                ts[n].append(time.perf_counter() - t0)
    return ts


def report(ts: dict[str, list[float]], base: str, width: int = 28) -> None:
    ref = statistics.median(ts[base])
    for n, t in ts.items():
        print(f"{n:<{width}} median {statistics.median(t) * 1e3:7.2f} ms  "
              f"p10 {sorted(t)[len(t) // 10] * 1e3:7.2f} ms  / {base} {statistics.median(t) / ref:.3f}")
