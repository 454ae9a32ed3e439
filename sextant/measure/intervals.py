"""Confidence intervals of speed-ups and memory ratios over repeated trials, and the
three-valued verdicts that rest on them.

Method (docs/methodology.md, "Intervals and verdicts"): a two-level (hierarchical)
bootstrap. A configuration's step time is the mean, over its trials, of each trial's median
steady-state step. One bootstrap replicate resamples the trials with replacement and, inside
each, the steps by a moving-block bootstrap (blocks of about n^(1/3) consecutive steps), then
takes that statistic again. The trial level carries the run-to-run movement (10-30% on a
shared machine, the larger part of the error); the blocks keep the correlation between
neighbouring steps (a slow patch of the machine lasts several steps), which an i.i.d. step
bootstrap would ignore and so give intervals too narrow. With one trial only the step level
remains: its interval leaves run-to-run drift out, which is why `--repeats` defaults above 1.
A ratio's interval is the percentile interval of the ratio of independent replicates of its
two sides at CONFIDENCE. Seeded: the same runs give the same interval.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from sextant.results.record import RunRecord

CONFIDENCE = 0.95
N_BOOT = 2000
SEED = 17

HOLDS = "holds"
NOT_HOLD = "does not hold here"
INCONCLUSIVE = "inconclusive"


def steady_step_times(run: RunRecord) -> np.ndarray | None:
    """The job's steady-state step times (slowest rank per step, after warm-up), or None
    when the record has no per-step times."""
    ranks = [r for r in run.ranks if r.step_times_s]
    timed = run.metrics.steps_timed
    if not ranks or timed is None or timed < 1:
        return None
    n = min(len(r.step_times_s) for r in ranks)
    if n < timed:
        return None
    job = np.max([np.asarray([math.nan if t is None else t for t in r.step_times_s[:n]],
                             dtype=np.float64) for r in ranks], axis=0)
    steady = job[n - timed:]
    return steady if np.all(np.isfinite(steady)) and np.all(steady > 0) else None


def _block_medians(x: np.ndarray, rng: np.random.Generator, n_boot: int) -> np.ndarray:
    n = len(x)
    if n == 1:
        return np.full(n_boot, float(x[0]))
    block = max(2, round(n ** (1 / 3)))
    block = min(block, n)
    blocks = math.ceil(n / block)
    starts = rng.integers(0, n - block + 1, size=(n_boot, blocks))
    idx = (starts[:, :, None] + np.arange(block)).reshape(n_boot, -1)[:, :n]
    return np.median(x[idx], axis=1)


def median_interval(samples: Sequence[float], confidence: float = CONFIDENCE
                    ) -> tuple[float, float | None, float | None]:
    """(median, low, high) of one series of timings (a served artifact's call latencies), by
    the moving-block bootstrap the step times use; no interval under 3 samples."""
    x = np.asarray(samples, dtype=np.float64)
    point = float(np.median(x))
    if len(x) < 3:
        return point, None, None
    reps = _block_medians(x, np.random.default_rng(SEED), N_BOOT)
    alpha = (1 - confidence) / 2
    low, high = np.quantile(reps, [alpha, 1 - alpha])
    return point, float(low), float(high)


def step_time_replicates(trials: Sequence[np.ndarray | float], rng: np.random.Generator,
                         n_boot: int = N_BOOT) -> tuple[float, np.ndarray]:
    """(point estimate, bootstrap replicates) of a configuration's step time. Each trial is
    its steady step times, or a float (its median) when the record has no per-step times."""
    per_trial = []
    point = []
    for t in trials:
        if isinstance(t, np.ndarray):
            per_trial.append(_block_medians(t, rng, n_boot))
            point.append(float(np.median(t)))
        else:
            per_trial.append(np.full(n_boot, float(t)))
            point.append(float(t))
    meds = np.asarray(per_trial)  # (k trials, n_boot)
    k = len(per_trial)
    pick = rng.integers(0, k, size=(n_boot, k)) if k > 1 else np.zeros((n_boot, 1), int)
    reps = meds[pick, np.arange(n_boot)[:, None]].mean(axis=1)
    return float(np.mean(point)), reps


def _trial_inputs(runs: Sequence[RunRecord]) -> tuple[list[np.ndarray | float], bool]:
    """Each trial's steps (or median) and whether the spread is known (per-step times in
    every trial, or at least two trials)."""
    out: list[np.ndarray | float] = []
    have_steps = True
    for run in runs:
        steps = steady_step_times(run)
        if steps is not None:
            out.append(steps)
            continue
        median = run.metrics.step_time_median_s
        if median is not None and median > 0:
            out.append(float(median))
            have_steps = False
    return out, bool(out) and (have_steps or len(out) >= 2)


def speedup_interval(base: Sequence[RunRecord], new: Sequence[RunRecord],
                     confidence: float = CONFIDENCE
                     ) -> tuple[float, float | None, float | None] | None:
    """How many times faster `new`'s trials step than `base`'s: (point, low, high). low and
    high are None when the spread is unknown (one trial without per-step times). None when a
    side has no step time."""
    b, b_known = _trial_inputs(base)
    n, n_known = _trial_inputs(new)
    if not b or not n:
        return None
    rng = np.random.default_rng(SEED)
    b_point, b_reps = step_time_replicates(b, rng)
    n_point, n_reps = step_time_replicates(n, rng)
    value = b_point / n_point
    if not (b_known and n_known):
        return value, None, None
    alpha = (1 - confidence) / 2
    low, high = np.quantile(b_reps / n_reps, [alpha, 1 - alpha])
    return value, float(low), float(high)


def value_ratio_interval(base: Sequence[float], new: Sequence[float],
                         confidence: float = CONFIDENCE
                         ) -> tuple[float, float | None, float | None] | None:
    """Ratio of the means of two samples of one figure per trial (peak memory), with its
    bootstrap-over-trials interval; low and high None with fewer than two trials a side."""
    if not base or not new:
        return None
    value = float(np.mean(base)) / float(np.mean(new))
    if len(base) < 2 or len(new) < 2:
        return value, None, None
    rng = np.random.default_rng(SEED)
    b = np.asarray(base, dtype=np.float64)[rng.integers(0, len(base), (N_BOOT, len(base)))]
    n = np.asarray(new, dtype=np.float64)[rng.integers(0, len(new), (N_BOOT, len(new)))]
    alpha = (1 - confidence) / 2
    low, high = np.quantile(b.mean(axis=1) / n.mean(axis=1), [alpha, 1 - alpha])
    return value, float(low), float(high)


_EPS = 1e-9


def verdict_at_least(low: float | None, high: float | None, threshold: float) -> str:
    """'holds' if the whole interval reaches `threshold`, 'does not hold' if it lies wholly
    below, else 'inconclusive' (also when there is no interval)."""
    if low is None or high is None:
        return INCONCLUSIVE
    if low >= threshold - _EPS:
        return HOLDS
    if high < threshold - _EPS:
        return NOT_HOLD
    return INCONCLUSIVE


def verdict_below(low: float | None, high: float | None, threshold: float) -> str:
    """'holds' if the whole interval lies below `threshold`, 'does not hold' if it wholly
    reaches it, else 'inconclusive'."""
    if low is None or high is None:
        return INCONCLUSIVE
    if high < threshold - _EPS:
        return HOLDS
    if low >= threshold - _EPS:
        return NOT_HOLD
    return INCONCLUSIVE


def distinguishable(low: float | None, high: float | None) -> bool:
    """Whether a ratio's interval excludes 1 (a winner can be named)."""
    return low is not None and high is not None and (low > 1 or high < 1)


def fmt_interval(low: float | None, high: float | None, confidence: float = CONFIDENCE) -> str:
    if low is None or high is None:
        return "no interval"
    return f"{confidence:.0%} CI {low:.2f}-{high:.2f}x"
