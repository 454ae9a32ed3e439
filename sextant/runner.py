"""Run one strategy on one workload: launch the workers, turn their raw measurements into
the run's figures, store the record.

Definitions (docs/methodology.md explains each):
- the job's time for step i is the slowest rank's time for that step (ranks wait for each
  other at the gradient all-reduce, so this is what a user pays for);
- steady state = steps after `measure.warmup_steps`; figures are median, p10, p90, count;
- the loss of step i is the mean of the ranks' local losses (equal shards, so this equals the
  loss over the global batch).
"""

from __future__ import annotations

import contextlib
import functools
import json
import re
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, NoReturn

import numpy as np

from sextant.checkpoint import resume_plan
from sextant.cluster import emulated
from sextant.core.defaults import COLLECTIVE_TIMEOUT_S, RUN_TIMEOUT_S
from sextant.core.errors import RunFailed, UserError
from sextant.core.fsutil import atomic_write_json
from sextant.workloads.init import count_params, flops_per_step
from sextant.launch.local import Launcher, launch
from sextant.measure.interference import Sampler
from sextant.measure.stats import paired_median_difference, summarize
from sextant.contracts import RankResult, result_problem
from sextant.results.record import RunIdentity, RunRecord
from sextant.results.store import ResultsStore, StoreLocked
from sextant.strategy import Strategy
from sextant.workloads.spec import LlamaSpec, Workload, model_features

RECORD_FILE = "record.json"
"""A finished run's record, kept in its run directory when the database stayed locked."""
NAME_SLUG_CHARS = 40


def aggregate(workload: Workload, strategy: Strategy, ranks: list[RankResult]
              ) -> dict[str, Any]:
    """The run's metrics from its ranks' raw results."""
    warm = workload.measure.warmup_steps
    job_times = np.max([r["step_times_s"] for r in ranks], axis=0)
    steady = summarize(job_times[warm:])
    # A run resumed within `warm` steps of its end has no steady-state step: its timing
    # figures are None (shown as '-'), the rest of the record is kept.
    median = steady["median"]
    losses = np.mean([r["losses"] for r in ranks], axis=0)
    samples = workload.global_batch
    tokens = samples * workload.tokens_per_sample
    flops = flops_per_step(workload.model, samples)
    data_wait = (float(np.max([np.median(r["data_times_s"][warm:]) for r in ranks]))
                 if median is not None else None)
    first = float(job_times[0]) if len(job_times) else None

    def per_second(amount: float) -> float | None:
        return amount / median if median else None

    metrics: dict[str, Any] = {
        "params": count_params(workload.model),
        "step_time_median_s": median,
        "step_time_p10_s": steady["p10"],
        "step_time_p90_s": steady["p90"],
        "step_time_mean_s": steady["mean"],
        "steps_timed": steady["n"],
        "first_step_s": first,
        "compile_s": max(0.0, first - median) if first is not None and median else None,
        **_edit_run(ranks[0].get("startup") or {}),
        "samples_per_s": per_second(samples),
        "tokens_per_s": per_second(tokens),
        "tokens_per_step": tokens,
        "flops_per_step": flops,
        "achieved_flops_per_s": per_second(flops),
        "peak_rss_bytes": max(r["peak_rss_bytes"] for r in ranks),
        "peak_rss_total_bytes": sum(r["peak_rss_bytes"] for r in ranks),
        "data_wait_median_s": data_wait,
        "data_wait_share": data_wait / median if data_wait is not None and median else None,
        "final_loss": float(losses[-1]) if len(losses) else None,
        "threads_per_worker": ranks[0]["fingerprint"].get("threads"),
        "resumed_from_step": ranks[0].get("start_step", 0),
        "checkpoint_save_median_s": (float(np.median(ranks[0]["checkpoint_times_s"]))
                                     if ranks[0].get("checkpoint_times_s") else None),
        "exposed_comm_s": None,
        "exposed_comm_share": None,
    }
    if any("device_peak_bytes" in r for r in ranks):
        metrics["device_peak_bytes"] = max(r.get("device_peak_bytes", 0) for r in ranks)
    metrics.update(conditions_of(workload, strategy, ranks, median))
    sync = [r["sync_step_times_s"] for r in ranks]
    nosync = [r["nosync_step_times_s"] for r in ranks]
    if all(sync) and all(nosync):
        sync_job = np.max(sync, axis=0)
        nosync_job = np.max(nosync, axis=0)
        exposed = paired_median_difference(sync_job, nosync_job)
        sync_median = float(np.median(sync_job))
        metrics.update(
            exposed_comm_s=exposed,
            exposed_comm_share=exposed / sync_median if exposed is not None else None,
            sync_step_median_s=sync_median,
            nosync_step_median_s=float(np.median(nosync_job)),
            comm_pairs=len(sync_job),
        )
    # After the all-reduce every rank holds the same gradients, so rank 0's norm is the job's.
    return {"metrics": metrics, "losses": [float(x) for x in losses],
            "grad_norms": [float(x) for x in ranks[0]["grad_norms"]]}


def _edit_run(startup: dict[str, Any]) -> dict[str, float | None]:
    """The edit-run loop of rank 0: process start to its first finished step, and its parts
    (the framework's import; set-up: building the model, placing it, the rendezvous; the
    first step, tracing and compilation included, is first_step_s)."""
    start, loop, first = (startup.get(k) for k in ("process_start_time", "loop_start_time",
                                                   "first_step_end_time"))
    import_s = startup.get("import_s")
    total = first - start if first is not None and start is not None else None
    setup = (loop - start - (import_s or 0.0)
             if loop is not None and start is not None else None)
    return {"time_to_first_step_s": total, "import_s": import_s, "setup_s": setup}


def conditions_of(workload: Workload, strategy: Strategy, ranks: list[RankResult],
                  step_s: float | None) -> dict[str, Any]:
    """What a run can be compared with: where it computed, on which accelerator, in the
    precision the framework reported using (not only the one asked for); on an accelerator,
    the MFU against the catalogue's peak, and for one device the planner's predicted step."""
    fp = ranks[0]["fingerprint"]
    effective = (fp.get("precision") or {}).get("effective") or strategy.precision
    out: dict[str, Any] = {"device": strategy.device, "accelerator": fp.get("gpu"),
                           "effective_precision": effective}
    if strategy.device != "gpu":
        return out
    from sextant.planner.accelerator_run import mfu, predicted_step_s

    devices = strategy.workers * strategy.devices_per_worker
    flops = flops_per_step(workload.model, workload.global_batch) / devices  # per device
    figure = mfu(flops, step_s, fp.get("gpu"), effective)
    from sextant.planner.version import PLANNER_VERSION, catalogue_hash

    out.update(mfu=figure["mfu"], mfu_note=figure["note"], peak_flops=figure["peak_flops"],
               planner_version=PLANNER_VERSION, catalogue_hash=catalogue_hash())
    if devices == 1:
        predicted = predicted_step_s(workload.to_dict(), fp.get("gpu"), effective,
                                     compiled=strategy.mode == "compiled")
        out["planner_step_s"] = predicted
        out["planner_error"] = (predicted / step_s - 1) if predicted and step_s else None
    return out


def rank_summaries(workload: Workload, ranks: list[RankResult]) -> list[dict[str, Any]]:
    warm = workload.measure.warmup_steps
    out = []
    for r in ranks:
        out.append({
            "rank": r["rank"],
            "step_time": summarize(r["step_times_s"][warm:]),
            "step_times_s": r["step_times_s"],
            "data_wait_median_s": (float(np.median(r["data_times_s"][warm:]))
                                   if len(r["data_times_s"]) > warm else None),
            "rows_per_step": r.get("rows_per_step"),
            "start_step": r.get("start_step", 0),
            "sync_step_times_s": r.get("sync_step_times_s", []),
            "nosync_step_times_s": r.get("nosync_step_times_s", []),
            "checkpoint_times_s": r.get("checkpoint_times_s", []),
            "memory_accounting": r.get("memory_accounting"),
            "comm": r.get("comm"),
            "final_params_sha256": r.get("final_params_sha256"),
            "peak_rss_bytes": r["peak_rss_bytes"],
            "rss_start_bytes": r.get("rss_start_bytes"),
            "local_losses": r["losses"],
            "fingerprint": r["fingerprint"],
            "details": r.get("details", {}),
        })
    return out


def run_dir_name(workload: Workload, strategy: Strategy) -> str:
    """`<time>-<workload>-<strategy>-<nonce>`, with the workload name reduced to a short safe
    slug: names are free text, paths are not (no '/', '..', or 300-character components)."""
    stamp = time.strftime("%Y%m%d-%H%M%S")
    name = re.sub(r"[^A-Za-z0-9_.-]+", "-", workload.name).strip(".-")[:NAME_SLUG_CHARS]
    slug = strategy.label.replace(" ", "-")
    return f"{stamp}-{name or 'workload'}-{slug}-{time.monotonic_ns() % 10**6:06d}"


def check_workload_fits(workload: Workload, strategy: Strategy) -> None:
    """The workload runs under the strategy: the backend's model code has every part the
    model uses, and the global batch splits over the replicas, micro-batches and stages."""
    check_model_features(workload, strategy)
    dims = strategy.dims()
    if workload.global_batch % dims.dp:
        raise UserError(
            f"global_batch {workload.global_batch} is not divisible by the "
            f"{dims.dp} data-parallel replicas of {strategy.label}"
        )
    rows = workload.global_batch // dims.dp
    if rows % dims.grad_accum:
        raise UserError(
            f"--grad-accum {dims.grad_accum} does not divide the {rows} rows each replica "
            f"gets (global_batch {workload.global_batch} / {dims.dp} replicas); "
            f"use a divisor of {rows}"
        )
    if dims.tp > 1 or dims.pp > 1:
        check_model_parallel(workload, strategy)


def check_model_features(workload: Workload, strategy: Strategy) -> None:
    """The backend's model code has every optional part the workload's model uses."""
    from sextant.backends.base import get_backend

    if workload.finetune.lora and (strategy.parallel not in ("single", "dp")
                                   or strategy.precision != "fp32"):
        raise UserError(f"finetune.method = 'lora' runs with --parallel single or dp in fp32 "
                        f"so far. Received: {strategy.label}")
    if workload.data.instruction and (strategy.parallel != "single"
                                      or strategy.grad_accum != 1):
        # Each rank (or micro-batch) would average over its own response tokens, and the
        # mean of those means is not the global batch's mean when their counts differ.
        raise UserError(f"instruction data (a loss over response tokens only) runs with "
                        f"--parallel single and no --grad-accum so far. Received: "
                        f"{strategy.label}")
    needed = model_features(workload.model, workload.finetune.lora,
                            workload.data.instruction, workload.finetune.base_dtype == "bf16")
    if not needed:
        return
    have = get_backend(strategy.framework).capabilities().model_features
    missing = [f for f in needed if f not in have]
    if missing:
        what = {"qkv_bias": "query/key/value biases (Qwen2's)",
                "tied_gpt_head": "GPT output head tied to the embedding (GPT-2's)",
                "lora": "LoRA adapters (finetune.method = 'lora')",
                "lora_gpt": "LoRA adapters on the gpt family",
                "bf16_base": "bf16 frozen base (finetune.base_dtype = 'bf16')",
                "masked_loss": "loss that leaves prompt tokens out (data.format = "
                               "'instruction')"}
        raise UserError(f"{strategy.framework}'s model code has no {what[missing[0]]}; "
                        f"workload {workload.name!r} needs it. Frameworks that have it: "
                        + ", ".join(_with_feature(missing[0])))


def _with_feature(feature: str) -> list[str]:
    from sextant.backends.base import REGISTRY, get_backend

    return [f for f in REGISTRY if feature in get_backend(f).capabilities().model_features]


def check_model_parallel(workload: Workload, strategy: Strategy) -> None:
    """The model splits the way tensor / pipeline parallelism asks (one line otherwise)."""
    model = workload.model
    if not isinstance(model, LlamaSpec):
        raise UserError(
            f"parallel {strategy.parallel!r} splits a Llama-shaped model (separate q/k/v "
            f"heads, SwiGLU); workload {workload.name!r} is a {model.family} model: use "
            "--workload llama-tiny or another llama-family workload")
    tp, pp = strategy.tp, strategy.pp
    for name, value in (("n_heads", model.n_heads), ("n_kv_heads", model.n_kv_heads),
                        ("d_ff", model.d_ff)):
        if value % tp:
            raise UserError(f"--tp {tp} must divide model.{name} ({value}): each "
                            "tensor-parallel rank holds an equal share")
    if model.n_layers % pp:
        raise UserError(f"--pp {pp} must divide model.n_layers ({model.n_layers}): each stage "
                        "holds an equal share of the blocks")
    if pp > 1 and model.tie_embeddings:
        raise UserError("parallel 'pp' with tied embeddings is not supported: the embedding "
                        "(first stage) and the head (last stage) would share one matrix "
                        "across stages; set model.tie_embeddings = false")
    rows = workload.global_batch // strategy.replicas
    if rows % strategy.microbatches:
        raise UserError(
            f"--microbatches {strategy.microbatches} does not divide the {rows} rows each "
            f"pipeline gets (global_batch {workload.global_batch} / {strategy.replicas} "
            f"replicas); use a divisor of {rows}")


def execute(
    workload: Workload,
    strategy: Strategy,
    *,
    runs_dir: Path,
    store: ResultsStore | None = None,
    group_id: str | None = None,
    on_event: Callable[[dict[str, Any]], None] | None = None,
    timeout_s: float = RUN_TIMEOUT_S,
    collective_timeout_s: float = COLLECTIVE_TIMEOUT_S,
    extra_env: dict[str, str] | None = None,
    cluster: str | None = None,
    launcher: Launcher | None = None,
    workload_file: str | None = None,
    trial: tuple[int, int] | None = None,
) -> RunRecord:
    """Launch, aggregate, store; returns the run record (with `id` when stored).

    `trial` = (index from 1, of how many) when the run is one of repeated trials (stored in
    the metrics). While ranks started here train, the rest of the machine is sampled
    (sextant.measure.interference): the summary goes to the fingerprint, and a run over the
    thresholds is stored with metrics.disturbed = true.

    The ranks start on this machine, or on the hosts of emulated `cluster`, unless another
    `launcher` (Slurm, a torchrun-style join) starts them.

    `workload_file` is the path the user gave (the report's reproduce commands name it). A
    run that diverges is stored with status 'diverged' before its RunFailed propagates."""
    check_workload_fits(workload, strategy)
    resume_step = _resume_step(workload, strategy)
    run_dir = runs_dir / run_dir_name(workload, strategy)
    identity = RunIdentity(
        strategy=strategy, workload=workload.to_dict(), workload_hash=workload.content_hash(),
        workload_file=workload_file, created_at=time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        group_id=group_id, run_dir=str(run_dir))
    sampler = Sampler() if launcher is None else None  # other launchers: ranks elsewhere
    steps_seen: list[float] = []

    def on_rank_event(event: dict[str, Any]) -> None:
        if event.get("event") == "step":
            steps_seen.append(time.monotonic())
        if on_event is not None:
            on_event(event)

    try:
        place = functools.partial(emulated.placement, cluster) if cluster else None
        start = launcher or functools.partial(launch, place=place)
        # Only with --resume: a launcher of one's own need not know resume_step.
        resumed = {"resume_step": resume_step} if resume_step is not None else {}
        with _sampling(sampler):
            ranks = start(workload, strategy, run_dir, timeout_s=timeout_s,
                          collective_timeout_s=collective_timeout_s, on_event=on_rank_event,
                          extra_env=extra_env, **resumed)
        for rank, result in enumerate(ranks):
            wrong = result_problem(result)
            if wrong is not None:
                raise RunFailed(f"{strategy.label}: rank {result.get('rank', rank)} returned a "
                                f"result that is not a RankResult ({wrong})")
    except RunFailed as exc:
        _keep_failed(exc, store, identity, workload, run_dir)
    except KeyboardInterrupt as exc:  # Ctrl-C, SIGTERM, SIGHUP: the workers are stopped
        if store is not None:
            keep(store, stopped_record(identity, workload, run_dir, "interrupted",
                                       f"stopped by {exc or 'SIGINT'}"))
        raise
    figures = aggregate(workload, strategy, ranks)
    metrics = figures["metrics"]
    fingerprint = {**ranks[0]["fingerprint"], "network": network(cluster, ranks)}
    if sampler is not None:
        window = (steps_seen[0], steps_seen[-1]) if len(steps_seen) >= 2 else None
        fingerprint["interference"] = sampler.summary(window)
        metrics["disturbed"] = fingerprint["interference"]["disturbed"]
    if trial is not None:
        metrics["trial"], metrics["trials"] = trial
    record = identity.record(status="ok", metrics=metrics, losses=figures["losses"],
                             grad_norms=figures["grad_norms"],
                             ranks=rank_summaries(workload, ranks), fingerprint=fingerprint)
    if store is not None:
        record = record.replace(id=keep(store, record))
    return record


def _resume_step(workload: Workload, strategy: Strategy) -> int | None:
    """The checkpoint step every rank resumes from (None: a fresh start), with the
    checkpoint plan's warnings and the step said on stderr."""
    warnings, resume_step = resume_plan(workload, strategy)
    for warning in warnings:
        sys.stderr.write(f"sextant: warning: {warning}\n")
    if resume_step:
        sys.stderr.write(f"sextant: resuming from checkpoint step-{resume_step:08d} in "
                         f"{strategy.checkpoint_dir}\n")
    return resume_step


@contextlib.contextmanager
def _sampling(sampler: Sampler | None) -> Iterator[None]:
    """The rest of the machine sampled while the ranks train (when they train here)."""
    if sampler is None:
        yield
        return
    sampler.start()
    try:
        yield
    finally:
        sampler.stop()


def _keep_failed(exc: RunFailed, store: ResultsStore | None, identity: RunIdentity,
                 workload: Workload, run_dir: Path) -> NoReturn:
    """Store a failed run (status 'failed', or 'diverged' with its first non-finite step),
    then raise its RunFailed, naming the run directory."""
    if exc.run_dir is None:  # a launcher that did not say: the directory it was given
        exc.run_dir = run_dir
    diverged = diverged_record(identity, workload, run_dir)
    if store is None:
        raise exc
    if diverged is None:
        keep(store, stopped_record(identity, workload, run_dir, "failed", str(exc)))
        raise exc
    raise RunFailed(f"{exc}; stored as run {keep(store, diverged)} (status diverged)",
                    run_dir=run_dir) from None


def network(cluster: str | None, ranks: list[RankResult]) -> dict[str, Any]:
    """The network the ranks talked over, stored with the run's environment fingerprint."""
    hosts = sorted({str(r["fingerprint"].get("hostname")) for r in ranks})
    if cluster is None:  # one machine, or real hosts (Slurm, torchrun-style)
        return {"kind": "loopback" if len(hosts) == 1 else "hosts", "hosts": hosts}
    c = emulated.load(cluster)
    fit = emulated.link_fit(c.name)
    return {"kind": "emulated", "cluster": c.name, "hosts": hosts,
            "allreduce_fit": ({k: fit[k] for k in ("alpha_s", "beta_s_per_byte")}
                              if fit else None),
            "link_bit_s": c.link.rate_bit_s, "latency_s": c.link.latency_s, "loss": c.link.loss}


def stopped_record(identity: RunIdentity, workload: Workload, run_dir: Path, status: str,
                   reason: str) -> RunRecord:
    """The record of a run that did not finish: why, and how far its slowest rank got."""
    steps = []
    for path in run_dir.glob("rank*.events.jsonl"):
        with open(path, errors="replace") as f:
            steps.append(sum(1 for line in f if '"event": "step"' in line))
    return identity.record(status=status, metrics={
        "params": count_params(workload.model), "final_loss": None, "error": reason,
        "steps_done": min(steps, default=0)})


def diverged_record(identity: RunIdentity, workload: Workload, run_dir: Path
                    ) -> RunRecord | None:
    """The record of a run stopped by a non-finite loss or gradient norm (the first rank's
    report, see measure.loop.check_finite), or None if no rank reported one."""
    reports = sorted(run_dir.glob("rank*.diverged.json"))
    if not reports:
        return None
    first = min((json.loads(p.read_text()) for p in reports), key=lambda r: r["step"])
    return identity.record(
        status="diverged",
        metrics={"params": count_params(workload.model), "final_loss": None,
                 "diverged_at_step": first["step"], "diverged_rank": first["rank"],
                 "diverged_value": first["what"]},
        losses=first["losses"], grad_norms=first["grad_norms"])


def keep(store: ResultsStore, record: RunRecord) -> int:
    """Store the record; if the database stays locked, keep it beside the run's logs instead
    (`sextant runs import` adds it later) and say so in a one-line error."""
    try:
        return store.add(record)
    except StoreLocked as exc:
        kept = Path(record.run_dir or ".") / RECORD_FILE
        atomic_write_json(kept, record.to_dict())
        raise UserError(f"{exc}; the finished run was kept in {kept}: add it with "
                        f"'sextant runs import {kept} --db {store.path}'") from None
