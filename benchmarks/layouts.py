"""The parallelism spectrum on one workload, measured, beside the planner's prediction.

Runs llama-tiny under every layout sextant can run on torch and JAX (single, dp, fsdp,
tp, tp-manual, pp with GPipe and 1F1B, dp x tp), each in fresh processes through
`sextant.runner.execute` (the same path as `sextant run`), and prints per layout:
the median steady step, the parameter bytes one rank holds (measured from its tensors)
next to the planner's prediction for the same layout (`sextant plan --workload ... --tp
--pp --dp --zero`, fp32), the collectives XLA put in the compiled JAX step, and for
pipelines the planner's bubble (p - 1) / (m + p - 1) beside each stage's measured idle share;
where a run measures it, the exposed communication (the step against itself with its
collectives swapped for local stand-ins, the workload's measure.nosync_steps pairs).

    python benchmarks/layouts.py --steps 30
"""

from __future__ import annotations

import argparse
import json
import math
import subprocess
import sys
import tempfile
from pathlib import Path

from sextant.report.model import layout_comm_bytes
from sextant.runner import execute
from sextant.strategy import Strategy
from sextant.sources import resolve_workload

REPO = Path(__file__).resolve().parents[1]

LAYOUTS = [
    # (strategy fields, planner flags: dp, tp, pp, zero)
    (dict(framework="torch"), (1, 1, 1, 0)),
    (dict(framework="torch", parallel="dp", workers=2), (2, 1, 1, 0)),
    (dict(framework="torch", parallel="fsdp", workers=2), (2, 1, 1, 3)),
    (dict(framework="torch", parallel="tp", workers=2, tp=2), (1, 2, 1, 0)),
    (dict(framework="torch", parallel="tp", workers=2, tp=2, sequence_parallel=True),
     (1, 2, 1, 0)),
    (dict(framework="torch", parallel="pp", workers=2, pp=2, microbatches=4), (1, 1, 2, 0)),
    (dict(framework="torch", parallel="pp", workers=2, pp=2, microbatches=4, schedule="1f1b"),
     (1, 1, 2, 0)),
    (dict(framework="torch", parallel="tp", workers=4, tp=2), (2, 2, 1, 0)),
    (dict(framework="jax", mode="compiled"), (1, 1, 1, 0)),
    (dict(framework="jax", mode="compiled", parallel="dp", devices_per_worker=2),
     (2, 1, 1, 0)),
    (dict(framework="jax", mode="compiled", parallel="fsdp", devices_per_worker=2),
     (2, 1, 1, 3)),
    (dict(framework="jax", mode="compiled", parallel="tp", devices_per_worker=2, tp=2),
     (1, 2, 1, 0)),
    (dict(framework="jax", mode="compiled", parallel="tp-manual", devices_per_worker=2, tp=2),
     (1, 2, 1, 0)),
    (dict(framework="jax", mode="compiled", parallel="tp-manual", workers=2, tp=2),
     (1, 2, 1, 0)),
    (dict(framework="jax", mode="compiled", parallel="tp", devices_per_worker=4, tp=2),
     (2, 2, 1, 0)),
    (dict(framework="jax", mode="compiled", parallel="pp", devices_per_worker=2, pp=2,
          microbatches=4), (1, 1, 2, 0)),
]


def planned(workload_file: Path, dp: int, tp: int, pp: int, zero: int,
            microbatches: int) -> dict:
    cmd = [sys.executable, "-c", "import sys; from sextant.cli import main; sys.exit(main())",
           "plan", "--workload", str(workload_file), "--gpus", str(dp * tp * pp),
           "--dp", str(dp), "--tp", str(tp), "--pp", str(pp), "--zero", str(zero),
           "--precision", "fp32", "--json", "--no-curve"]
    if pp > 1:
        cmd += ["--mbs", "1"]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    if out.returncode:
        return {"error": out.stderr.strip().splitlines()[-1]}
    return json.loads(out.stdout)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--out", type=Path, default=None, help="write the rows as JSON here")
    args = ap.parse_args()
    workload = resolve_workload("llama-tiny").replace(steps=args.steps)
    workload_file = REPO / "workloads" / "llama-tiny.toml"
    rows = []
    for fields, (dp, tp, pp, zero) in LAYOUTS:
        fields = {**fields}
        if fields.get("devices_per_worker", 1) > 1:
            fields["workers"] = 1
        strategy = Strategy(**fields)
        record = execute(workload, strategy, runs_dir=Path(tempfile.mkdtemp()))
        rank0 = record.ranks[0]
        details = rank0.to_dict()["details"]  # JSON, for the rows written with --out
        acct = rank0.memory_accounting
        plan = planned(workload_file, dp, tp, pp, zero, strategy.microbatches)
        predicted = (plan.get("memory") or {}).get("params")
        measured = acct.get("params")
        row = {
            "layout": strategy.label,
            "framework": strategy.framework,
            "parallel": strategy.parallel,
            "step_ms": (record.metrics.step_time_median_s or math.nan) * 1e3,
            "final_loss": record.metrics.final_loss,
            "exposed_comm_s": record.metrics.exposed_comm_s,
            "nosync_step_ms": (record.metrics.nosync_step_median_s * 1e3
                               if record.metrics.nosync_step_median_s is not None else None),
            "param_bytes_rank0": measured,
            "planned_param_bytes": predicted,
            "param_error": (measured / predicted - 1) if measured and predicted else None,
            "optimizer_bytes_rank0": acct.get("optimizer_state"),
            "hlo_collectives": details.get("hlo_collectives"),
            "comm_bytes_measured": layout_comm_bytes(rank0),
            "comm_detail": (details.get("tp_collectives_bytes_per_step")
                            or details.get("hlo_collective_bytes")),
            "tp_bytes_planned": (details.get("tp_planned_bytes_per_step")
                                 or {}).get("all_reduce"),
            "bubble_planned": ((pp - 1) / (strategy.microbatches + pp - 1)) if pp > 1 else None,
            "stage_idle_measured": [(r.details.get("pipeline") or {}).get("idle_share")
                                    for r in record.ranks] if pp > 1 else None,
        }
        rows.append(row)
        err = f"{row['param_error']:+.1%}" if row["param_error"] is not None else "-"
        print(f"{row['layout']:<30} {row['step_ms']:7.1f} ms  loss {row['final_loss']:.4f}  "
              f"params/rank {measured} B (planned {predicted}, {err})  "
              f"comm {row['comm_detail'] or row['comm_bytes_measured']} (tp planned "
              f"{row['tp_bytes_planned']})  idle {row['stage_idle_measured']} (bubble planned "
              f"{row['bubble_planned']})  exposed comm "
              f"{row['exposed_comm_s'] and round(row['exposed_comm_s'] * 1e3, 1)} ms "
              f"(step without collectives {row['nosync_step_ms'] and round(row['nosync_step_ms'], 1)} ms)",
              flush=True)
    singles = {r["framework"]: r["step_ms"] for r in rows if r["parallel"] == "single"}
    print("step time relative to the same framework's single process: " + ", ".join(
        f"{r['layout']} {r['step_ms'] / singles[r['framework']]:.2f}" for r in rows))
    if args.out:
        args.out.write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
