"""Run the pre-flight checks for real: the runs and measurements each check needs, then the
judgements of `sextant.checks.analyse`.

Runs, shared between checks (only those the selected checks need are made):
    single   one worker, S steps           -> mvp, scaling (1 worker), checkpoint reference
    dp xN    N workers, S steps            -> versions, loader, balance, scaling (N)
    dp xk    k = 2..N-1, S steps           -> scaling
    save     single, S steps, checkpoint every K = S // 2        -> checkpoint
    resume   single, resume from the checkpoint of step K        -> checkpoint
    gloo     all-reduce and all-gather between N processes       -> interconnect
S = the workload's steps / 10, at least warmup + 3 (or --steps).
"""

from __future__ import annotations

import dataclasses
import math
import os
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sextant.checks import analyse
from sextant.checks.result import CHECKS, SKIP, CheckResult
from sextant.core.defaults import COLLECTIVE_TIMEOUT_S, MEASUREMENT_TIMEOUT_S, RUN_TIMEOUT_S
from sextant.core.errors import RunFailed, UserError
from sextant.monitor.metrics import merged_records, steps_by_rank, write_metrics
from sextant.core.paths import DEFAULT_RUNS
from sextant.results.record import RunRecord
from sextant.strategy import Strategy
from sextant.workloads.spec import Workload

_NEEDS_SINGLE = {"mvp", "scaling", "checkpoint"}
_NEEDS_DP = {"versions", "loader", "balance", "scaling"}


@dataclass(kw_only=True)
class CheckOptions:
    workload: Workload
    framework: str = "torch"
    mode: str | None = None
    parallel: str = "dp"
    workers: int = 2
    threads: int | None = None
    steps: int | None = None
    only: tuple[str, ...] = CHECKS
    threshold_gbps: float = 10.0
    max_bytes: int = 64 * 2**20
    loader_threshold: float = 0.10
    balance_threshold: float = 0.10
    scaling_tolerance: float = 0.10
    timeout_s: float = RUN_TIMEOUT_S
    collective_timeout_s: float = COLLECTIVE_TIMEOUT_S
    cluster: str | None = None
    """Emulated cluster the runs and the interconnect measurement span."""
    runs_dir: Path = DEFAULT_RUNS
    extra_env: dict[str, str] = field(default_factory=dict)
    """Environment for the training workers (the tests set SEXTANT_TEST_FAULT here)."""


def _pipeline(workload: Workload, top: Outcome, opts: CheckOptions,
              say: Callable[[str], None]) -> dict[str, Any] | None:
    """The batch pipeline's own throughput for one rank of the run the loader check judges
    (sextant.data.probe), with the run's test faults."""
    from sextant.data.probe import pipeline_throughput

    if top.record is None:
        return None
    world = len(top.record.ranks) or opts.workers
    fault = opts.extra_env.get("SEXTANT_TEST_FAULT", os.environ.get("SEXTANT_TEST_FAULT"))
    say(f"loader: the batch pipeline alone, rank 0 of {world}")
    return pipeline_throughput(workload, world, fault=fault)


def parse_only(spec: str | None) -> tuple[str, ...]:
    if spec is None:
        return CHECKS
    names = tuple(n.strip() for n in spec.split(",") if n.strip())
    unknown = [n for n in names if n not in CHECKS]
    if unknown or not names:
        raise UserError(f"unknown check {unknown[0] if unknown else spec!r} in --only; "
                        f"allowed: {', '.join(CHECKS)}")
    return names


def check_steps(workload: Workload, steps: int | None = None) -> int:
    """Steps of the check runs: a tenth of the workload's, at least warm-up + 3."""
    floor = workload.measure.warmup_steps + 3
    if steps is not None:
        if steps < floor:
            raise UserError(f"--steps must be at least the workload's measure.warmup_steps + 3 "
                            f"({floor}). Received: {steps}")
        return steps
    return max(math.ceil(workload.steps / 10), floor)


@dataclass
class Outcome:
    record: RunRecord | None
    error: str | None = None


def run_once(workload: Workload, strategy: Strategy, opts: CheckOptions,
             on_event: Callable[[dict[str, Any]], None] | None = None,
             extra_env: dict[str, str] | None = None) -> Outcome:
    """One real run; its metrics.jsonl is written even when it fails."""
    from sextant.checkpoint import CheckpointRefused
    from sextant.runner import execute

    try:
        record = execute(workload, strategy, runs_dir=opts.runs_dir, timeout_s=opts.timeout_s,
                         collective_timeout_s=opts.collective_timeout_s,
                         on_event=on_event, cluster=opts.cluster,
                         extra_env=opts.extra_env if extra_env is None else extra_env)
    except CheckpointRefused as exc:  # the checkpoint check's finding, not a usage error
        return Outcome(None, str(exc))
    except RunFailed as exc:
        _metrics_of_latest(opts.runs_dir, strategy)
        return Outcome(None, str(exc))
    if record.run_dir is not None:  # execute always names it
        write_metrics(record.run_dir)
    return Outcome(record)


def _metrics_of_latest(runs_dir: Path, strategy: Strategy) -> None:
    slug = strategy.label.replace(" ", "-")
    dirs = sorted(runs_dir.glob(f"*-{slug}-*"), key=lambda p: p.stat().st_mtime)
    if dirs:
        try:
            write_metrics(dirs[-1])
        except Exception:  # noqa: BLE001 - a partial run's metrics are a courtesy
            pass


def rank_steps(record: RunRecord) -> dict[int, list[dict[str, Any]]]:
    return steps_by_rank(merged_records(record.run_dir)) if record.run_dir else {}


def default_mode(framework: str) -> str:
    from sextant.backends.base import get_backend

    return get_backend(framework).capabilities().modes[0]


def strategies(opts: CheckOptions) -> tuple[Strategy, list[Strategy]]:
    """(single-device strategy, [multi-worker strategies for 2..N workers])."""
    from sextant.backends import require

    mode = opts.mode or default_mode(opts.framework)
    single = Strategy(framework=opts.framework, mode=mode, threads=opts.threads)
    require(single)
    multi = [Strategy(framework=opts.framework, mode=mode, parallel=opts.parallel, workers=k,
                      threads=opts.threads) for k in range(2, opts.workers + 1)]
    for s in multi:
        require(s)
    return single, multi


def measure_interconnect(world: int, max_bytes: int, timeout: float = MEASUREMENT_TIMEOUT_S,
                         cluster: str | None = None) -> dict[str, Any]:
    """All-reduce and all-gather timings between `world` gloo processes, on loopback or one
    per host of an emulated cluster."""
    from sextant.launch.collectives import measure_collective
    from sextant.cluster import emulated
    from sextant.launch.hosts import single_host

    placement = emulated.placement(cluster, world) if cluster else single_host(world)
    keys = ("sizes_bytes", "times_s", "p10_s", "p90_s")
    measured = {op: measure_collective(op, world=world, max_bytes=max_bytes, timeout=timeout,
                                       placement=placement)
                for op in ("allreduce", "allgather")}
    where = (f"{len(set(placement.rank_host))} hosts of cluster {cluster}" if cluster
             else placement.master_addr)
    return {"world": world, "backend": "gloo", "address": where,
            "collectives": {op: {k: m[k] for k in keys} for op, m in measured.items()}}


def checkpoint_supported(strategy: Strategy) -> bool:
    """Whether sextant can checkpoint this strategy (Strategy fields and the backend's
    capability); false on a sextant without checkpointing."""
    from sextant.backends.base import get_backend

    names = {f.name for f in dataclasses.fields(Strategy)}
    if not {"checkpoint_every", "checkpoint_dir", "resume"} <= names:
        return False
    caps = get_backend(strategy.framework).capabilities()
    return strategy.parallel in getattr(caps, "checkpoint", ())


def checkpoint_workload(workload: Workload, steps: int) -> tuple[Workload, int]:
    """The workload of the save/resume runs and the step K saved. One warm-up step, so the
    resumed run's S - K >= 2 steps leave a steady-state figure."""
    measure = dataclasses.replace(workload.measure, warmup_steps=1)
    return workload.replace(steps=steps, measure=measure), max(1, steps // 2)


def save_for_resume(workload: Workload, strategy: Strategy, directory: Path, opts: CheckOptions,
                    on_event: Callable[[dict[str, Any]], None] | None = None
                    ) -> tuple[Outcome, int]:
    """Train all S steps saving every K = S // 2; keep only the checkpoint of step K."""
    w, k = checkpoint_workload(workload, workload.steps)
    save = dataclasses.replace(strategy, checkpoint_every=k, checkpoint_dir=str(directory))
    outcome = run_once(w, save, opts, on_event)
    for d in directory.glob("step-*"):
        digits = d.name[5:].split(".", 1)[0]
        if d.is_dir() and (not digits.isdigit() or int(digits) != k):
            shutil.rmtree(d, ignore_errors=True)
    return outcome, k


def resume_from(workload: Workload, strategy: Strategy, directory: Path, opts: CheckOptions,
                on_event: Callable[[dict[str, Any]], None] | None = None) -> Outcome:
    w, _ = checkpoint_workload(workload, workload.steps)
    return run_once(w, dataclasses.replace(strategy, resume=True, checkpoint_dir=str(directory)),
                    opts, on_event)


def verify_checkpoints(directory: Path) -> str | None:
    """What is wrong with the saved checkpoints, per sextant.checkpoint's manifest; None if
    they verify (or sextant has no checkpoint module)."""
    try:
        from sextant import checkpoint as ckpt
    except ImportError:
        return None
    problems = []
    for d in sorted(directory.glob("step-*")):
        if d.is_dir() and not d.name.endswith((".partial", ".stale")):
            problem = ckpt.verify(d)
            if problem:
                problems.append(f"{d.name}: {problem}")
    return "; ".join(problems) or None


def run_checkpoint_check(workload: Workload, single: Strategy, reference: Outcome | None,
                         opts: CheckOptions,
                         before_resume: Callable[[Path], None] | None = None,
                         on_event: Callable[[dict[str, Any]], None] | None = None,
                         say: Callable[[str], None] = lambda _: None) -> CheckResult:
    if not checkpoint_supported(single):
        return CheckResult(check="checkpoint", status=SKIP,
                           summary=f"not run: checkpointing not available for {single.framework}"
                                   f" ({single.label})")
    stamp = f"{time.strftime('%Y%m%d-%H%M%S')}-{time.monotonic_ns() % 10**6:06d}"
    directory = opts.runs_dir / f"checkpoint-check-{stamp}"
    directory.mkdir(parents=True, exist_ok=True)
    say(f"checkpoint: {single.label}, save at step {max(1, workload.steps // 2)}")
    saved, k = save_for_resume(workload, single, directory, opts, on_event)
    if saved.record is None:
        return analyse.check_checkpoint(None, None, None, k, error=f"saving run: {saved.error}")
    if before_resume is not None:
        before_resume(directory)
    problem = verify_checkpoints(directory)
    say(f"checkpoint: resume from step {k}")
    resumed = resume_from(workload, single, directory, opts, on_event)
    result = analyse.check_checkpoint(
        reference.record if reference else None, saved.record, resumed.record, k,
        problem=problem, error=None if resumed.record else f"resumed run: {resumed.error}")
    if result.status == "pass":
        shutil.rmtree(directory, ignore_errors=True)
    else:
        result.details["checkpoint_dir"] = str(directory)
    return result


def quiet_check(say: Callable[[str], None]) -> CheckResult:
    """What other programs use of the machine, sampled while nothing of ours runs."""
    from sextant.measure import interference

    say(f"quiet: what other programs use of the machine, over "
        f"{interference.QUIET_CHECK_S:g} s")
    sampler = interference.Sampler().start()
    time.sleep(interference.QUIET_CHECK_S)
    sampler.stop()
    return analyse.check_quiet(sampler.summary())


def interconnect_check(opts: CheckOptions, say: Callable[[str], None]) -> CheckResult:
    """The collectives between `opts.workers` processes, judged against the threshold; a
    measurement that could not run here is 'not run', one that failed is a failure."""
    if opts.workers < 2:
        return CheckResult(check="interconnect", status=SKIP,
                           summary="not run: needs --workers >= 2")
    say(f"interconnect: all-reduce and all-gather, {opts.workers} gloo processes, "
        f"1 KiB to {opts.max_bytes / 2**20:g} MiB")
    try:
        measured = measure_interconnect(opts.workers, opts.max_bytes, cluster=opts.cluster)
    except (RunFailed, OSError) as exc:
        return analyse.check_interconnect(None, opts.threshold_gbps, error=str(exc))
    except UserError as exc:
        return CheckResult(check="interconnect", status=SKIP, summary=f"not run: {exc}")
    return analyse.check_interconnect(measured, opts.threshold_gbps)


def multi_worker_checks(only: set[str], top: Outcome | None, workload: Workload,
                        opts: CheckOptions, say: Callable[[str], None]) -> list[CheckResult]:
    """versions, loader and balance: judged on one run, the widest of the sweep."""
    results = []
    for name in ("versions", "loader", "balance"):
        if name not in only:
            continue
        if top is None:
            results.append(CheckResult(check=name, status=SKIP,
                                       summary="not run: needs --workers >= 2"))
        elif name == "versions":
            results.append(analyse.check_versions(top.record, top.error))
        elif name == "loader":
            results.append(analyse.check_loader(top.record, opts.loader_threshold, top.error,
                                                pipeline=_pipeline(workload, top, opts, say)))
        else:
            results.append(analyse.check_balance(
                top.record, rank_steps(top.record) if top.record else {},
                opts.balance_threshold, top.error))
    return results


def run_checks(opts: CheckOptions, say: Callable[[str], None] = lambda _: None,
               on_event: Callable[[dict[str, Any]], None] | None = None) -> list[CheckResult]:
    """Every selected check, in CHECKS order."""
    steps = check_steps(opts.workload, opts.steps)
    workload = opts.workload.replace(steps=steps)
    if opts.workers < 1:
        raise UserError(f"--workers must be >= 1. Received: {opts.workers}")
    if workload.global_batch % opts.workers:
        raise UserError(f"global_batch {workload.global_batch} is not divisible by "
                        f"--workers {opts.workers}")
    only = set(opts.only)
    single, multi = strategies(opts)
    opts.runs_dir.mkdir(parents=True, exist_ok=True)
    results: dict[str, CheckResult] = {}

    if "quiet" in only:  # first: before the checks' own runs load the machine
        results["quiet"] = quiet_check(say)

    base: Outcome | None = None
    if only & _NEEDS_SINGLE or (not multi and only & _NEEDS_DP):
        say(f"mvp: {single.label}, {steps} steps")
        base = run_once(workload, single, opts, on_event)
        if "mvp" in only:
            results["mvp"] = analyse.check_mvp(base.record, base.error, single.label)

    if "interconnect" in only:
        results["interconnect"] = interconnect_check(opts, say)

    sweep: list[tuple[int, Outcome]] = []
    if only & _NEEDS_DP and multi:
        wanted = multi if "scaling" in only else multi[-1:]
        for strategy in wanted:
            say(f"{strategy.label}, {steps} steps")
            sweep.append((strategy.workers, run_once(workload, strategy, opts, on_event)))
    # With --workers 1 the single run stands in (balance then says it needs 2 workers).
    top = sweep[-1][1] if sweep else base
    for result in multi_worker_checks(only, top, workload, opts, say):
        results[result.check] = result
    if "scaling" in only:
        points = [(1, base.record, base.error)] if base is not None else []
        points += [(n, o.record, o.error) for n, o in sweep]
        results["scaling"] = analyse.check_scaling(points, opts.scaling_tolerance)

    if "checkpoint" in only:
        results["checkpoint"] = run_checkpoint_check(workload, single, base, opts,
                                                     on_event=on_event, say=say)
    return [results[name] for name in CHECKS if name in results]
