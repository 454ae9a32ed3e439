"""Evidence from measurement: turn run records of the results store into advisor evidence.

Comparisons are only made between runs of the same workload (same workload_hash) and, for
throughput and memory, at the same parallel strategy and worker count, so that a ratio
never mixes a 4-worker run with a single-process one. Each framework is taken at its best
execution mode (eager or compiled), the one a user would pick.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sextant.advisor.vocab import CANDIDATES, MEASURED, SOURCES
from sextant.claims import compute_units, conditions
from sextant.claims.deploy import works
from sextant.core.errors import UserError
from sextant.results.deploy import DeployRecord
from sextant.results.record import RunRecord

FRAMEWORK_CANDIDATES = {
    # DeepSpeed runs on PyTorch: without a measured DeepSpeed run, a PyTorch number is the
    # best evidence for both (see `candidates_of`: a deepspeed run replaces it).
    "torch": ("pytorch", "pytorch+deepspeed"),
    "deepspeed": ("pytorch+deepspeed",),
    "jax": ("jax",),
    "tensorflow": ("tensorflow",),
    "paddle": ("paddle",),
    "mindspore": ("mindspore",),
    "mlx": ("mlx",),
    # keras: no candidate. A Keras run measures Keras' front end (layers, fit) on another
    # framework's runtime (Strategy.keras_backend), so it stands for none of the stacks above,
    # and the advisor has no 'keras' stack: one would need its own rules (hardware, team
    # experience, migration) over three backends. Keras runs are left out of the evidence.
}
"""Results-store framework name -> candidate stacks its measurements stand for."""


def candidates_of(framework: str, measured: set[str]) -> tuple[str, ...]:
    """The candidates a framework's runs are evidence for, given the frameworks measured:
    torch stands in for pytorch+deepspeed only while no deepspeed run is among them."""
    if framework == "torch" and "deepspeed" in measured:
        return ("pytorch",)
    return FRAMEWORK_CANDIDATES[framework]

METRIC_ORDER = (
    "throughput_ratio",
    "memory_ratio",
    "peak_rss_bytes",
    "scaling_efficiency",
    "exposed_comm_share",
    "compile_time_s",
    "deploy_formats",
    "serving_latency_ratio",
)


@dataclass(kw_only=True, slots=True, frozen=True)
class Evidence:
    """One fact about one candidate stack, measured or assumed."""

    candidate: str
    """Candidate stack it is about."""
    metric: str
    """throughput_ratio (1 = fastest), memory_ratio (1 = leanest), peak_rss_bytes,
    scaling_efficiency (dp throughput / (workers x single)), exposed_comm_share,
    compile_time_s, or training_hours for the derived duration."""
    value: float
    """The number."""
    source: str
    """'measured' (on this workload by sextant), 'rule of thumb' (from the rules file) or
    'planner' (sextant's planner at the target scale)."""
    detail: str
    """How it was obtained, in one line."""
    run_ids: tuple[str, ...] = ()
    """Results-store runs it rests on (empty for rules of thumb)."""

    def __post_init__(self) -> None:
        if self.candidate not in CANDIDATES:
            raise UserError(f"evidence candidate {self.candidate!r}; allowed: "
                            f"{', '.join(CANDIDATES)}")
        if self.source not in SOURCES:
            raise UserError(f"evidence source {self.source!r}; allowed: {', '.join(SOURCES)}")
        if not math.isfinite(self.value):
            raise UserError(f"evidence {self.metric} for {self.candidate} is not finite")

    def to_dict(self) -> dict[str, Any]:
        return {
            "candidate": self.candidate,
            "metric": self.metric,
            "value": self.value,
            "source": self.source,
            "detail": self.detail,
            "run_ids": list(self.run_ids),
        }


def _number(value: float | None, *, positive: bool = True) -> float | None:
    """A figure fit for evidence: present, not negative (and not zero when `positive`)."""
    if value is None or value < 0 or (positive and value == 0):
        return None
    return value


def _geomean(values: Sequence[float]) -> float:
    return math.exp(sum(math.log(v) for v in values) / len(values))


def _ratios(runs: Sequence[RunRecord], key: str, *, best: str
            ) -> dict[str, tuple[float, tuple[str, ...], int]]:
    """Per framework: geometric-mean ratio of `key` to the best framework at matched configs.

    best='max' (throughput: ratio = value / fastest) or 'min' (memory: ratio = value /
    leanest). Returned ratios are renormalised so that the best framework is exactly 1.
    """
    configs: dict[tuple[Any, ...], dict[str, tuple[float, str]]] = {}
    for run in runs:
        value = _number(getattr(run.metrics, key))
        if value is None:
            continue
        # Never a ratio across precisions or devices.
        config = (run.workload_hash, run.strategy.parallel, run.strategy.workers,
                  *conditions(run))
        per_fw = configs.setdefault(config, {})
        held = per_fw.get(run.strategy.framework)
        better = held is None or (value > held[0] if best == "max" else value < held[0])
        if better:
            per_fw[run.strategy.framework] = (value, str(run.id))
    collected: dict[str, list[float]] = {}
    ids: dict[str, set[str]] = {}
    for config in sorted(configs):
        per_fw = configs[config]
        if len(per_fw) < 2:
            continue  # nothing to compare against in this configuration
        reference = (max if best == "max" else min)(v for v, _ in per_fw.values())
        config_ids = {run_id for _, run_id in per_fw.values()}
        for framework, (value, _) in per_fw.items():
            collected.setdefault(framework, []).append(value / reference)
            ids.setdefault(framework, set()).update(config_ids)
    if not collected:
        return {}
    means = {fw: _geomean(values) for fw, values in collected.items()}
    # Different frameworks may lead in different configurations; renormalise so the best
    # overall is 1 and the others are relative to it.
    top = (max if best == "max" else min)(means.values())
    return {
        fw: (means[fw] / top, tuple(sorted(ids[fw])), len(collected[fw])) for fw in means
    }


def hardware_class(run: RunRecord) -> str:
    """The advisor's hardware family a run was measured on: 'cpu', or the GPU's vendor
    family ('nvidia', 'amd'), from the run's device and accelerator name."""
    _, device, accelerator = conditions(run)
    if device != "gpu":
        return "cpu"
    name = accelerator.lower()
    return "amd" if ("amd" in name or "instinct" in name) else "nvidia"


def applicable(runs: Sequence[RunRecord], hardware: str | None
               ) -> tuple[list[RunRecord], str | None]:
    """(the runs measured on the target's hardware family, a note about the others): a
    measurement is evidence only for the hardware class it was taken on."""
    if hardware is None:
        return list(runs), None
    kept = [r for r in runs if hardware_class(r) == hardware]
    others = sorted({hardware_class(r) for r in runs} - {hardware})
    if not others:
        return kept, None
    where = " and ".join("CPU cores" if c == "cpu" else f"{c} GPUs" for c in others)
    return kept, (f"{len(runs) - len(kept)} run(s) measured on {where}, not your target "
                  f"({hardware}): shown, not scored; the planner's estimate for the target "
                  "stands in (sextant advise --plan, from sextant plan --json)")


def evidence_from_runs(runs: Sequence[RunRecord]) -> list[Evidence]:
    """Measured evidence per candidate stack from results-store run records: throughput
    (tokens/s, the run's total over all workers), peak RSS per rank, compile time (as
    compile_time_s) and exposed communication share. Runs of frameworks sextant has no
    candidate for are ignored; missing figures are skipped. The result is sorted (candidate,
    metric), so the same runs always give the same evidence.
    """
    # Failed runs carry no trustworthy figures; unknown frameworks have no candidate.
    runs = [run for run in runs if run.strategy.framework in FRAMEWORK_CANDIDATES
            and run.status == "ok"]
    found: list[tuple[str, str, float, str, tuple[str, ...]]] = []

    # Speed is judged on undisturbed runs only (another program shared the CPU during a
    # disturbed one: sextant.measure.interference), as the report's verdicts are; memory is
    # not a matter of CPU time, so every run counts for it.
    timed = [run for run in runs if not run.metrics.disturbed]
    for fw, (ratio, ids, n) in _ratios(timed, "tokens_per_s", best="max").items():
        found.append((fw, "throughput_ratio", ratio,
                      f"{ratio:.2f}x the fastest measured stack's tokens/s "
                      f"({n} matched configuration{'s' if n != 1 else ''})", ids))
    for fw, (ratio, ids, n) in _ratios(runs, "peak_rss_bytes", best="min").items():
        found.append((fw, "memory_ratio", ratio,
                      f"{ratio:.2f}x the leanest measured stack's peak memory per rank "
                      f"({n} matched configuration{'s' if n != 1 else ''})", ids))

    by_fw: dict[str, list[RunRecord]] = {}
    for run in runs:
        by_fw.setdefault(run.strategy.framework, []).append(run)
    for fw in sorted(by_fw):
        fw_runs = by_fw[fw]
        rss = [(v, str(r.id)) for r in fw_runs
               if (v := _number(r.metrics.peak_rss_bytes)) is not None]
        if rss:
            value, run_id = max(rss)
            found.append((fw, "peak_rss_bytes", value,
                          f"largest per-rank peak RSS over {len(rss)} run(s): "
                          f"{value / 2**20:.0f} MiB", (run_id,)))

        fw_timed = [r for r in fw_runs if not r.metrics.disturbed]
        efficiencies, eff_ids, eff_text = _scaling(fw_timed)
        if efficiencies:
            value = statistics.median(efficiencies)
            found.append((fw, "scaling_efficiency", value,
                          f"data-parallel scaling {value:.0%} ({'; '.join(eff_text)})",
                          tuple(sorted(eff_ids))))

        shares = [(v, str(r.id)) for r in fw_timed if r.strategy.parallel != "single"
                  and (v := _number(r.metrics.exposed_comm_share, positive=False))
                  is not None]
        if shares:
            value = statistics.median(v for v, _ in shares)
            found.append((fw, "exposed_comm_share", value,
                          f"median exposed communication share {value:.0%} over "
                          f"{len(shares)} parallel run(s)", tuple(sorted(i for _, i in shares))))

        compiles = [(v, str(r.id)) for r in fw_timed if r.strategy.mode == "compiled"
                    and (v := _number(r.metrics.compile_s, positive=False))
                    is not None]
        if compiles:
            value = statistics.median(v for v, _ in compiles)
            found.append((fw, "compile_time_s", value,
                          f"median compile time {value:.1f} s over {len(compiles)} compiled "
                          f"run(s)", tuple(sorted(i for _, i in compiles))))

    measured = {run.strategy.framework for run in runs}
    evidence = [
        Evidence(candidate=cand, metric=metric, value=value, source=MEASURED, detail=detail,
                 run_ids=ids)
        for fw, metric, value, detail, ids in found
        for cand in candidates_of(fw, measured)
    ]
    evidence.sort(key=lambda e: (CANDIDATES.index(e.candidate), METRIC_ORDER.index(e.metric)))
    return evidence


def evidence_from_deployments(rows: Sequence[DeployRecord], target: str) -> list[Evidence]:
    """Measured evidence from one deployment matrix (`sextant compare deploy`): per candidate
    stack, how many of its framework's artifacts reach the team's deployment `target`
    and work (exported, served, the trainer's logits; sextant.claims.deploy.works). A
    framework whose rows were all unavailable here gives no evidence."""
    by_fw: dict[str, list[DeployRecord]] = {}
    for row in rows:
        if row.framework in FRAMEWORK_CANDIDATES:
            by_fw.setdefault(row.framework, []).append(row)
    evidence = []
    fastest: dict[str, DeployRecord] = {}
    for fw, fw_rows in sorted(by_fw.items()):
        if all(r.status == "unavailable" for r in fw_rows):
            continue
        reach = [r for r in fw_rows if works(r) and target in r.targets]
        detail = (f"{len(reach)} working artifact(s) reach {target}: "
                  + (", ".join(r.format for r in reach) or "none")
                  + f" (of {len(fw_rows)} formats tried)")
        for cand in FRAMEWORK_CANDIDATES[fw]:
            evidence.append(Evidence(candidate=cand, metric="deploy_formats",
                                     value=float(len(reach)), source=MEASURED, detail=detail,
                                     run_ids=tuple(f"deployment {r.id}" for r in reach)))
        timed = [r for r in reach if r.latency_at(1) is not None and not r.quantized]
        if timed:
            fastest[fw] = min(timed, key=_latency)
    # Serving cost is relative, as training throughput is: the measured model is not the
    # one the team will serve, but the stacks' artifacts ran the same model side by side.
    best = min((_latency(r) for r in fastest.values()), default=None)
    for fw, row in sorted(fastest.items()):
        ratio = _latency(row) / best if best else 1.0
        for cand in FRAMEWORK_CANDIDATES[fw]:
            evidence.append(Evidence(
                candidate=cand, metric="serving_latency_ratio", value=ratio, source=MEASURED,
                detail=f"{row.format} at batch 1: {_latency(row) * 1e3:.2f} ms, {ratio:.2f}x "
                       f"the fastest stack's artifact for {target}",
                run_ids=(f"deployment {row.id}",)))
    return evidence


def _latency(row: DeployRecord) -> float:
    lat = row.latency_at(1)
    return lat.p50_s if lat is not None else float("inf")


def load_measured_deployments(path: Path) -> list[DeployRecord]:
    """The latest deployment matrix in the results store at `path` ([] without one)."""
    from sextant.results.store import ResultsStore

    if not path.is_file():
        return []
    with ResultsStore(path) as store:
        group = store.latest_deployment_group()
        return store.deployments(group_id=group) if group is not None else []


def _scaling(runs: Sequence[RunRecord]) -> tuple[list[float], set[str], list[str]]:
    """Scaling efficiency per (workload, mode) at the largest measured worker count: the
    throughput per unit of compute against the single process's (the same total compute
    gives 100 % when nothing is lost), never N workers against one holding all the cores."""
    single: dict[tuple[str, str], tuple[float, str]] = {}
    parallel: dict[tuple[str, str], tuple[int, float, str]] = {}
    for run in runs:
        tps = _number(run.metrics.tokens_per_s)
        if tps is None:
            continue
        key = (run.workload_hash, run.strategy.mode)
        workers = run.strategy.workers
        per_unit = tps / compute_units(conditions(run)[1], workers,
                                        run.metrics.threads_per_worker)
        if run.strategy.parallel == "single" or workers == 1:
            if key not in single or per_unit > single[key][0]:
                single[key] = (per_unit, str(run.id))
        else:
            held = parallel.get(key)
            if held is None or (workers, per_unit) > held[:2]:
                parallel[key] = (workers, per_unit, str(run.id))
    values: list[float] = []
    ids: set[str] = set()
    text: list[str] = []
    for key in sorted(set(single) & set(parallel)):
        base, base_id = single[key]
        workers, per_unit, run_id = parallel[key]
        efficiency = per_unit / base
        values.append(efficiency)
        ids.update((base_id, run_id))
        text.append(f"{key[1]} x{workers}: {efficiency:.0%}")
    return values, ids, text


def load_measured_runs(path: Path) -> tuple[list[RunRecord], str | None]:
    """Runs of the results store at `path`, or ([], one-line reason) when there are none to
    read."""
    from sextant.results.store import ResultsStore

    if not path.is_file():
        return [], (f"No measured evidence: no results store at {path}; advice rests on rules "
                    "of thumb.")
    with ResultsStore(path) as store:
        runs = store.runs()
    if not runs:
        return [], f"No measured evidence: {path} holds no runs yet."
    return runs, None
