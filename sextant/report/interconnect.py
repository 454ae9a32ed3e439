"""The report's "scaling vs interconnect": how efficiently each strategy scales across hosts at
each link rate measured (emulated clusters), with the planner's line continued to the rates
not measured.

Efficiency at n hosts = tokens/s of the n-rank run / (n x tokens/s of the same framework and
mode in one process on one host). The planner's line uses this machine's calibration, the
compute efficiency fitted on that one-process run (as the scaling chart does), and the link
as a collective saw it: the all-reduce between the cluster's hosts measured when the cluster
was first used (alpha, beta), with beta scaled by rate for the rates not measured (a faster
link of the same latency).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sextant.report.types import Interconnect, LinkFit, LinkPoint, LinkPrediction, LinkSeries
from sextant.results.record import RunRecord
from sextant.strategy import DATA_PARALLEL

LINK_GBITS = (0.1, 1.0, 10.0, 25.0, 100.0, 400.0)
"""Link rates the planner's line covers (Gbit/s), besides the measured ones."""


def _tps(run: RunRecord) -> float | None:
    v = run.metrics.tokens_per_s
    return v if v is not None and v > 0 else None


def interconnect(runs: Sequence[RunRecord], machine: Any = None) -> Interconnect:
    """Series of multi-host runs by link rate (see the module docstring); `runs` are all
    stored runs of the report's workload."""
    ok = [r for r in runs if r.status == "ok" and _tps(r) is not None]
    singles = {}
    for r in ok:  # the latest one-process, one-host run of each framework and mode
        if r.strategy.parallel == "single" and r.strategy.workers == 1:
            singles[(r.strategy.framework, r.strategy.mode)] = r
    series: dict[tuple[Any, ...], LinkSeries] = {}
    points: dict[tuple[Any, ...], dict[float, LinkPoint]] = {}
    for r in ok:
        net = r.fingerprint.network
        if net.get("kind") != "emulated" or not net.get("link_bit_s") or len(
                net.get("hosts") or []) < 2:
            continue
        fw, mode = r.strategy.framework, r.strategy.mode
        workers = r.strategy.workers
        key = (fw, mode, r.strategy.parallel, r.strategy.compress, workers)
        single = singles.get((fw, mode))
        s = series.setdefault(key, {
            "name": _name(r, workers), "framework": fw, "parallel": key[2], "workers": workers,
            "single_id": single.id if single else None, "points": [], "fit": None,
            "prediction": None})
        base = _tps(single) if single else None
        tps = _tps(r)
        points.setdefault(key, {})[float(net["link_bit_s"])] = {
            "link_gbit": float(net["link_bit_s"]) / 1e9, "hosts": len(net["hosts"]),
            "tokens_per_s": _tps(r), "id": r.id,
            "exposed_share": r.metrics.exposed_comm_share,
            "efficiency": tps / (workers * base) if base and tps is not None else None}
        fit = net.get("allreduce_fit")
        if s["fit"] is None and fit:
            s["fit"] = {"alpha_s": fit["alpha_s"], "beta_s_per_byte": fit["beta_s_per_byte"],
                        "link_bit_s": float(net["link_bit_s"])}
    out = []
    for key, s in series.items():
        s["points"] = [points[key][k] for k in sorted(points[key])]
        single = next((r for r in ok if r.id == s["single_id"]), None)
        s["prediction"] = _predict(s, single, machine)
        out.append(s)
    return {"series": out, "note": _note(out, machine)}


def _name(run: RunRecord, workers: int) -> str:
    parts = [run.strategy.framework, run.strategy.parallel, f"x{workers}"]
    if run.strategy.compress not in (None, "none"):
        parts.append(f"{run.strategy.compress} gradients")
    return " ".join(parts)


def _predict(s: LinkSeries, single: RunRecord | None, machine: Any
             ) -> list[LinkPrediction] | None:
    """The planner's efficiency at every rate (None without calibration, fit or baseline)."""
    if machine is None or machine.calibration is None or single is None or not s["fit"]:
        return None
    if s["parallel"] not in DATA_PARALLEL:
        return None
    from sextant.core.errors import UserError
    from sextant.planner.local import predict_scaling

    fit: LinkFit = s["fit"]
    base = _tps(single)
    rates = sorted({*(g * 1e9 for g in LINK_GBITS), *(p["link_gbit"] * 1e9 for p in s["points"])})
    line: list[LinkPrediction] = []
    for rate in rates:
        cat = machine.with_loopback_fit(
            fit["alpha_s"], fit["beta_s_per_byte"] * fit["link_bit_s"] / rate)
        try:
            pred = predict_scaling(cat, single, s["parallel"], [s["workers"]])
        except UserError:
            return None
        if not pred or not pred["points"] or not base:
            return None
        tps = pred["points"][0]["tokens_per_s"]
        line.append({"link_gbit": rate / 1e9, "tokens_per_s": tps,
                     "efficiency": tps / (s["workers"] * base)})
    by_rate = {round(q["link_gbit"], 9): q for q in line}
    for p in s["points"]:
        q = by_rate.get(round(p["link_gbit"], 9))
        p["predicted_efficiency"] = q["efficiency"] if q else None
        p["prediction_error"] = (q["tokens_per_s"] / p["tokens_per_s"] - 1
                                 if q and p["tokens_per_s"] else None)
    return line


def _note(series: list[LinkSeries], machine: Any) -> str:
    if not series:
        return ("No run across hosts for this workload: 'sextant cluster up --link 10gbit', "
                "then 'sextant compare --cluster sx' (docs/multi-host.md).")
    if not any(s["prediction"] for s in series):
        why = ("this machine is not calibrated" if machine is None or machine.calibration is None
               else "no one-process run or no measured link to fit it on")
        return f"The planner's line is not drawn: {why}."
    return ("Dotted lines: the planner's efficiency at each link rate, with the link's latency "
            "and bandwidth fitted on the all-reduce measured between the hosts (bandwidth "
            "scaled to the rates not measured) and the compute efficiency fitted on the "
            "one-process run.")
