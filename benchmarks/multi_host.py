"""Training across 2 emulated hosts at several link rates, beside the planner's prediction.

    sudo python benchmarks/multi_host.py [--links 100mbit,1gbit,10gbit,25gbit] [--steps 40]

For each link rate: `sextant cluster up` (2 hosts, tbf-shaped veth links), the all-reduce bus
bandwidth between the hosts (1 KiB-64 MiB, gloo), then data-parallel training of the default
workload, one worker per host: torch DDP (fp32 and bf16-compressed gradients), JAX dp-manual
and TensorFlow MultiWorkerMirrored. Each emulated host has one of the machine's cores, so each
framework's one-process, one-thread run is the baseline for scaling efficiency (throughput of
2 hosts / 2 x throughput of one 1-core host). The planner's compute efficiency is fitted on
the framework's one-process run with all cores (as the report does), and the planner then
predicts the 2-host step with the link's latency and bandwidth fitted on the measured
all-reduce. Prints a Markdown table (quoted in
docs/multi-host.md) and writes the raw figures as JSON.

Needs root and iproute2; run it on a quiet machine (other processes on the cores move every
figure here).
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path
from typing import Any

from sextant.checks.analyse import bandwidths
from sextant.launch.collectives import measure_collective
from sextant.cluster import emulated
from sextant.planner.calibrate import calibrate, fit_alpha_beta
from sextant.planner.local import load_machine, predict_scaling
from sextant.results.record import RunRecord
from sextant.results.store import ResultsStore
from sextant.runner import execute
from sextant.strategy import Strategy
from sextant.sources import resolve_workload

CLUSTER = "bench"
RUNS = (
    ("torch", "eager", "dp", "none"),
    ("torch", "eager", "dp", "bf16"),
    ("jax", "compiled", "dp-manual", "none"),
    ("tensorflow", "compiled", "dp", "none"),
)


def predicted_step(calibration: dict[str, Any], fit: dict[str, float], single: RunRecord,
                   parallel: str, tmp: Path) -> float | None:
    """The planner's 2-worker step time with the link's fitted all-reduce in place of
    loopback's (compute efficiency fitted on the single-process run)."""
    path = tmp / "calibration-link.json"
    path.write_text(json.dumps({**calibration, "allreduce": fit}))
    cat = load_machine(path)
    pred = predict_scaling(cat, single, parallel, [2]) if cat is not None else None
    return pred["points"][0]["step_s"] if pred and pred["points"] else None


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--links", default="100mbit,1gbit,10gbit,25gbit")
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--json", type=Path, default=Path("docs/data/multi_host.json"))
    args = p.parse_args()
    workload = resolve_workload("gpt-tiny").replace(steps=args.steps)
    tmp = Path(tempfile.mkdtemp(prefix="sextant-multihost-"))
    calibration = calibrate(out=tmp / "calibration.json")
    out: dict[str, Any] = {"steps": args.steps, "links": []}
    with ResultsStore(tmp / "results.db") as store:
        singles, one_core = {}, {}
        for framework, mode, _, _ in RUNS:
            if framework not in singles:
                for threads, into in ((None, singles), (1, one_core)):
                    rec = execute(workload, Strategy(framework=framework, mode=mode,
                                                     threads=threads),
                                  runs_dir=tmp / "runs", store=store)
                    into[framework] = rec
        for text in args.links.split(","):
            link = emulated.Link(rate_bit_s=emulated.parse_rate(text))
            emulated.up(CLUSTER, 2, link)
            try:
                ar = measure_collective("allreduce", placement=emulated.placement(CLUSTER, 2))
                bus = bandwidths("allreduce", ar["sizes_bytes"], ar["times_s"], 2)
                fit = fit_alpha_beta(ar["sizes_bytes"], ar["times_s"])
                row: dict[str, Any] = {
                    "link": text, "rate_bit_s": link.rate_bit_s,
                    "busbw_bit_s": [b["busbw_bytes_per_s"] * 8 for b in bus],
                    "sizes_bytes": ar["sizes_bytes"], "fit": fit, "runs": []}
                for framework, mode, parallel, compress in RUNS:
                    strategy = Strategy(framework=framework, mode=mode, parallel=parallel,
                                        workers=2, compress=compress)
                    rec = execute(workload, strategy, runs_dir=tmp / "runs", store=store,
                                  cluster=CLUSTER)
                    single = singles[framework]
                    m, s = rec.metrics, one_core[framework].metrics
                    row["runs"].append({
                        "label": rec.label, "step_s": m.step_time_median_s,
                        "p10_s": m.step_time_p10_s, "p90_s": m.step_time_p90_s,
                        "exposed_share": m.exposed_comm_share,
                        "efficiency": ((m.tokens_per_s or 0.0) / (2 * s.tokens_per_s)
                                       if s.tokens_per_s else None),
                        "final_loss": m.final_loss,
                        "single_final_loss": s.final_loss,
                        "predicted_step_s": (predicted_step(calibration, fit, single, parallel,
                                                            tmp) if compress == "none" else None),
                    })
                out["links"].append(row)
            finally:
                emulated.down(CLUSTER)
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(out, indent=1))
    print(table(out))
    return 0


def table(out: dict[str, Any]) -> str:
    lines = ["| link | all-reduce busbw at 64 MiB (share of link) | run | step ms (p10-p90) | "
             "exposed comm | scaling eff. | planner step ms (error) |",
             "|---|---|---|---|---|---|---|"]
    for row in out["links"]:
        rate = row["rate_bit_s"]
        bw = row["busbw_bit_s"][-1]
        share = f" ({bw / rate:.2f})" if rate else ""
        for i, r in enumerate(row["runs"]):
            pred = r["predicted_step_s"]
            pred_text = (f"{pred * 1e3:.1f} ({pred / r['step_s'] - 1:+.0%})" if pred else "-")
            lines.append(
                f"| {row['link'] if i == 0 else ''} | "
                f"{f'{bw / 1e9:.2f} Gbit/s{share}' if i == 0 else ''} | {r['label']} | "
                f"{r['step_s'] * 1e3:.1f} ({r['p10_s'] * 1e3:.1f}-{r['p90_s'] * 1e3:.1f}) | "
                f"{(r['exposed_share'] or 0):.0%} | {r['efficiency']:.2f} | {pred_text} |")
    return "\n".join(lines)


if __name__ == "__main__":
    raise SystemExit(main())
