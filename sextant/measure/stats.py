"""Summary statistics with their spread. Every timing sextant reports goes through here."""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np


def summarize(values: Sequence[float]) -> dict[str, float | int | None]:
    """Median, p10, p90, mean, min, max and count (p10/p90 by linear interpolation)."""
    if len(values) == 0:
        return {"median": None, "p10": None, "p90": None, "mean": None,
                "min": None, "max": None, "n": 0}
    a = np.asarray(values, dtype=np.float64)
    p10, median, p90 = np.percentile(a, [10, 50, 90])
    return {
        "median": float(median),
        "p10": float(p10),
        "p90": float(p90),
        "mean": float(a.mean()),
        "min": float(a.min()),
        "max": float(a.max()),
        "n": int(a.size),
    }


def paired_median_difference(with_x: Sequence[float], without_x: Sequence[float]) -> float | None:
    """Median of the differences of alternating pairs (a_i - b_i).

    Used for the exposed-communication figure: steps with and without gradient sync are run
    alternately, so slow drifts of the machine (another process, frequency changes) cancel in
    each pair instead of biasing one side.
    """
    n = min(len(with_x), len(without_x))
    if n == 0:
        return None
    return float(np.median(np.asarray(with_x[:n]) - np.asarray(without_x[:n])))


def max_loss_diff(losses: Sequence[float | None], reference: Sequence[float | None]
                  ) -> float | None:
    """Largest absolute difference of two loss curves over their common steps. A NaN,
    infinite or missing (None) loss on either side is a disagreement, never a match: the
    difference is then infinite (Python's max() would skip a NaN after a finite value)."""
    n = min(len(losses), len(reference))
    if n == 0:
        return None
    worst = 0.0
    for a, b in zip(losses[:n], reference[:n]):
        if a is None or b is None or not (_finite(a) and _finite(b)):
            return math.inf
        worst = max(worst, abs(a - b))
    return worst


def _finite(x: object) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)
