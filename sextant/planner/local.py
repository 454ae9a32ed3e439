"""The planner on this machine: predict a sextant run's step time from the calibrated
'cpu-local' accelerator and 'loopback' link (`sextant calibrate`).

One figure the planner cannot know from first principles is the compute efficiency of the
framework's kernels on this workload; it is fitted on a single-process run of the same
workload, framework, mode and precision. Everything else (how per-worker compute shrinks as
the batch is split and the cores are shared, how all-reduce time grows) is predicted.
`sextant plan validate` and the report's scaling chart both use this module.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from sextant.core.errors import UserError
from sextant.core.paths import calibration_in
from sextant.planner.catalogue import DEFAULT_CALIBRATION, Catalogue, load_catalogue
from sextant.planner.estimate import Layout, PlanOptions, evaluate_one, resolve_hardware
from sextant.planner.evaluation import Evaluation
from sextant.planner.models import MLPShape, TransformerShape
from sextant.planner.options import planner_precision
from sextant.planner.workload_shapes import shape_from_workload
from sextant.strategy import ZERO_STAGE, ParallelDims

if TYPE_CHECKING:
    from sextant.results.record import RunRecord

DEFAULT_EFFICIENCY = 0.5
"""Compute efficiency assumed when no single-process run is there to fit it."""
FIXED_OVERHEAD_GB = 0.3


def load_machine(calibration: str | Path | None = None,
                 results_dir: str | Path | None = None) -> Catalogue | None:
    """The catalogue calibrated for this machine: from `calibration` (which must exist), else
    calibration.json in `results_dir`, else ./sextant-results/calibration.json; None when
    the machine was never calibrated."""
    if calibration is not None:
        return load_catalogue(None, calibration)
    for path in ([calibration_in(results_dir)] if results_dir else []) + [
            DEFAULT_CALIBRATION]:
        if path.is_file():
            return load_catalogue(None, path)
    return None


def layout_for(dims: ParallelDims, global_batch: int) -> Layout | None:
    """The planner layout of a run's parallel dims (Strategy.dims()), or None when the planner
    does not model it here (parameter servers, tensor- or pipeline-parallel runs) or the batch
    does not split evenly over the replicas."""
    if dims.devices == 1:
        return Layout(dp=1, mbs=global_batch)
    if dims.zero is None or dims.tp > 1 or dims.pp > 1 or global_batch % dims.dp:
        return None
    return Layout(dp=dims.dp, zero=dims.zero, mbs=global_batch // dims.dp)


def replicas_of(parallel: str, n: int) -> ParallelDims:
    """The dims of `n` data-parallel replicas of `parallel` (a scaling series' points)."""
    return ParallelDims(dp=n, tp=1, pp=1, zero=ZERO_STAGE.get(parallel), sp=False,
                        microbatches=1, grad_accum=1, ps=0)


def precision_of(run: RunRecord) -> str:
    return planner_precision(run.strategy.precision)


def shape_of(run: RunRecord) -> TransformerShape | MLPShape:
    """The planner shape of a stored run's workload (UserError when it has none)."""
    return shape_from_workload(run.workload_dict(), where=f"run {run.id}")


def figures(cat: Catalogue, framework: str, shape: TransformerShape | MLPShape, layout: Layout,
            precision: str, efficiency: float) -> Evaluation:
    """The planner's figures for one layout on this machine, with the GEMM rate of the
    framework's own library where calibrate measured it."""
    if cat.calibration is None:  # the callers load a calibrated catalogue first
        raise UserError("the planner's local figures need this machine's calibration: run "
                        "'sextant calibrate' first (or pass --calibration FILE)")
    machine = cat.with_calibration(cat.calibration, library=framework)
    opts = PlanOptions(precision=precision, global_batch=shape.global_batch,
                       compute_efficiency=efficiency, fixed_overhead_gb=FIXED_OVERHEAD_GB)
    hw = resolve_hardware(machine, "cpu-local", "loopback", options=opts)
    return evaluate_one(shape.cost(flash_attention=False), hw, opts, layout)


def fit_efficiency(cat: Catalogue, framework: str, shape: TransformerShape | MLPShape,
                   precision: str, measured_step_s: float) -> float | None:
    """Compute efficiency that makes the planner's single-process step time equal the
    measured one (None when the measured time is below what the model says is not compute)."""
    f = figures(cat, framework, shape, Layout(dp=1, mbs=shape.global_batch), precision, 1.0)
    # The attention core at a published kernel rate does not scale with the GEMM efficiency.
    rest = f.step - f.seconds("compute") + f.compute.flops_bound - f.compute.scaled_bound
    if measured_step_s > rest and f.compute.scaled_bound > 0:
        return min(1.0, f.compute.scaled_bound / (measured_step_s - rest))
    return None


def predict_scaling(cat: Catalogue, single_run: RunRecord, parallel: str,
                    workers: list[int]) -> dict[str, Any] | None:
    """Predicted tokens/s of `parallel` at each worker count, with the compute efficiency
    fitted on `single_run` (a stored single-process run). None when the planner cannot model
    the workload or the strategy."""
    from sextant.core.errors import UserError

    measured = single_run.metrics.step_time_median_s
    if not measured:
        return None
    try:
        shape = shape_of(single_run)
    except UserError:
        return None
    framework, precision = single_run.strategy.framework, precision_of(single_run)
    efficiency = fit_efficiency(cat, framework, shape, precision, float(measured))
    if efficiency is None:
        return None
    tokens_per_step = shape.global_batch * shape.cost(flash_attention=False).tokens_per_sample
    points = []
    for n in sorted(set(workers)):
        layout = layout_for(replicas_of(parallel, n), shape.global_batch)
        if layout is None:
            continue
        f = figures(cat, framework, shape, layout, precision, efficiency)
        points.append({"workers": n, "step_s": f.step, "tokens_per_s": tokens_per_step / f.step,
                       "tokens_per_s_no_overlap": tokens_per_step / f.step_no_overlap,
                       "exposed_share": f.seconds("dp_exposed") / f.step})
    if not points:
        return None
    return {"efficiency": efficiency, "fitted_on": single_run.id, "points": points}
