"""Check the articles' claims against stored runs of one workload.

Every check is a pure function of run records (sextant.results.record.RunRecord). A check
compares runs of the *same workload* (same workload_hash), picks "plain" runs (fp32, no gradient
compression, no gradient accumulation) unless the claim is about precision or compression,
and returns a `Claim` with the measured figure, its spread, a verdict and the command that
reproduces the measurement.

A configuration's runs are its trials: the runs of the same configuration in the same
compare group (`--repeats N`), less the runs marked *disturbed* (sextant.measure.interference),
which never enter a verdict. A ratio of step times is the ratio of the configurations' mean
trial medians with a confidence interval from a hierarchical bootstrap over trials and
blocks of steps (sextant.measure.intervals). Verdicts are three-valued: *holds* when the whole
interval is on the claim's side of its threshold, *does not hold here* when it is wholly on
the other side, *inconclusive* when it straddles the threshold, when no interval can be
computed, or when only disturbed runs measured it (docs/report.md, "Claims check").
"""

from __future__ import annotations

import dataclasses
import json
import shlex
from functools import partial
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypedDict

from sextant.measure.intervals import (
    CONFIDENCE,
    HOLDS,
    INCONCLUSIVE,
    NOT_HOLD,
    speedup_interval,
    value_ratio_interval,
    verdict_at_least,
    verdict_below,
)
from sextant.results.deploy import DeployRecord
from sextant.results.record import RunRecord

NOT_MEASURED = "not measured"
VERDICTS = (HOLDS, NOT_HOLD, INCONCLUSIVE, NOT_MEASURED)

COMPILE_MIN_SPEEDUP = 1.10
"""torch.compile: eager / compiled median step >= 1.10 (the claim's lower end, 10%)."""
JAX_MIN_SAVING = 0.10
"""JAX vs eager PyTorch: JAX's median step at least 10% shorter (half the claimed ~20%,
still well beyond the few percent that medians move between repeated runs)."""
MIXED_MIN_SPEEDUP = 1.5
"""Mixed precision: fp32 / bf16 median step >= 1.5 ("roughly doubles")."""
SLOWER_BELOW = 0.95
"""Adding workers: some multi-worker run's throughput below 0.95 x its one-process run."""
LESS_MEMORY_BELOW = 0.95
"""TensorFlow memory: its peak RSS below 0.95 x every other framework's, every config."""

_EPS = 1e-9
"""Ratios at a threshold count as reaching it (0.22 / 0.20 is 1.0999999999999999)."""


class ClaimDict(TypedDict):
    """A Claim as JSON (the report's claims section; `sextant claims --json`)."""

    id: str
    claim: str
    compared: str
    rule: str
    verdict: str
    figure: str
    value: float | None
    low: float | None
    high: float | None
    confidence: float
    unit: str
    details: list[str]
    command: str
    reason: str
    run_ids: list[Any]


@dataclass(kw_only=True, frozen=True)
class Claim:
    """One claim, what was compared, the measured figure and the verdict."""

    id: str
    """Stable key: compile, jax-vs-eager, mixed-precision, compression, workers-slower,
    tf-memory."""
    claim: str
    """The claim as articles state it."""
    compared: str
    """Which runs are compared, in words."""
    rule: str
    """When the verdict is 'holds'."""
    verdict: str
    """holds | does not hold here | inconclusive | not measured."""
    figure: str
    """The measured figure with its spread, in words ('-' when not measured)."""
    value: float | None = None
    """Headline ratio (see `unit`)."""
    low: float | None = None
    high: float | None = None
    """Confidence interval of the headline ratio at `confidence` (None: none computable)."""
    confidence: float = CONFIDENCE
    unit: str = ""
    """What `value` is, e.g. 'speed-up (x)'."""
    details: tuple[str, ...] = ()
    """Every comparison made, one line each."""
    command: str = ""
    """Command that reproduces (or would measure) it; '' when none exists yet."""
    reason: str = ""
    """Why it was not measured."""
    run_ids: tuple[Any, ...] = field(default=())
    """Results-store runs it rests on."""

    def to_dict(self) -> ClaimDict:
        return {
            "id": self.id, "claim": self.claim, "compared": self.compared, "rule": self.rule,
            "verdict": self.verdict, "figure": self.figure, "value": self.value,
            "low": self.low, "high": self.high, "confidence": self.confidence,
            "unit": self.unit,
            "details": list(self.details), "command": self.command, "reason": self.reason,
            "run_ids": list(self.run_ids),
        }


# -- run access -------------------------------------------------------------------------

def _workload_key(run: RunRecord) -> str:
    return run.workload_hash or json.dumps(run.workload_dict(), sort_keys=True)


def conditions(run: RunRecord) -> tuple[str, str, str]:
    """(effective precision, device, accelerator): what must be equal before two runs are
    ranked. The precision is the one the framework reported using (XLA's fp32 on a GPU is
    TF32 unless told otherwise); records from before it was read back count as asked."""
    return (run.metrics.effective_precision or run.strategy.precision,
            run.metrics.device or run.strategy.device,
            run.metrics.accelerator or "")


def compute_units(device: str, workers: int, threads: Any) -> int:
    """The compute a run held, for efficiency at equal compute: its devices on GPUs; on CPU
    cores its workers x threads each (two one-thread workers hold what one two-thread worker
    held; 1 thread when unrecorded)."""
    if device == "gpu":
        return workers
    return workers * (threads if isinstance(threads, int) and threads > 0 else 1)


def unequal(a: RunRecord, b: RunRecord) -> str | None:
    """Why two runs may not be ranked against each other, or None when they may."""
    ca, cb = conditions(a), conditions(b)
    if ca == cb:
        return None
    what = ("precision", "device", "accelerator")
    return "; ".join(f"{w} {x or '-'} vs {y or '-'}" for w, x, y in zip(what, ca, cb) if x != y)


def _plain(run: RunRecord) -> bool:
    """Full precision (fp32 or tf32), no compression, no accumulation: a framework's own
    speed, not a lever's."""
    return (run.strategy.precision in ("fp32", "tf32")
            and run.strategy.compress == "none"
            and run.strategy.grad_accum == 1)


def _single(run: RunRecord) -> bool:
    return run.strategy.parallel == "single"


def _multi(run: RunRecord) -> bool:
    return (not _single(run)
            and run.strategy.workers * run.strategy.devices_per_worker > 1)


def _config(run: RunRecord, *skip: str) -> tuple[Any, ...]:
    keys = ("framework", "mode", "parallel", "workers", "devices_per_worker", "precision",
            "compress", "grad_accum")
    return tuple(getattr(run.strategy, k) for k in keys if k not in skip)


def _pick(runs: Sequence[RunRecord], cond: Callable[[RunRecord], bool]
          ) -> RunRecord | None:
    """The latest run (last in store order) satisfying cond that has a step time."""
    found = [r for r in runs if cond(r) and r.metrics.step_time_median_s]
    return found[-1] if found else None


def trials_of(runs: Sequence[RunRecord] | None, run: RunRecord
              ) -> list[RunRecord]:
    """`run` and the other trials of its configuration: same configuration, same workload,
    same compare group."""
    if runs is None:
        return [run]
    key, group, wl = _config(run), run.group_id, _workload_key(run)
    same = [r for r in runs if _config(r) == key and r.group_id == group
            and _workload_key(r) == wl]
    return same if any(r is run for r in same) else [run, *same]


# -- ratios -----------------------------------------------------------------------------

def speedup(base: RunRecord, new: RunRecord,
            runs: Sequence[RunRecord] | None = None
            ) -> tuple[float, float | None, float | None] | None:
    """How many times faster `new` steps than `base`, over the trials of each in `runs`
    (default: the two runs alone), with its confidence interval (None, None when it cannot
    be computed). None without both step times."""
    if not base.metrics.step_time_median_s or not new.metrics.step_time_median_s:
        return None
    return speedup_interval(trials_of(runs, base), trials_of(runs, new))


def _x(v: float | None) -> str:
    return "-" if v is None else f"{v:.2f}x"


def _span(low: float | None, high: float | None) -> str:
    if low is None or high is None:
        return " (no interval: one trial without per-step times)"
    return f" ({CONFIDENCE:.0%} CI {low:.2f}-{high:.2f}x)"


def _faster(what: str, value: float) -> str:
    """'compiled 25% faster', '... 17% slower' or '... same speed' (within 0.5%)."""
    if abs(value - 1) < 0.005:
        return f"{what} runs at the same speed"
    return f"{what} {abs(value - 1) * 100:.0f}% {'faster' if value > 1 else 'slower'}"


def _median_item(items: list[Any], key: Callable[[Any], float]) -> Any:
    ordered = sorted(items, key=key)
    return ordered[(len(ordered) - 1) // 2]


# -- commands ---------------------------------------------------------------------------

def _compare_cmd(workload: Mapping[str, Any], frameworks: Sequence[str],
                 workers: int | None = None) -> str:
    # The file the runs were made from, when the record names it (a bundled workload's name
    # or a custom file's path); the name alone does not reproduce a custom workload.
    source = workload.get("file") or workload.get("name", "?")
    parts = ["sextant", "compare", "--workload", shlex.quote(str(source))]
    if workload.get("steps"):
        parts += ["--steps", str(workload["steps"])]
    parts += ["--frameworks", ",".join(frameworks)]
    if workers is not None and workers != 2:
        parts += ["--workers", str(workers)]
    return " ".join(parts)


def _show_cmd(ids: Sequence[Any]) -> str:
    return "; ".join(f"sextant runs show {i}" for i in ids)


def _ids(*runs: RunRecord) -> tuple[Any, ...]:
    return tuple(r.id for r in runs if r.id is not None)


# -- the claims -------------------------------------------------------------------------

def claim_compile(runs: Sequence[RunRecord], workload: Mapping[str, Any]) -> Claim:
    make = partial(
        Claim,
        id="compile", claim="torch.compile gives a 10-30% speed-up",
        compared="torch compiled vs torch eager, one process each",
        rule=f"holds if the interval of eager / compiled step time is >= "
             f"{COMPILE_MIN_SPEEDUP:.2f}x",
        unit="speed-up (x)", command=_compare_cmd(workload, ["torch"]),
    )
    eager = _pick(runs, lambda r: r.strategy.framework == "torch" and _single(r)
                  and r.strategy.mode == "eager" and _plain(r))
    compiled = _pick(runs, lambda r: r.strategy.framework == "torch" and _single(r)
                     and r.strategy.mode == "compiled" and _plain(r)
                     and (eager is None or unequal(r, eager) is None))
    ratio = speedup(eager, compiled, runs) if eager and compiled else None
    if eager is None or compiled is None or ratio is None:
        missing = "torch eager" if eager is None else "torch compiled"
        return make(verdict=NOT_MEASURED, figure="-",
                     reason=f"no one-process {missing} run of this workload")
    value, low, high = ratio
    figure = f"{_x(value)}: {_faster('compiled', value)}{_span(low, high)}"
    detail = (f"{eager.label} {_ms(eager)} ms vs {compiled.label} {_ms(compiled)} ms "
              "median step")
    return make(verdict=verdict_at_least(low, high, COMPILE_MIN_SPEEDUP),
                 figure=figure, value=value, low=low, high=high, details=(detail,),
                 run_ids=_ids(eager, compiled))


def claim_jax(runs: Sequence[RunRecord], workload: Mapping[str, Any]) -> Claim:
    make = partial(
        Claim,
        id="jax-vs-eager",
        claim="JAX (XLA) is faster than eager PyTorch and saves ~20% compute",
        compared="jax (jit) vs torch eager, one process each",
        rule=f"holds if JAX's step is at least {JAX_MIN_SAVING:.0%} shorter over the whole "
             f"interval (speed-up >= {1 / (1 - JAX_MIN_SAVING):.2f}x)",
        unit="speed-up (x)", command=_compare_cmd(workload, ["torch", "jax"]),
    )
    torch = _pick(runs, lambda r: r.strategy.framework == "torch" and _single(r)
                  and r.strategy.mode == "eager" and _plain(r))
    def one_jax(r: RunRecord) -> bool:
        return r.strategy.framework == "jax" and _single(r) and _plain(r)

    jax = _pick(runs, lambda r: one_jax(r) and (torch is None or unequal(r, torch) is None))
    ratio = speedup(torch, jax, runs) if torch and jax else None
    if torch is None or jax is None or ratio is None:
        other = _pick(runs, one_jax)
        if torch is not None and other is not None:
            return make(verdict=NOT_MEASURED, figure="-",
                         reason=f"not ranked: {other.label} and {torch.label} ran "
                                f"under different conditions ({unequal(other, torch)})")
        missing = "torch eager" if torch is None else "jax"
        return make(verdict=NOT_MEASURED, figure="-",
                     reason=f"no one-process {missing} run of this workload")
    value, low, high = ratio
    saving = 1 - 1 / value
    figure = (f"{_x(value)}: JAX's step takes {abs(saving) * 100:.0f}% "
              f"{'less' if saving >= 0 else 'more'} time{_span(low, high)}")
    detail = f"{torch.label} {_ms(torch)} ms vs {jax.label} {_ms(jax)} ms median step"
    return make(verdict=verdict_at_least(low, high, 1 / (1 - JAX_MIN_SAVING)),
                 figure=figure, value=value, low=low, high=high, details=(detail,),
                 run_ids=_ids(torch, jax))


def claim_mixed_precision(runs: Sequence[RunRecord], workload: Mapping[str, Any]
                          ) -> Claim:
    make = partial(
        Claim,
        id="mixed-precision", claim="Mixed precision (bf16) roughly doubles training speed",
        compared="bf16 vs fp32, same framework, mode, parallel strategy and workers",
        rule=f"holds if the interval of fp32 / bf16 step time is >= {MIXED_MIN_SPEEDUP:.1f}x "
             "(middle pair of several)",
        unit="speed-up (x)",
    )
    pairs: list[tuple[Any, ...]] = []
    for low_p in runs:
        if conditions(low_p)[0] != "bf16" or low_p.strategy.compress != "none":
            continue
        key = _config(low_p, "precision")
        full = _pick(runs, lambda r: _config(r, "precision") == key
                     and conditions(r) == ("fp32", *conditions(low_p)[1:]))
        ratio = speedup(full, low_p, runs) if full else None
        if ratio is not None and not any(b is not low_p and _config(b) == _config(low_p)
                                         for _, b, _ in pairs):
            pairs.append((full, low_p, ratio))
    if not pairs:
        return make(verdict=NOT_MEASURED, figure="-",
                     reason="no bf16 run with a matching fp32 run of this workload")
    full, low_p, (value, low, high) = _median_item(pairs, key=lambda p: p[2][0])
    details = tuple(f"{f.label} fp32 {_ms(f)} ms vs bf16 {_ms(b)} ms: {_x(r[0])}"
                    for f, b, r in pairs)
    return make(verdict=verdict_at_least(low, high, MIXED_MIN_SPEEDUP),
                 figure=f"{_x(value)} faster in bf16{_span(low, high)}", value=value, low=low,
                 high=high, details=details, command=_show_cmd(_ids(full, low_p)),
                 run_ids=tuple(i for f, b, _ in pairs for i in _ids(f, b)))


def _compute_s(run: RunRecord) -> float | None:
    step = run.metrics.sync_step_median_s or run.metrics.step_time_median_s
    comm = run.metrics.exposed_comm_s
    if step is None or comm is None:
        return None
    return step - max(comm, 0.0)


def _with_compress(run: RunRecord) -> str:
    label, compress = run.label, run.strategy.compress
    return label if compress in label else f"{label} ({compress})"


def claim_compression(runs: Sequence[RunRecord], workload: Mapping[str, Any]
                      ) -> Claim:
    make = partial(
        Claim,
        id="compression",
        claim="Gradient compression trades CPU time for network bandwidth",
        compared="data-parallel run with gradient compression vs the same run without",
        rule="holds if exposed communication falls and compute (synced step - exposed "
             "communication) rises, both over their whole intervals (needs --repeats >= 2)",
        unit="exposed communication with / without (x)",
    )
    pairs: list[tuple[Any, ...]] = []
    for comp in runs:
        if comp.strategy.compress == "none" or _single(comp):
            continue
        if any(_config(c) == _config(comp) for _, c, *_ in pairs):
            continue  # another trial of a configuration already paired
        key = _config(comp, "compress")
        plain = _pick(runs, lambda r: _config(r, "compress") == key
                      and r.strategy.compress == "none")
        if plain is None:
            continue
        comm_c, comm_p = comp.metrics.exposed_comm_s, plain.metrics.exposed_comm_s
        work_c, work_p = _compute_s(comp), _compute_s(plain)
        if (comm_c is None or comm_p is None or work_c is None or work_p is None
                or comm_p <= 0 or work_p <= 0):
            continue
        pairs.append((plain, comp, comm_c / comm_p, work_c / work_p))
    if not pairs:
        return make(verdict=NOT_MEASURED, figure="-",
                     reason="no data-parallel run with gradient compression and a matching "
                            "run without, both with exposed communication measured")
    plain, comp, comm_ratio, work_ratio = _median_item(pairs, key=lambda p: p[2])
    step = speedup(plain, comp)
    figure = (f"exposed communication {_x(comm_ratio)}, compute {_x(work_ratio)}"
              + (f"; step {_x(step[0])} faster{_span(step[1], step[2])}" if step else ""))
    details = tuple(
        f"{_with_compress(c)} vs {p.label}: exposed comm "
        f"{_ms_of(p.metrics.exposed_comm_s)} -> {_ms_of(c.metrics.exposed_comm_s)} ms, "
        f"compute {_ms_of(_compute_s(p))} -> {_ms_of(_compute_s(c))} ms"
        for p, c, _, _ in pairs
    )
    comm_iv = _trial_ratio(runs, comp, plain, lambda r: r.metrics.exposed_comm_s)
    work_iv = _trial_ratio(runs, comp, plain, _compute_s)
    figure += (f"; {CONFIDENCE:.0%} CI of exposed communication {_ci(comm_iv)}, of compute "
               f"{_ci(work_iv)}")
    falls = verdict_below(comm_iv[1], comm_iv[2], 1.0) if comm_iv else INCONCLUSIVE
    rises = verdict_at_least(work_iv[1], work_iv[2], 1.0 + _EPS) if work_iv else INCONCLUSIVE
    if falls == HOLDS and rises == HOLDS:
        verdict = HOLDS
    elif NOT_HOLD in (falls, rises):
        verdict = NOT_HOLD
    else:
        verdict = INCONCLUSIVE
    return make(verdict=verdict, figure=figure,
                 value=comm_iv[0] if comm_iv else comm_ratio,
                 low=comm_iv[1] if comm_iv else None, high=comm_iv[2] if comm_iv else None,
                 details=details, command=_show_cmd(_ids(plain, comp)),
                 run_ids=tuple(i for p, c, _, _ in pairs for i in _ids(p, c)))


def _trial_ratio(runs: Sequence[RunRecord], num: RunRecord,
                 den: RunRecord, figure: Callable[[RunRecord], float | None]
                 ) -> tuple[float, float | None, float | None] | None:
    """Ratio of a per-run figure, num's trials over den's, with its bootstrap interval."""
    a = [v for v in (figure(r) for r in trials_of(runs, num)) if v is not None]
    b = [v for v in (figure(r) for r in trials_of(runs, den)) if v is not None]
    return value_ratio_interval(a, b)


def _ci(iv: tuple[float, float | None, float | None] | None) -> str:
    if iv is None or iv[1] is None or iv[2] is None:
        return "not computable (one trial)"
    return f"{iv[1]:.2f}-{iv[2]:.2f}x"


def claim_workers(runs: Sequence[RunRecord], workload: Mapping[str, Any]) -> Claim:
    multi = [r for r in runs if _multi(r) and _plain(r) and r.metrics.step_time_median_s]
    frameworks = list(dict.fromkeys(r.strategy.framework for r in multi)) or ["torch"]
    workers = max((r.strategy.workers for r in multi), default=2)
    make = partial(
        Claim,
        id="workers-slower", claim="Adding workers can make training slower",
        compared="throughput of each multi-worker run vs one process, same framework and "
                 "mode, same global batch",
        rule=f"holds if some multi-worker run is below {SLOWER_BELOW:.2f}x over its whole "
             "interval",
        unit="throughput multi / single (x)",
        command=_compare_cmd(workload, frameworks, workers),
    )
    pairs: list[tuple[Any, ...]] = []
    for run in multi:
        if any(_config(r) == _config(run) for _, r, _ in pairs):
            continue  # another trial of a configuration already paired
        single = _pick(runs, lambda r: _single(r) and _plain(r)
                       and r.strategy.framework == run.strategy.framework
                       and r.strategy.mode == run.strategy.mode
                       and unequal(r, run) is None)
        ratio = speedup(single, run, runs) if single else None
        if ratio is not None:
            pairs.append((single, run, ratio))
    if not pairs:
        return make(verdict=NOT_MEASURED, figure="-",
                     reason="no multi-worker run with a one-process run of the same framework "
                            "and mode")
    single, run, (value, low, high) = min(pairs, key=lambda p: p[2][0])
    details = tuple(f"{r.label}: {_x(v)} the throughput of {s.label}{_span(lo, hi)}"
                    for s, r, (v, lo, hi) in pairs)
    figure = (f"{run.label}: {_x(value)} the throughput of {single.label}"
              f"{_span(low, high)}")
    each = [verdict_below(lo, hi, SLOWER_BELOW) for _, _, (_, lo, hi) in pairs]
    verdict = (HOLDS if HOLDS in each else NOT_HOLD if all(v == NOT_HOLD for v in each)
               else INCONCLUSIVE)
    return make(verdict=verdict,
                 figure=figure, value=value, low=low, high=high, details=details,
                 run_ids=tuple(i for s, r, _ in pairs for i in _ids(s, r)))


def _rss_range(run: RunRecord) -> tuple[float, float] | None:
    peak = run.metrics.peak_rss_bytes
    ranks = [r.peak_rss_bytes for r in run.ranks
             if r.peak_rss_bytes is not None and r.peak_rss_bytes > 0]
    if ranks:
        return min(ranks), max(ranks)
    return (peak, peak) if peak else None


def claim_tf_memory(runs: Sequence[RunRecord], workload: Mapping[str, Any]) -> Claim:
    make = partial(
        Claim,
        id="tf-memory", claim="TensorFlow uses less memory than PyTorch and JAX",
        compared="peak RSS per worker, same parallel strategy and workers, each framework "
                 "at its leanest mode",
        rule=f"holds if below {LESS_MEMORY_BELOW:.2f}x every other framework, in every "
             "matched configuration, over the whole interval (bootstrap over trials; with "
             "one trial, the range over ranks)",
        unit="peak RSS TensorFlow / other (x)",
        command=_compare_cmd(workload, ["tensorflow", "torch", "jax"]),
    )
    leanest: dict[tuple[Any, ...], dict[str, RunRecord]] = {}
    for run in runs:
        peak = run.metrics.peak_rss_bytes
        if not _plain(run) or not peak:
            continue
        config = (run.strategy.parallel, run.strategy.workers,
                  run.strategy.devices_per_worker, conditions(run))
        per_fw = leanest.setdefault(config, {})
        fw = run.strategy.framework
        best = per_fw[fw].metrics.peak_rss_bytes if fw in per_fw else None
        if best is None or peak < best:
            per_fw[fw] = run
    pairs: list[tuple[Any, ...]] = []
    for config in sorted(leanest, key=str):
        per_fw = leanest[config]
        tf = per_fw.get("tensorflow")
        if tf is None:
            continue
        for fw in sorted(per_fw):
            if fw == "tensorflow":
                continue
            other = per_fw[fw]
            iv = _trial_ratio(runs, tf, other, lambda r: r.metrics.peak_rss_bytes)
            if iv is not None and iv[1] is not None:
                value, low, high = iv
            else:  # one trial a side: the range over ranks stands in for the interval
                t_peak, o_peak = tf.metrics.peak_rss_bytes, other.metrics.peak_rss_bytes
                t_range, o_range = _rss_range(tf), _rss_range(other)
                if t_peak is None or o_peak is None or t_range is None or o_range is None:
                    continue  # not reached: `leanest` holds runs with a peak RSS only
                value = t_peak / o_peak
                (t_lo, t_hi), (o_lo, o_hi) = t_range, o_range
                low, high = t_lo / o_hi, t_hi / o_lo
            pairs.append((tf, other, value, low, high))
    if not pairs:
        has_tf = any(r.strategy.framework == "tensorflow" for r in runs)
        reason = ("no torch or jax run with the same parallel strategy and workers as a "
                  "TensorFlow run" if has_tf else
                  "no TensorFlow run of this workload (pip install 'sextant[tensorflow]')")
        return make(verdict=NOT_MEASURED, figure="-", reason=reason)
    tf, other, value, low, high = max(pairs, key=lambda p: p[2])
    details = tuple(f"{t.label} {_mb(t)} MB vs {o.label} {_mb(o)} MB: {_x(v)}"
                    for t, o, v, _, _ in pairs)
    figure = (f"{tf.label} {_mb(tf)} MB vs {other.label} {_mb(other)} MB: {_x(value)}"
              + (f" (interval {low:.2f}-{high:.2f}x)" if high - low > 1e-9 else ""))
    each = [verdict_below(lo, hi, LESS_MEMORY_BELOW) for _, _, _, lo, hi in pairs]
    verdict = (HOLDS if all(v == HOLDS for v in each) else NOT_HOLD if NOT_HOLD in each
               else INCONCLUSIVE)
    return make(verdict=verdict, figure=figure, value=value,
                 low=low, high=high, details=details,
                 run_ids=tuple(dict.fromkeys(i for t, o, *_ in pairs for i in _ids(t, o))))


CHECKS = (claim_compile, claim_jax, claim_mixed_precision, claim_compression, claim_workers,
          claim_tf_memory)


def check_claims(runs: Sequence[RunRecord], *, workload_hash: str | None = None,
                 deployments: Sequence[DeployRecord] = ()) -> list[Claim]:
    """Every claim, in a fixed order, over the successful runs of one workload (default:
    the workload of the last run), then the deployment claims over `deployments` (one
    deployment group: sextant.claims.deploy)."""
    from sextant.claims.deploy import deploy_claims

    ok = [r for r in runs if r.status == "ok"]
    if not ok:
        workload: Mapping[str, Any] = runs[-1].workload if runs else {}
        return [check([], workload) for check in CHECKS] + deploy_claims(deployments, workload)
    key = workload_hash or _workload_key(ok[-1])
    same = [r for r in ok if _workload_key(r) == key or r.workload_hash == key]
    last = same[-1] if same else ok[-1]
    workload = {**(last.workload), "file": last.workload_file}
    return _training_claims(same, workload) + deploy_claims(deployments, workload)


def _training_claims(same: Sequence[RunRecord], workload: Mapping[str, Any]) -> list[Claim]:
    quiet = [r for r in same if not r.disturbed]
    out = []
    for check in CHECKS:
        claim = check(quiet, workload)
        if claim.verdict == NOT_MEASURED and len(quiet) < len(same):
            with_disturbed = check(same, workload)
            if with_disturbed.verdict != NOT_MEASURED:
                # Measured, but only by runs the machine disturbed: no verdict from them.
                claim = dataclasses.replace(
                    with_disturbed, verdict=INCONCLUSIVE,
                    reason="only disturbed runs measured it (another program used the CPU "
                           "while they trained); re-run on a quiet machine")
        elif claim.verdict in (HOLDS, NOT_HOLD) and _lost_trials(claim, same, quiet):
            # A configuration that lost a trial to disturbance is judged on fewer runs than
            # were asked for (one trial: step-to-step noise only), an interval narrower than
            # the run-to-run spread it must cover: no verdict is drawn from it.
            claim = dataclasses.replace(
                claim, verdict=INCONCLUSIVE,
                reason="a run it compares lost a trial to disturbance (another program used "
                       "the CPU), so its interval covers fewer trials than asked for; re-run "
                       "on a quiet machine")
        out.append(claim)
    return out


def _lost_trials(claim: Claim, same: Sequence[RunRecord],
                 quiet: Sequence[RunRecord]) -> bool:
    """Whether a run the claim compares has fewer quiet trials than trials."""
    by_id = {r.id: r for r in quiet if r.id is not None}
    for run_id in claim.run_ids:
        run = by_id.get(run_id)
        if run is not None and len(trials_of(quiet, run)) < len(trials_of(same, run)):
            return True
    return False


# -- small formatters (no import from sextant.commands: this package stays standalone) ---

def _ms_of(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds * 1e3:.1f}"


def _ms(run: RunRecord) -> str:
    return _ms_of(run.metrics.step_time_median_s)


def _mb(run: RunRecord) -> str:
    value = run.metrics.peak_rss_bytes
    return "-" if value is None else f"{value / 2**20:,.0f}"
