"""`sextant plan validate`: the planner's step time against the runs measured on this
machine (the results store of `sextant compare` / `sextant run`).

Predictions use the calibrated 'cpu-local' accelerator and 'loopback' link. The one figure the
planner cannot know from first principles, the compute efficiency of the framework's kernels
on this workload, is fitted on the single-process run of the same workload, framework, mode
and precision (that row's error is therefore ~0 by construction and marked "fit"); every
other run (data parallel over several processes) is then a genuine prediction of how
per-worker compute shrinks and all-reduce time grows. Without a single-process run, the
default efficiency (0.5) is used and marked "assumed".
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from sextant.core.errors import UserError
from sextant.planner.catalogue import load_catalogue
from sextant.planner.local import (
    DEFAULT_EFFICIENCY,
    figures,
    fit_efficiency,
    layout_for,
    precision_of,
    shape_of,
)
from sextant.results.record import RunRecord

_HINT = "run 'sextant compare' (or 'sextant run') first to measure local runs"


def load_runs(db: str | Path | None) -> list[RunRecord]:
    from sextant.core.paths import default_db as default_path

    path = Path(db) if db else default_path()
    if not path.is_file():
        raise UserError(f"no results store at {path}; {_HINT}")
    from sextant.results.store import ResultsStore

    with ResultsStore(path) as store:
        runs = store.runs()
    if not runs:
        raise UserError(f"the results store {path} has no runs; {_HINT}")
    return runs


def validate(
    *,
    db: str | Path | None = None,
    calibration: str | Path | None = None,
    catalogue: str | Path | None = None,
) -> list[dict[str, Any]]:
    runs = load_runs(db)
    cat = load_catalogue(catalogue, calibration)
    if cat.calibration is None:
        raise UserError(
            "validation predicts with this machine's measured figures: run "
            "'sextant calibrate' first (or pass --calibration FILE)"
        )
    rows: list[dict[str, Any]] = []
    prepared = []
    for run in runs:
        strategy = run.strategy
        base = {
            "id": run.id,
            "label": run.label,
            "framework": strategy.framework,
            "mode": strategy.mode,
            "parallel": strategy.parallel,
            "workers": strategy.workers,
        }
        measured = run.metrics.step_time_median_s
        if not measured or "model" not in run.workload:
            rows.append({**base, "skipped": "no step time or workload recorded"})
            continue
        try:
            shape = shape_of(run)
        except UserError as exc:
            rows.append({**base, "skipped": str(exc)})
            continue
        layout = layout_for(strategy.dims(), shape.global_batch)
        if layout is None:
            rows.append(
                {
                    **base,
                    "skipped": f"parallel strategy {strategy.parallel!r} "
                    "is not modelled by --validate",
                }
            )
            continue
        prepared.append((run, base, shape, layout, float(measured)))

    def group(run: RunRecord) -> tuple[str, ...]:
        return (run.workload_name, run.workload_hash, run.strategy.framework,
                run.strategy.mode, precision_of(run))

    fitted: dict[Any, float] = {}
    for run, _, shape, layout, measured in prepared:
        if layout.devices == 1 and group(run) not in fitted:
            eff = fit_efficiency(cat, run.strategy.framework, shape, precision_of(run),
                                 measured)
            if eff is not None:
                fitted[group(run)] = eff

    for run, base, shape, layout, measured in prepared:
        eff = fitted.get(group(run))
        source = (
            "fit"
            if layout.devices == 1 and eff is not None
            else ("from single run" if eff is not None else "assumed")
        )
        efficiency = eff or DEFAULT_EFFICIENCY
        f = figures(cat, run.strategy.framework, shape, layout, precision_of(run), efficiency)
        pred, worst = f.step, f.step_no_overlap
        p10, p90 = run.metrics.step_time_p10_s, run.metrics.step_time_p90_s
        rows.append(
            {
                **base,
                "workload": shape.name,
                "layout": layout.label(),
                "measured_s": measured,
                "measured_p10_s": p10,
                "measured_p90_s": p90,
                "predicted_s": pred,
                "predicted_no_overlap_s": worst,
                "error": (pred - measured) / measured,
                "in_range": min(pred, worst) * 0.999 <= measured <= max(pred, worst) * 1.001,
                "efficiency": efficiency,
                "efficiency_source": source,
                "predicted_exposed_share": f.seconds("dp_exposed") / pred,
                "measured_exposed_share": run.metrics.exposed_comm_share,
            }
        )
    return rows


def render_validation(rows: list[dict[str, Any]], console) -> None:
    from rich.table import Table

    t = Table(title="Planner vs measured step time (this machine)", title_justify="left")
    for col in (
        "run",
        "strategy",
        "measured ms (p10-p90)",
        "predicted ms (no overlap)",
        "error",
        "efficiency",
        "exposed comm pred/meas",
    ):
        t.add_column(col, justify="left" if col in ("strategy",) else "right")
    errors = []
    for r in rows:
        label = r["label"]
        if "skipped" in r:
            t.add_row(str(r["id"]), label, "-", "-", "skipped", "-", r["skipped"][:30])
            continue
        spread = ""
        if r["measured_p10_s"] and r["measured_p90_s"]:
            spread = f" ({r['measured_p10_s'] * 1e3:.1f}-{r['measured_p90_s'] * 1e3:.1f})"
        meas_share = r["measured_exposed_share"]
        share = f"{r['predicted_exposed_share']:.0%}/" + (
            "-" if meas_share is None else f"{meas_share:.0%}"
        )
        t.add_row(
            str(r["id"]),
            f"{r['workload']}: {label}",
            f"{r['measured_s'] * 1e3:.1f}{spread}",
            f"{r['predicted_s'] * 1e3:.1f} ({r['predicted_no_overlap_s'] * 1e3:.1f})",
            f"{r['error']:+.0%}",
            f"{r['efficiency']:.2f} {r['efficiency_source']}",
            share,
        )
        if r["efficiency_source"] != "fit":
            errors.append(abs(r["error"]))
    console.print(t)
    if errors:
        errors.sort()
        console.print(
            f"{len(errors)} predicted run(s): median |error| "
            f"{errors[len(errors) // 2]:.0%}, max {errors[-1]:.0%} (runs marked 'fit' "
            "calibrate the compute efficiency and are not counted)"
        )
    else:
        console.print("no run to predict beyond the single-process runs used for the fit")
