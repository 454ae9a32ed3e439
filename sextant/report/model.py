"""Everything the report shows, as one typed JSON-able value built from run records.

The HTML page, the Markdown file and `--format json` all render this one value (its types:
sextant.report.types), so the three formats never disagree. Fields missing from a run record (older stores, constructed records)
come out as None and are shown as '-'.
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping, Sequence
from typing import Any

from sextant import __version__
from sextant.claims import (
    HOLDS,
    NOT_HOLD,
    NOT_MEASURED,
    ClaimDict,
    check_claims,
    compute_units,
    conditions,
    unequal,
)
from sextant.measure.intervals import (
    CONFIDENCE,
    INCONCLUSIVE,
    distinguishable,
    speedup_interval,
)
from sextant.measure.agreement import FP32_ATOL, MIXED_FACTOR, mixed_agreement
from sextant.measure.stats import max_loss_diff
from sextant.results.deploy import DeployRecord
from sextant.report.types import (
    CommRow,
    CompileRow,
    Deployment,
    DeployRow,
    Environment,
    Headline,
    LayoutRow,
    Memory,
    MemoryRank,
    Parity,
    ParityRow,
    PlannedPoint,
    PlannedScaling,
    Reason,
    Recommendation,
    Report,
    RunRow,
    Scaling,
    ScalingHeadline,
    ScalingPoint,
    ScalingSeries,
    Summary,
)
from sextant.results.record import RankSummary, RunRecord

MODEL_STATE_BYTES_PER_PARAM = 16
"""fp32 weights, gradients and Adam's two moments: 4 x 4 bytes per parameter."""
PROFILE_HINT = "sextant report --profile examples/profiles/startup-nvidia-pytorch.toml"
NO_CALIBRATION_NOTE = ("The planner's prediction is not drawn: this machine is not calibrated "
                       "(run 'sextant calibrate', then 'sextant report').")


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else seconds * 1e3


def deploy_row(r: DeployRecord) -> DeployRow:
    b1 = r.latency_at(1)
    bn = max(r.latency, key=lambda lat: lat.batch, default=None)
    loss = (r.loss_artifact - r.loss_reference
            if r.loss_artifact is not None and r.loss_reference is not None else None)
    return {
        "label": r.label, "framework": r.framework, "format": r.format, "runtime": r.runtime,
        "status": r.status, "error": r.error, "parity": r.parity, "max_rel": r.max_rel,
        "argmax_agree": r.argmax_agree, "loss_change": loss, "probe": r.probe,
        "probe_detail": r.probe_detail, "generation_match": r.generation_match,
        "b1_ms": _ms(b1.p50_s) if b1 else None, "b1_low_ms": _ms(b1.low_s) if b1 else None,
        "b1_high_ms": _ms(b1.high_s) if b1 else None,
        "bn_ms": _ms(bn.p50_s) if bn and bn.batch != 1 else None,
        "bn_batch": bn.batch if bn and bn.batch != 1 else None,
        "cold_start_s": r.cold_start_s,
        "size_mb": None if r.size_bytes is None else r.size_bytes / 1e6,
        "rss_mb": None if r.peak_rss_bytes is None else r.peak_rss_bytes / 2**20,
        "targets": list(r.targets),
    }


DEPLOY_COLUMNS = ("artifact", "status", "parity (max rel)", "other shape", "generation",
                  "batch 1 ms [95% CI]", "batch N ms", "cold start s", "MB", "RSS MB")


def deploy_cells(r: DeployRow) -> tuple[Any, ...]:
    if r["status"] != "ok":
        return (r["label"], r["status"], r["error"] or "", *["-"] * 7)
    parity = (f'{r["parity"]} ({_loss_change(r["loss_change"])})' if r["parity"] == "quantized"
              else f'{r["parity"]} ({r["max_rel"]:.1e})' if r["max_rel"] is not None
              else "-")
    b1 = (f'{r["b1_ms"]:.2f}' + (f' [{r["b1_low_ms"]:.2f}-{r["b1_high_ms"]:.2f}]'
                                  if r["b1_low_ms"] is not None and r["b1_high_ms"] is not None
                                  else "")) if r["b1_ms"] is not None else "-"
    bn = f'{r["bn_ms"]:.2f} (b{r["bn_batch"]})' if r["bn_ms"] is not None else "-"
    return (r["label"], "ok", parity, r["probe"] or "-",
            {True: "same", False: "differs", None: "-"}[r["generation_match"]], b1, bn,
            f'{r["cold_start_s"]:.2f}' if r["cold_start_s"] is not None else "-", f'{r["size_mb"]:.2f}' if r["size_mb"] is not None
            else "-", f'{r["rss_mb"]:.0f}' if r["rss_mb"] is not None else "-")


def _loss_change(v: float | None) -> str:
    return "-" if v is None else f"held-out loss {v:+.4f}"


def _deployment(records: Sequence[DeployRecord]) -> Deployment | None:
    if not records:
        return None
    ok = [r for r in records if r.status == "ok"]
    matched = sum(r.parity == "match" for r in ok)
    quantized = sum(r.parity == "quantized" for r in ok)
    failed = sum(r.status == "failed" for r in records)
    missing = sum(r.status == "unavailable" for r in records)
    parts = [f"{matched} of {len(records)} artifacts serve the trainer's logits"]
    parts += [f"{n} {what}" for n, what in (
        (len(ok) - matched - quantized, "mismatched"), (quantized, "quantized"),
        (failed, "failed"), (missing, "not available here")) if n]
    return {"source_run": records[0].source_run, "params_sha256": records[0].params_sha256,
            "threads": records[0].threads, "rows": [deploy_row(r) for r in records],
            "summary": "; ".join(parts)}


def _throughput(run: RunRecord) -> tuple[float | None, float | None, float | None]:
    """tokens/s median and its range from the step-time p90 (low) and p10 (high)."""
    tps, med = run.metrics.tokens_per_s, run.metrics.step_time_median_s
    p10, p90 = run.metrics.step_time_p10_s, run.metrics.step_time_p90_s
    if tps is None or not med:
        return tps, None, None
    return tps, (tps * med / p90 if p90 else None), (tps * med / p10 if p10 else None)


def _run_row(run: RunRecord, ref: RunRecord, index: int) -> RunRow:
    tps, tps_lo, tps_hi = _throughput(run)
    med = run.metrics.step_time_median_s
    ref_med = ref.metrics.step_time_median_s
    ref_losses = ref.finite_losses
    diff = max_loss_diff(run.finite_losses, ref_losses)
    # Never ranked against the reference under other conditions (precision, device).
    not_ranked = None if run is ref else unequal(run, ref)
    precision, device, accelerator = conditions(run)
    return {
        "id": run.id,
        "not_ranked": not_ranked,
        "effective_precision": precision,
        "device": device,
        "accelerator": accelerator or None,
        "mfu": run.metrics.mfu,
        "planner_step_s": run.metrics.planner_step_s,
        "planner_error": run.metrics.planner_error,
        "planner_stale": _planner_stale(run.metrics),
        "device_peak_bytes": run.metrics.device_peak_bytes,
        "index": index,
        "label": run.label,
        "framework": run.strategy.framework,
        "mode": run.strategy.mode,
        "parallel": run.strategy.parallel,
        "workers": run.strategy.workers,
        "replicas": run.strategy.workers * run.strategy.devices_per_worker,
        "precision": run.strategy.precision,
        "compress": run.strategy.compress,
        "threads_per_worker": run.metrics.threads_per_worker,
        "status": run.status,
        "step_time_s": {"median": med, "p10": run.metrics.step_time_p10_s,
                        "p90": run.metrics.step_time_p90_s,
                        "n": run.metrics.steps_timed},
        "tokens_per_s": {"median": tps, "low": tps_lo, "high": tps_hi},
        "speedup_vs_reference": (ref_med / med) if med and ref_med and not not_ranked else None,
        "first_step_s": run.metrics.first_step_s,
        "compile_s": run.metrics.compile_s,
        "time_to_first_step_s": run.metrics.time_to_first_step_s,
        "import_s": run.metrics.import_s,
        "setup_s": run.metrics.setup_s,
        "achieved_flops_per_s": run.metrics.achieved_flops_per_s,
        "peak_rss_bytes": run.metrics.peak_rss_bytes,
        "peak_rss_total_bytes": run.metrics.peak_rss_total_bytes,
        "data_wait_share": run.metrics.data_wait_share,
        "exposed_comm_s": run.metrics.exposed_comm_s,
        "exposed_comm_share": run.metrics.exposed_comm_share,
        "final_loss": run.metrics.final_loss,
        "max_loss_diff": None if run is ref else diff,
    }


def trial_groups(runs: Sequence[RunRecord]) -> list[list[RunRecord]]:
    """The runs grouped by configuration (label), in order of first appearance: each group
    holds a configuration's repeated trials."""
    groups: dict[str, list[RunRecord]] = {}
    for run in runs:
        groups.setdefault(run.label, []).append(run)
    return list(groups.values())


def representative(trials: Sequence[RunRecord]) -> RunRecord:
    """The trial that stands for its configuration in per-run sections: the undisturbed
    trial with the median step time (the latest trial when all were disturbed)."""
    quiet = [t for t in trials if not t.disturbed and t.status == "ok"
             and t.metrics.step_time_median_s is not None]
    if not quiet:
        return trials[-1]
    ordered = sorted(quiet, key=lambda t: t.metrics.step_time_median_s or 0.0)
    return ordered[(len(ordered) - 1) // 2]


def _usable(trials: Sequence[RunRecord]) -> list[RunRecord]:
    return [t for t in trials if t.timed]


def _trial_fields(row: RunRow, trials: Sequence[RunRecord],
                  ref_trials: Sequence[RunRecord]) -> None:
    """Add a configuration's trial counts and its speed-up interval against the reference
    (undisturbed trials only) to its row."""
    usable, ref_usable = _usable(trials), _usable(ref_trials)
    iv = (speedup_interval(ref_usable, usable)
          if usable and ref_usable and not row.get("not_ranked") else None)
    row["trials"] = len(trials)
    row["disturbed_trials"] = sum(1 for t in trials if t.disturbed)
    row["disturbed_ids"] = [t.id for t in trials if t.disturbed]
    row["interference"] = [t.fingerprint.interference.get("outside_cores_mean")
                           for t in trials]
    if iv is not None:
        row["speedup_vs_reference"] = iv[0]
    row["speedup_ci"] = {"low": iv[1] if iv else None, "high": iv[2] if iv else None,
                         "confidence": CONFIDENCE}


def _colour_index(rows: list[RunRow]) -> None:
    seen: dict[str, int] = {}
    for row in rows:
        row["shade"] = seen.get(row["framework"], 0)
        seen[row["framework"]] = row["shade"] + 1


def _anchor(runs: Sequence[RunRecord], ref: RunRecord, precision: str
            ) -> RunRecord | None:
    """The reference configuration's run in `precision` (same framework, mode, strategy and
    device), the mixed-precision rule's anchors."""
    keys = ("framework", "mode", "parallel", "workers", "devices_per_worker", "compress",
            "grad_accum")
    for run in runs:
        if (all(getattr(run.strategy, k) == getattr(ref.strategy, k) for k in keys)
                and conditions(run) == (precision, *conditions(ref)[1:])):
            return run
    return None


def _parity_row(run: RunRecord, ref: RunRecord,
                anchors: Mapping[str, RunRecord | None]) -> ParityRow:
    """One run's agreement: fp32 runs within FP32_ATOL of the reference's fp32 curve;
    mixed-precision runs within the band of sextant.measure.agreement. `anchors`: the
    reference configuration's run in each precision (_anchor)."""
    precision = conditions(run)[0]
    fp32 = anchors["fp32"]
    row: ParityRow = {"run": run.label, "id": run.id, "precision": precision,
                      "max_diff": None, "held_to_parity": False, "rule": None,
                      "band_ratio": None, "agrees": None, "why_not": ""}
    losses = run.finite_losses
    if fp32 is None:
        row["why_not"] = f"no fp32 run of {ref.label} to compare with"
        return row
    fp32_losses = fp32.finite_losses
    if precision == "fp32":
        diff = max_loss_diff(losses, fp32_losses)
        if run is fp32:  # compared with itself: only a NaN (a disagreement) is worth a figure
            diff = diff if diff == math.inf else None
        return {**row, "max_diff": diff, "held_to_parity": True,
                "rule": f"|Δloss| <= {FP32_ATOL:g}", "agrees": diff is None or diff <= FP32_ATOL}
    mixed = anchors[precision]
    if mixed is None or not losses:
        row["why_not"] = (f"no {precision} run of {fp32.label} to set the band"
                          if losses else "no losses recorded")
        return row
    if mixed is run:
        row["why_not"] = f"the reference's {precision} run: it sets the band"
        return row
    result = mixed_agreement(losses, fp32_losses, mixed.finite_losses)
    return {**row, "max_diff": result.max_diff, "held_to_parity": True,
            "band_ratio": result.worst_ratio,
            "rule": f"within {MIXED_FACTOR:g}x {mixed.label}'s own {precision}-vs-fp32 envelope",
            "agrees": result.ok}


def _parity(runs: Sequence[RunRecord], ref: RunRecord) -> Parity:
    precisions = {"fp32"} | {conditions(run)[0] for run in runs}
    anchors = {p: _anchor(runs, ref, p) for p in precisions}
    per_run = [_parity_row(run, ref, anchors) for run in runs]
    held = [p for p in per_run if p["held_to_parity"]]
    fp32_diffs = [p["max_diff"] for p in held
                  if p["precision"] == "fp32" and p["max_diff"] is not None]
    not_held = [p for p in per_run if not p["held_to_parity"]]
    return {
        "reference": ref.label,
        "atol": FP32_ATOL,
        "max_diff": max(fp32_diffs, default=0.0),
        "ok": all(p["agrees"] for p in held),
        "per_run": per_run,
        "curves": [{"run": r.label, "losses": r.finite_losses} for r in runs],
        "note": ("not held to parity: " + "; ".join(f"{p['run']} ({p['why_not']})"
                                                      for p in not_held) if not_held else ""),
    }


def _scaling(rows: list[RunRow]) -> Scaling:
    series: list[ScalingSeries] = []
    multi = [r for r in rows if r["parallel"] != "single" and r["replicas"] > 1
             and r["tokens_per_s"]["median"] is not None and r["status"] == "ok"]
    kinds: dict[tuple[str, str, str], list[RunRow]] = {}
    for row in multi:
        kinds.setdefault((row["framework"], row["mode"], row["parallel"]),
                         []).append(row)
    for (fw, mode, parallel), group in kinds.items():
        singles = [r for r in rows if r["framework"] == fw and r["mode"] == mode
                   and r["parallel"] == "single" and r["tokens_per_s"]["median"] is not None
                   and r["status"] == "ok"]
        points: dict[int, ScalingPoint] = {}
        for r in singles[-1:] + group:
            t = r["tokens_per_s"]
            points[r["replicas"]] = {"workers": r["replicas"], "tokens_per_s": t["median"] or 0.0,
                                     "low": t["low"], "high": t["high"], "run": r["label"],
                                     "id": r["id"],
                                     "compute": compute_units(str(r["device"]), r["replicas"],
                                                              r["threads_per_worker"])}
        ordered = [points[k] for k in sorted(points)]
        base = ordered[0] if ordered and ordered[0]["workers"] == 1 else None
        for p in ordered:
            speedup = (p["tokens_per_s"] / base["tokens_per_s"]
                       if base and base["tokens_per_s"] else None)
            p["speedup_vs_one"] = speedup
            # Throughput per unit of compute against the one worker's: on a CPU two
            # one-thread workers hold what one two-thread worker held (100 % when nothing is
            # lost), never N workers against one holding all the cores.
            p["efficiency"] = (speedup * base["compute"] / p["compute"]
                               if speedup is not None and base else None)
        shade = sum(1 for s in series if s["framework"] == fw)
        series.append({"name": f"{fw} {parallel}" + (f" ({mode})" if mode != "eager" else ""),
                       "framework": fw, "mode": mode, "parallel": parallel,
                       "shade": shade, "points": ordered})
    return {"series": series, "prediction": None, "predicted_only": [],
            "prediction_note": NO_CALIBRATION_NOTE}


def _predict(scaling: Scaling, runs: Sequence[RunRecord], machine: Any) -> None:
    """Add the planner's prediction to each scaling series: compute efficiency fitted on the
    series' single-process run, then tokens/s at the measured worker counts and at every
    power of two up to this machine's cores (sextant/planner/local.py)."""
    from sextant.core.errors import UserError
    from sextant.planner.local import predict_scaling

    if machine is None or machine.calibration is None:
        return
    problem = "no one-worker run to fit"
    calibration = machine.calibration
    cores = int(calibration.host.cores or 1)
    by_id = {run.id: run for run in runs}
    drawn = 0
    for s in scaling["series"]:
        base = s["points"][0] if s["points"] and s["points"][0]["workers"] == 1 else None
        single = by_id.get(base["id"]) if base else None
        if single is None:
            s["prediction"] = None
            continue
        counts = [p["workers"] for p in s["points"]]
        n = 1
        while n <= cores:
            counts.append(n)
            n *= 2
        try:
            planned = _planned(predict_scaling(machine, single, s["parallel"], counts))
        except UserError as exc:  # an incomplete calibration: the report still stands
            planned, problem = None, str(exc)
        s["prediction"] = planned
        if planned is None:
            continue
        drawn += 1
        predicted = {q["workers"]: q["tokens_per_s"] for q in planned["points"]}
        for p in s["points"]:
            pred = predicted.get(p["workers"])
            p["predicted_tokens_per_s"] = pred
            p["prediction_error"] = (pred - p["tokens_per_s"]) / p["tokens_per_s"] if pred else None
    scaling["predicted_only"] = [
        {"series": s["name"], "workers": q["workers"], "tokens_per_s": q["tokens_per_s"],
         "exposed_share": q["exposed_share"]}
        for s in scaling["series"] for q in _planned_points(s)
        if q["workers"] not in {p["workers"] for p in s["points"]}]
    scaling["prediction"] = {
        "calibration_created": calibration.created,
        "cores": cores,
        "allreduce": calibration.to_dict()["allreduce"],
        "series_predicted": drawn,
    }
    scaling["prediction_note"] = (
        "Dotted lines: the planner's prediction for this machine (calibrated "
        f"{calibration.created or '?'}; {cores} cores shared by the workers), with each "
        "series' compute efficiency fitted on its one-worker run, so the one-worker point "
        "agrees by construction and every other point is a prediction."
        if drawn else f"The planner could not predict these series ({problem}).")


def _planned(raw: Mapping[str, Any] | None) -> PlannedScaling | None:
    """The planner's scaling prediction (sextant.planner.local.predict_scaling), typed at
    the report's edge."""
    if raw is None:
        return None
    return {"efficiency": raw["efficiency"], "fitted_on": raw["fitted_on"],
            "points": [{"workers": q["workers"], "step_s": q["step_s"],
                        "tokens_per_s": q["tokens_per_s"],
                        "tokens_per_s_no_overlap": q["tokens_per_s_no_overlap"],
                        "exposed_share": q["exposed_share"]} for q in raw["points"]]}


def _planned_points(series: ScalingSeries) -> list[PlannedPoint]:
    planned = series.get("prediction")
    return planned["points"] if planned else []


def _memory(runs: Sequence[RunRecord]) -> Memory:
    rows: list[MemoryRank] = []
    params = None
    for run in runs:
        params = params or run.metrics.params
        for rank in run.ranks:
            peak, start = rank.peak_rss_bytes, rank.rss_start_bytes
            rows.append({
                "run": run.label, "id": run.id, "rank": rank.rank,
                "rss_start_bytes": start, "peak_rss_bytes": peak,
                "growth_bytes": (peak - start) if peak is not None and start is not None
                else None,
                "data_wait_median_s": rank.data_wait_median_s,
                "step_time_median_s": rank.step_time.median,
                "threads": rank.fingerprint.get("threads"),
            })
        if not run.ranks and run.metrics.peak_rss_bytes is not None:
            rows.append({"run": run.label, "id": run.id, "rank": None,
                         "rss_start_bytes": None, "peak_rss_bytes": run.metrics.peak_rss_bytes,
                         "growth_bytes": None, "data_wait_median_s": None,
                         "step_time_median_s": None, "threads": None})
    return {
        "ranks": rows,
        "params": params,
        "model_state_bytes": params * MODEL_STATE_BYTES_PER_PARAM if params else None,
    }


def _communication(rows: list[RunRow], runs: Sequence[RunRecord]) -> list[CommRow]:
    out: list[CommRow] = []
    for row, run in zip(rows, runs):
        comm = run.metrics.exposed_comm_s
        if comm is None:
            continue
        step = run.metrics.sync_step_median_s or run.metrics.step_time_median_s
        if step is None:
            continue
        shown = max(comm, 0.0)
        out.append({
            "run": row["label"], "id": row["id"], "step_s": step,
            "compute_s": step - shown, "exposed_comm_s": comm,
            "exposed_comm_share": run.metrics.exposed_comm_share,
            "nosync_step_s": run.metrics.nosync_step_median_s,
            "noise": comm < 0,
        })
    return out


def _compile(rows: list[RunRow]) -> list[CompileRow]:
    out: list[CompileRow] = []
    for row in rows:
        first, steady = row["first_step_s"], row["step_time_s"]["median"]
        if first is None or steady is None:
            continue
        out.append({"run": row["label"], "id": row["id"], "mode": row["mode"],
                    "first_step_s": first, "steady_step_s": steady,
                    "compile_s": row["compile_s"] if row["compile_s"] is not None
                    else max(0.0, first - steady),
                    "first_over_steady": first / steady if steady else None,
                    "time_to_first_step_s": row["time_to_first_step_s"],
                    "import_s": row["import_s"], "setup_s": row["setup_s"]})
    return out


def _environment(runs: Sequence[RunRecord], ref: RunRecord) -> Environment:
    fp = ref.fingerprint.to_dict()
    versions: dict[str, str] = {}
    for run in runs:
        name = run.fingerprint.framework or run.strategy.framework
        if run.fingerprint.framework_version:
            versions.setdefault(name, run.fingerprint.framework_version)
    common = {k: v for k, v in fp.items() if k not in ("framework", "framework_version",
                                                       "threads", "cpu_affinity",
                                                       "omp_num_threads")}
    return {"fingerprint": common, "framework_versions": versions}


def _headline(rows: list[RunRow], groups: Sequence[Sequence[RunRecord]]
              ) -> Headline | None:
    """The fastest configuration by its speed-up point estimate, and whether its interval
    against the runner-up excludes 1. If not, the headline says they are tied."""
    ranked = sorted(((r, g) for r, g in zip(rows, groups)
                     if r["speedup_vs_reference"] is not None and _usable(g)),
                    key=lambda rg: rg[0]["speedup_vs_reference"] or 0.0, reverse=True)
    if not ranked:
        return None
    best, best_trials = ranked[0]
    out: Headline = {"verdict": "fastest", "runner_up": None, "vs_runner_up": None,
                           "tied_with": []}
    for row, trials in ranked[1:]:
        iv = speedup_interval(_usable(trials), _usable(best_trials))
        if iv is None:
            continue
        if out["runner_up"] is None:
            out["runner_up"] = row["label"]
            out["vs_runner_up"] = {"value": iv[0], "low": iv[1], "high": iv[2],
                                   "confidence": CONFIDENCE}
        if not distinguishable(iv[1], iv[2]):
            out["tied_with"].append(row["label"])
    if out["tied_with"]:
        out["verdict"] = "tied"
    elif out["runner_up"] is None and len(ranked) > 1:
        out["verdict"] = INCONCLUSIVE
    elif _lost_trials(best_trials) or (len(ranked) > 1 and _lost_trials(ranked[1][1])):
        # A trial lost to disturbance leaves an interval over fewer runs than were asked for
        # (one trial: step-to-step noise only), narrower than the run-to-run spread it must
        # cover: no winner is named on it.
        out["verdict"] = INCONCLUSIVE
    out["row"] = best
    return out


def _lost_trials(trials: Sequence[RunRecord]) -> bool:
    return len(_usable(trials)) < len(trials)


def speedup_cell(row: RunRow) -> str:
    """'1.19x [1.05-1.33]', 'ref', '-', with the trial count and disturbed trials."""
    if row["index"] == 0:
        text = "ref"
    elif row.get("not_ranked"):
        text = f"not ranked ({row['not_ranked']})"
    elif row.get("speedup_vs_reference") is None:
        text = "-"
    else:
        ci = row.get("speedup_ci")
        text = f"{row['speedup_vs_reference']:.2f}x" + (
            f" [{ci['low']:.2f}-{ci['high']:.2f}]"
            if ci is not None and ci["low"] is not None and ci["high"] is not None else "")
    if row.get("trials", 1) > 1:
        text += f", {row['trials']} trials"
    if row.get("disturbed_trials"):
        text += f", {row['disturbed_trials']} disturbed"
    return text


def headline_text(summary: Summary) -> tuple[str, str]:
    """(headline, the sentence under it) of the measured fastest run: never a winner its
    interval against the runner-up cannot support."""
    title, sentence = _headline_sentence(summary)
    apart = summary.get("not_ranked") or []
    if apart:
        sentence += (f" Not ranked against {summary.get('reference')}, under other conditions: "
                     + "; ".join(f"{a['run']} ({a['why']})" for a in apart) + ".")
    return title, sentence.strip()


def _headline_sentence(summary: Summary) -> tuple[str, str]:
    f = summary.get("fastest")
    if not f:
        return "No timed run", ""
    vs = f.get("vs_runner_up")
    ci = ("" if not vs or vs["low"] is None else
          f" ({vs['confidence']:.0%} CI {vs['low']:.2f}-{vs['high']:.2f}x)")
    trials = summary.get("trials") or 1
    over = f"over {trials} trials each" if trials > 1 else "one trial each"
    if f.get("verdict") == "tied" and vs:
        names = " and ".join([f["run"], *f["tied_with"]][:3])
        sentence = (f"{f['run']} measured {vs['value']:.2f}x the speed of {f['runner_up']}"
                    f"{ci}, {over}: the interval includes 1, so no winner is named.")
        return f"{names}: tied within the interval", sentence
    if f.get("verdict") == INCONCLUSIVE or not vs:
        if summary.get("disturbed"):
            why = ("other programs used the CPU while the runs trained (disturbed runs are "
                   "left out): re-run on a quiet machine.")
        elif summary.get("runs", 0) > 1:
            why = "no interval against the runner-up could be computed: re-run with --repeats 2."
        else:
            why = "only one configuration was timed."
        return f"{f['run']} measured fastest, not confirmed", why
    return (f"{f['run']} is fastest here",
            f"{vs['value']:.2f}x the speed of the runner-up, {f['runner_up']}{ci}, {over}.")


def _summary(rows: list[RunRow], parity: Parity, claims: list[ClaimDict], scaling: Scaling,
             groups: Sequence[Sequence[RunRecord]] = ()) -> Summary:
    timed = [r for r in rows if r["tokens_per_s"]["median"] is not None and r["status"] == "ok"
             and not r.get("not_ranked")]
    head = _headline(rows, groups) if groups else None
    fastest = (head["row"] if head else
               max(timed, key=lambda r: r["tokens_per_s"]["median"] or 0.0) if timed else None)
    with_rss = [r for r in rows if r["peak_rss_bytes"] is not None]
    leanest = min(with_rss, key=lambda r: r["peak_rss_bytes"] or 0.0) if with_rss else None
    heaviest = max(with_rss, key=lambda r: r["peak_rss_bytes"] or 0.0) if with_rss else None
    counts = {v: sum(1 for c in claims if c["verdict"] == v)
              for v in (HOLDS, NOT_HOLD, INCONCLUSIVE, NOT_MEASURED)}
    scaling_points: list[ScalingHeadline] = [
        {"series": s["name"], "workers": p["workers"], "speedup_vs_one": p["speedup_vs_one"]}
        for s in scaling["series"] for p in s["points"][-1:] if p["workers"] > 1
    ]
    return {
        "runs": len(rows),
        "reference": rows[0]["label"] if rows else None,
        "fastest": None if fastest is None else {
            "run": fastest["label"], "tokens_per_s": fastest["tokens_per_s"]["median"],
            "step_time_s": fastest["step_time_s"]["median"],
            "speedup_vs_reference": fastest["speedup_vs_reference"],
            "speedup_ci": fastest.get("speedup_ci"),
            "verdict": head["verdict"] if head else INCONCLUSIVE,
            "runner_up": head["runner_up"] if head else None,
            "vs_runner_up": head["vs_runner_up"] if head else None,
            "tied_with": head["tied_with"] if head else []},
        "trials": max((r.get("trials", 1) for r in rows), default=0),
        "disturbed": [{"run": r["label"], "ids": r["disturbed_ids"]}
                      for r in rows if r.get("disturbed_trials")],
        "leanest": None if leanest is None else {
            "run": leanest["label"], "peak_rss_bytes": leanest["peak_rss_bytes"],
            "heaviest_run": heaviest["label"] if heaviest else None,
            "heaviest_peak_rss_bytes": heaviest["peak_rss_bytes"] if heaviest else None},
        "not_ranked": [{"run": r["label"], "why": why}
                       for r in rows if (why := r["not_ranked"])],
        "parity_ok": parity["ok"],
        "parity_max_diff": parity["max_diff"],
        "claims": counts,
        "scaling": scaling_points,
    }


def _recommendation(advice: Any, profile_path: str | None) -> Recommendation:
    if advice is None:
        return {"source": "measured", "hint": PROFILE_HINT}
    from sextant.advisor import to_dict

    full = to_dict(advice)
    rationale = {f["id"]: f["rationale"] for f in full["fired"]}
    details = {f["id"]: f["detail"] for f in full["fired"]}
    top = full["ranking"][0]
    reasons: list[Reason] = [{"id": r["id"], "delta": r["delta"], "source": r["source"],
                "rationale": rationale.get(r["id"], ""), "detail": details.get(r["id"], "")}
               for r in top["reasons"]]
    return {
        "source": "advisor",
        "profile": profile_path,
        "profile_name": full["profile"].get("name"),
        "top": full["top"],
        "headline": full["sensitivity"]["headline"],
        "tco_usd": top["tco_usd"],
        "compute_usd": top["cost"]["compute_usd"],
        "people_usd": top["cost"]["people_usd"],
        "training_hours": top["cost"]["training_hours"],
        "hours_source": top["cost"]["hours_source"],
        "reasons": reasons,
        "ranking": [{"rank": r["rank"], "candidate": r["candidate"], "score": r["score"],
                     "tco_usd": r["tco_usd"],
                     "reasons": [x["id"] for x in r["reasons"][:3]]}
                    for r in full["ranking"]],
        "notes": full["notes"],
        "advice": full,
    }


def build_report(runs: Sequence[RunRecord], *, advice: Any = None,
                 profile_path: str | None = None, group_id: str | None = None,
                 machine: Any = None, related: Sequence[RunRecord] | None = None,
                 deployments: Sequence[DeployRecord] = ()) -> Report:
    """The report of `runs` (one compare group, oldest first; the first is the reference).
    `machine`: a planner Catalogue with this machine's calibration, for the scaling
    prediction (None: measured points only). `related`: every stored run of the workload,
    for the scaling across link rates measured in other groups (default: `runs`)."""
    from sextant.report.interconnect import interconnect

    from sextant.core.errors import UserError

    if not runs:
        raise UserError("no runs to report; run 'sextant compare' first")
    groups = trial_groups(runs)
    every_run, runs = runs, [representative(g) for g in groups]
    ref = runs[0]
    rows = [_run_row(run, ref, i) for i, run in enumerate(runs)]
    for row, trials in zip(rows, groups):
        _trial_fields(row, trials, groups[0])
    _colour_index(rows)
    parity = _parity(runs, ref)
    claims = [c.to_dict() for c in check_claims(every_run, deployments=deployments)]
    scaling = _scaling(rows)
    _predict(scaling, runs, machine)
    workload = ref.workload_dict()
    return {
        "sextant": __version__,
        "generated_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "group_id": group_id or ref.group_id,
        "created_at": ref.created_at,
        "workload": workload,
        "workload_hash": ref.workload_hash,
        "recommendation": _recommendation(advice, profile_path),
        "summary": _summary(rows, parity, claims, scaling, groups),
        "claims": claims,
        "runs": rows,
        "scaling": scaling,
        "interconnect": interconnect(related if related is not None else runs, machine),
        "memory": _memory(runs),
        "communication": _communication(rows, runs),
        "parity": parity,
        "compile": _compile(rows),
        "layouts": _layouts(runs),
        "environment": _environment(runs, ref),
        "deployment": _deployment(deployments),
    }


MODEL_PARALLEL = ("tp", "tp-manual", "pp")


def _planner_stale(metrics: Any) -> bool:
    """Whether a run's planner-derived figures (MFU against a catalogue peak, the predicted
    step) came from another planner version or catalogue than the one installed."""
    if metrics.mfu is None and metrics.planner_step_s is None:
        return False
    from sextant.planner.version import is_current

    return not is_current(metrics.planner_version, metrics.catalogue_hash)


def accelerator_cells(mfu: float | None, device_peak_bytes: float | None,
                      planner_step_s: float | None, planner_error: float | None,
                      stale: bool = False) -> list[str]:
    """MFU (blank where the device is not catalogued), device memory peak, and the planner's
    predicted step with its error against the measured one (one-device runs); planner
    figures of another planner or catalogue marked stale."""
    from sextant.core.display import fmt_bytes_mb, fmt_ms, fmt_share

    mark = " (stale planner)" if stale else ""
    return [fmt_share(mfu) + (mark if mfu is not None else ""), fmt_bytes_mb(device_peak_bytes),
            f"{fmt_ms(planner_step_s)} ({planner_error:+.1%}){mark}" if planner_error is not None
            else "-"]


def accelerator_rows(report: Report) -> list[tuple[Any, ...]]:
    """(run, device, precision, MFU, device MB, planner step (error)) for the runs on an
    accelerator; [] when none was."""
    return [(r["label"], str(r.get("accelerator") or "GPU"), str(r.get("effective_precision")),
             *accelerator_cells(r.get("mfu"), r.get("device_peak_bytes"),
                                r.get("planner_step_s"), r.get("planner_error"),
                                bool(r.get("planner_stale"))))
            for r in report["runs"] if r.get("device") == "gpu"]


ACCELERATOR_COLUMNS = ("run", "device", "precision", "MFU", "device peak MB",
                       "planner step ms (error)")


def layout_comm_bytes(rank: RankSummary) -> float | None:
    """Payload bytes of one step's collectives on this rank: counted (torch tp), the
    pipeline hand-off (torch pp), the compiled step's (jax), or the planned gradient
    traffic of a data-parallel torch run."""
    details = rank.details
    for key in ("tp_collectives_bytes_per_step", "hlo_collective_bytes"):
        if details.get(key):
            return float(sum(details[key].values()))
    if details.get("pipeline"):
        return float(details["pipeline"]["handoff_bytes_per_step"])
    planned = (rank.comm.get("planned_bytes_per_step") or {}).get("total")
    return float(planned) if planned is not None else None


def _layouts(runs: Sequence[RunRecord]) -> list[LayoutRow] | None:
    """The report's parallel-layouts section; None without a tensor- or pipeline-parallel
    run."""
    if not any(r.strategy.parallel in MODEL_PARALLEL for r in runs):
        return None
    return layout_rows(runs)


def layout_rows(runs: Sequence[RunRecord]) -> list[LayoutRow]:
    """The parallelism spectrum (compare layouts, the report): per run, what its layout
    cost and how much sextant code it needed."""
    from sextant.backends import get_backend
    from sextant.backends.code_size import strategy_lines

    rows: list[LayoutRow] = []
    for run in runs:
        ranks = run.ranks or (RankSummary(),)
        acc = ranks[0].memory_accounting
        idle = [(r.details.get("pipeline") or {}).get("idle_share") for r in ranks]
        framework, parallel = run.strategy.framework, run.strategy.parallel
        rows.append({
            "label": run.label,
            "framework": framework,
            "parallel": parallel,
            "step_time_s": run.metrics.step_time_median_s,
            "comm_bytes_per_step": layout_comm_bytes(ranks[0]),
            "param_bytes": acc.get("params"),
            "optimizer_bytes": acc.get("optimizer_state"),
            "stage_idle_share": max((x for x in idle if x is not None), default=None),
            "code_lines": strategy_lines(get_backend(framework).strategy_code(parallel)),
        })
    return rows
